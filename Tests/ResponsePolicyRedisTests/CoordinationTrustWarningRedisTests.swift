import Foundation
import ResponsePolicy
import ResponsePolicyRedis
import Testing

/// Issue 23: a Redis that is not on a loopback address, without `signing-key-env`, is a run-time
/// warning, not only a lint one: a `problem` event at start, listed in `engine.problems` for good,
/// without making `PolicyEngine(checking:)` refuse the policy. (`redis://0.0.0.0:1` is not a
/// loopback address by the lint's rule, and connects nowhere off this host.)
struct CoordinationTrustWarningRedisTests {
    static var plugins: PluginRegistry {
        var registry = PluginRegistry()
        RedisCoordination.register(in: &registry)
        return registry
    }

    static func policy(_ with: String) throws -> Policy {
        try Policy.load(
            yaml: "policy: 1\nname: t\ncoordination: { use: redis, with: { \(with) } }\n", plugins: plugins.catalog)
    }

    static func engine(_ policy: Policy, environment: [String: String] = [:]) -> (PolicyEngine, EventLog) {
        let events = EventLog()
        var options = PolicyEngine.Options()
        options.observers = [events]
        options.environment = environment
        let engine = PolicyEngine(
            policy: policy, transport: RecordingTransport { _, _ in response("") }, plugins: plugins, options: options)
        return (engine, events)
    }

    @Test func aRemoteRedisWithoutASigningKeyIsAProblemAtRunTime() throws {
        let (engine, events) = Self.engine(try Self.policy("url: \"redis://0.0.0.0:1/0\", connect-timeout: 10ms"))
        let warning = try #require(engine.coordinationWarning)
        #expect(warning.reason.contains("redis://0.0.0.0:1/0") && warning.reason.contains("signing-key-env"))
        #expect(engine.problems.contains(warning))
        #expect(events.problems.contains("coordination: \(warning.reason)"))
        // A warning, not a plugin that cannot be made: a checked engine starts.
        #expect(throws: Never.self) {
            _ = try PolicyEngine(
                checking: try Self.policy("url: \"redis://0.0.0.0:1/0\", connect-timeout: 10ms"),
                transport: RecordingTransport { _, _ in response("") }, plugins: Self.plugins)
        }
    }

    @Test(arguments: [
        (
            "url: \"redis://0.0.0.0:1/0\", connect-timeout: 10ms, signing-key-env: FLEET_KEY",
            ["FLEET_KEY": "0123456789abcdef0123456789abcdef"]
        ),
        ("url: \"redis://127.0.0.1:1/0\", connect-timeout: 10ms", [:]),
    ])
    func aKeyOrALoopbackRedisIsNoWarning(_ with: String, _ environment: [String: String]) throws {
        let (engine, events) = Self.engine(try Self.policy(with), environment: environment)
        #expect(engine.coordinationWarning == nil)
        #expect(!events.problems.contains { $0.contains("signing-key-env") })
    }

    @Test func aShortSigningKeyIsRefusedAtStart() throws {
        let (engine, _) = Self.engine(
            try Self.policy("url: \"redis://127.0.0.1:1/0\", connect-timeout: 10ms, signing-key-env: FLEET_KEY"),
            environment: ["FLEET_KEY": "short-key"])
        let problem = try #require(engine.problems.first { $0.reason.contains("FLEET_KEY") })
        #expect(problem.reason.contains("shorter than 16 bytes") && !problem.reason.contains("short-key"))
    }
}
