/// The `logout:` section: what ending a session does.
package struct LogoutSettings: Sendable, Hashable {
    /// `none` by default: the engine only changes its own state.
    package var plugin = PluginReference(kind: .logout, name: "none")
    /// `true` by default: requests on the wire are cancelled, not left to finish.
    package var cancelInFlight = true
    /// `20s` by default: how long new requests fail fast and refreshes and retries are suppressed.
    package var cooldown: Duration = .seconds(20)

    package init() {}
}

extension LogoutSettings: SettingsSection {
    package static let defaults = LogoutSettings()

    /// The tuning keys of `logout:` (beside the plugin's `use:` and `with:`), each stated once
    /// (see ``SettingsSection``).
    package static let keys: [SettingKey<LogoutSettings>] = [
        .boolean(
            "cancel-in-flight", \.cancelInFlight,
            doc: "attempts still waiting for their answer are cancelled, not left to finish"),
        .duration(
            "cooldown", \.cooldown, doc: "how long new requests fail at once and refreshes and retries are suppressed"),
    ]
}
