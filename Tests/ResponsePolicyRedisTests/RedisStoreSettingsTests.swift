import Foundation
import TestSupport
import Testing

@testable import ResponsePolicy
@testable import ResponsePolicyRedis

/// Issue 30: a Redis set up to forget what the fleet shares (`maxmemory` with an eviction policy
/// other than `noeviction`) is said at start (a `problem` update, so a `problem` event and
/// `policy fetch`'s stderr) and by `policy lint --check-env` (rule `coordination-store-forgets`),
/// asked of Redis itself (`INFO memory`).
@Suite(.enabled(if: RedisServerFixture.isInstalled, "redis-server is not installed"))
struct RedisStoreSettingsTests {
    static let endpoint = RedisEndpoint(host: "127.0.0.1", port: 6379, database: 0, username: nil, tls: false)

    static func info(_ limit: Int64, _ policy: String) -> String {
        "# Memory\r\nused_memory:1000\r\nmaxmemory:\(limit)\r\nmaxmemory_human:1M\r\nmaxmemory_policy:\(policy)\r\n"
    }

    @Test(arguments: [
        ("allkeys-lru", "any key, the session itself included"), ("allkeys-lfu", "any key"),
        ("allkeys-random", "any key"), ("volatile-lru", "keys with a time to live"),
        ("volatile-ttl", "keys with a time to live"),
    ])
    func anEvictionPolicyWithAMemoryLimitIsSaid(_ policy: String, _ what: String) {
        let warning = RedisStoreSettings.warning(info: Self.info(100 << 20, policy), endpoint: Self.endpoint)
        #expect(warning?.contains("maxmemory-policy \(policy)") == true && warning?.contains(what) == true)
        #expect(warning?.contains("Set maxmemory-policy noeviction") == true)
    }

    @Test(arguments: [(100 << 20, "noeviction"), (0, "allkeys-lru")] as [(Int64, String)])
    func noEvictionOrNoLimitIsNothingToSay(_ limit: Int64, _ policy: String) {
        #expect(RedisStoreSettings.warning(info: Self.info(limit, policy), endpoint: Self.endpoint) == nil)
        #expect(RedisStoreSettings.warning(info: "", endpoint: Self.endpoint) == nil)
    }

    @Test func aRedisThatEvictsIsAProblemAtStartAndALintWarning() async throws {
        let server = try RedisServerFixture()
        defer { server.kill() }
        let admin = try server.attacker()
        _ = try admin.command(["CONFIG", "SET", "maxmemory", "104857600"])
        _ = try admin.command(["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"])
        let coordinator = try server.coordinator(key: "evicting")
        defer { coordinator.stop() }
        #expect(coordinator.storeSettingsWarnings().first?.contains("maxmemory-policy allkeys-lru") == true)
        let log = UpdateLog()
        _ = await coordinator.start(local: testCredentials("seed"), updates: log.sink)
        let said = await log.first(within: .seconds(60)) {
            if case .problem(let text) = $0 { text.contains("evicts keys") } else { false }
        }
        #expect(said != nil, "\(log.updates)")
        // lint --check-env's warning, positioned at the coordination section.
        var registry = PluginRegistry()
        RedisCoordination.register(in: &registry)
        let policy = try Policy.load(
            yaml: "policy: 1\nname: t\ncoordination: { use: redis, with: { url: \"\(server.url)\", key: k } }\n",
            plugins: registry.catalog)
        let warnings = registry.coordinationStoreWarnings(in: policy, environment: [:])
        #expect(warnings.map(\.rule) == ["coordination-store-forgets"] && warnings.first?.severity == .warning)
        _ = try admin.command(["CONFIG", "SET", "maxmemory-policy", "noeviction"])
        #expect(registry.coordinationStoreWarnings(in: policy, environment: [:]).isEmpty)
        #expect(coordinator.storeSettingsWarnings().isEmpty)
    }
}
