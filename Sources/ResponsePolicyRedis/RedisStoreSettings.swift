import Foundation
import ResponsePolicy

/// Redis's settings that let it forget what a fleet shares: an eviction policy that can drop the
/// coordination keys under memory pressure (issue 30). The fleet survives a Redis that forgets
/// (each process re-seeds it from the newest pair it holds, honours the leases it heard of, and
/// waits out a quarantine when it cannot vouch for the last lease), but every loss costs a wait
/// of up to one lease, and a lease nobody heard of is the one thing a forgetful store can still
/// turn into a spent refresh token presented twice: so it is said at start and by
/// `policy lint --check-env`.
enum RedisStoreSettings {
    /// The warning for `INFO memory`'s text, or nil when the settings cannot evict the keys:
    /// `noeviction`, or no `maxmemory` (0: unlimited on 64-bit builds).
    static func warning(info: String, endpoint: RedisEndpoint) -> String? {
        var fields: [String: String] = [:]
        for line in info.split(whereSeparator: \.isNewline) {
            let parts = line.split(separator: ":", maxSplits: 1)
            if parts.count == 2 { fields[String(parts[0])] = String(parts[1]) }
        }
        guard let policy = fields["maxmemory_policy"], policy != "noeviction" else { return nil }
        let limit = Int64(fields["maxmemory"] ?? "") ?? 0
        guard limit > 0 else { return nil }
        let what =
            policy.hasPrefix("allkeys")
            ? "any key, the session itself included"
            : "keys with a time to live: the refresh lease and the logout cooldown"
        return
            "\(endpoint) evicts keys under memory pressure (maxmemory \(limit) bytes, maxmemory-policy \(policy)): it "
            + "can drop \(what); the fleet re-seeds it from the newest pair a process holds, but each loss delays "
            + "refreshes by up to one lease, and a lease no process heard of before the loss cannot be honoured. Set "
            + "maxmemory-policy noeviction (or give the coordination keys a Redis of their own)"
    }
}

extension RedisSessionCoordinator: StoreSettingsCheck {
    package func storeSettingsWarnings() -> [String] {
        guard let connection = try? connect(), case .string(let info)? = try? connection.command(["INFO", "memory"])
        else { return [] }
        return RedisStoreSettings.warning(info: info, endpoint: endpoint).map { [$0] } ?? []
    }

    /// Once, after the first command reached Redis: its eviction settings, as a `problem` update.
    func checkStoreSettings() {
        let first = state.withLock { state -> Bool in
            defer { state.settingsChecked = true }
            return !state.settingsChecked
        }
        guard first else { return }
        queue.async { [self] in
            guard let connection = box.connection,
                case .string(let info)? = try? connection.command(["INFO", "memory"]),
                let warning = RedisStoreSettings.warning(info: info, endpoint: endpoint)
            else { return }
            send(.problem(warning))
        }
    }
}
