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
