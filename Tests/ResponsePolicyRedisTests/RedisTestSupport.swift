import Foundation
import ResponsePolicy
import ResponsePolicyRedis
// The doubles every engine test target shares (basePolicy, RecordingTransport, the coordination
// fixtures), for every file of this target.
@_exported import TestSupport

/// What the Redis suites share: one way to make a coordinator on a test's own server, and the
/// channel its news travels on.
extension RedisServerFixture {
    /// A Redis coordinator on this server; the caller stops it.
    func coordinator(
        key: String = "mobile-api", lease: Duration = .seconds(15), connectTimeout: Duration = .milliseconds(250),
        signingKey: Data? = nil
    ) throws -> RedisSessionCoordinator {
        try RedisSessionCoordinator(
            .init(url: url, key: key, lease: lease, connectTimeout: connectTimeout, signingKey: signingKey))
    }

    /// A plain client of this server, as any client with its password could be: it forges what it likes.
    func attacker() throws -> RedisConnection {
        try RedisConnection(try RedisEndpoint.parse(url).get(), password: nil, timeout: .seconds(2))
    }

    /// The pub/sub channel of the session under `key`.
    static func channel(_ key: String = "mobile-api") -> String { "response-policy:{\(key)}:events" }
}

/// Publishes a logout (reason `revoked`) from `decider` until `log` hears it; false when it never
/// does. The listener subscribes in the background, and a message sent before that is lost, as
/// Redis pub/sub is.
func logOut(_ decider: any SessionCoordinator, heardBy log: UpdateLog, until: Date) async -> Bool {
    for _ in 0..<50 {
        await decider.publishLogout(until: until, reason: "revoked")
        if await log.first(within: .milliseconds(100), where: { if case .loggedOut = $0 { true } else { false } })
            != nil
        {
            return true
        }
    }
    return false
}
