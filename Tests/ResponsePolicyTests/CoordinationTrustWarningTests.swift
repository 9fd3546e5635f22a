import Foundation
import Testing

@testable import ResponsePolicy

#if canImport(Glibc)
    import Glibc
#endif

/// Issue 23: a store others could tamper with is a run-time warning, not only a lint one: a
/// `problem` event at start, listed in `engine.problems` for good, without making
/// `PolicyEngine(checking:)` refuse the policy. (`redis://0.0.0.0:1` is not a loopback address by
/// the lint's rule, and connects nowhere off this host.)
struct CoordinationTrustWarningTests {
    static func policy(_ with: String) throws -> Policy {
        try Policy.load(yaml: "policy: 1\nname: t\ncoordination: { use: redis, with: { \(with) } }\n")
    }

    static func engine(_ policy: Policy, environment: [String: String] = [:], credentials: (any CredentialStore)? = nil)
        -> (PolicyEngine, EventLog)
    {
        let events = EventLog()
        var options = PolicyEngine.Options()
        options.observers = [events]
        options.environment = environment
        let engine = PolicyEngine(
            policy: policy, transport: RecordingTransport { _, _ in response("") }, credentials: credentials,
            options: options)
        return (engine, events)
    }

    @Test func aRemoteRedisWithoutASigningKeyIsAProblemAtRunTime() throws {
        let (engine, events) = Self.engine(try Self.policy("url: \"redis://0.0.0.0:1/0\", connect-timeout: 10ms"))
        let warning = try #require(engine.coordinationWarning)
        #expect(warning.reason.contains("redis://0.0.0.0:1/0") && warning.reason.contains("signing-key-env"))
        #expect(engine.problems.contains(warning))
        let problems = events.events.filter { $0.kind == .problem }.compactMap(\.reason)
        #expect(problems.contains("coordination: \(warning.reason)"))
        // A warning, not a plugin that cannot be made: a checked engine starts.
        #expect(throws: Never.self) {
            _ = try PolicyEngine(
                checking: try Self.policy("url: \"redis://0.0.0.0:1/0\", connect-timeout: 10ms"),
                transport: RecordingTransport { _, _ in response("") })
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
        #expect(!events.events.contains { $0.kind == .problem && $0.reason?.contains("signing-key-env") == true })
    }

    @Test(arguments: [(0o777 as mode_t, true), (0o775, true), (0o755, false), (0o700, false)])
    func aFileStoreInAFolderOthersCanWriteIsAWarning(_ mode: mode_t, _ warned: Bool) throws {
        let folder = try CoordinationRecordTests.Folder()
        chmod(folder.path, mode)
        defer { chmod(folder.path, 0o700) }
        let policy = try Policy.load(
            yaml: """
                policy: 1
                name: t
                store: { use: file, with: { path: "\(folder.path)/credentials.json" } }
                coordination: { use: file }
                """)
        let (engine, _) = Self.engine(policy, credentials: FileCredentialStore(path: folder.path + "/credentials.json"))
        #expect((engine.coordinationWarning != nil) == warned)
        if warned {
            #expect(engine.coordinationWarning?.reason.contains("chmod go-w '\(folder.path)'") == true)
            #expect(engine.problems.contains { $0.reason.contains("can be written by other users") })
        }
    }

    @Test func aShortSigningKeyIsRefusedAtStart() throws {
        let (engine, _) = Self.engine(
            try Self.policy("url: \"redis://127.0.0.1:1/0\", connect-timeout: 10ms, signing-key-env: FLEET_KEY"),
            environment: ["FLEET_KEY": "short-key"])
        let problem = try #require(engine.problems.first { $0.reason.contains("FLEET_KEY") })
        #expect(problem.reason.contains("shorter than 16 bytes") && !problem.reason.contains("short-key"))
    }
}
