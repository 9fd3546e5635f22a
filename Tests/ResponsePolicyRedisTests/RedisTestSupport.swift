import CoordinationTestSupport
import ResponsePolicy
import ResponsePolicyRedis

/// What the Redis suites share: one way to make a coordinator on a test's own server, and the
/// channel its news travels on.
extension RedisServerFixture {
    /// A Redis coordinator on this server; the caller stops it.
    func coordinator(
        key: String = "mobile-api", lease: Duration = .seconds(15), connectTimeout: Duration = .milliseconds(250)
    ) throws -> RedisSessionCoordinator {
        try RedisSessionCoordinator(.init(url: url, key: key, lease: lease, connectTimeout: connectTimeout))
    }

    /// The pub/sub channel of the session under `key`.
    static func channel(_ key: String = "mobile-api") -> String { "response-policy:{\(key)}:events" }
}
