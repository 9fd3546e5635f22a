import Foundation
import Testing

@testable import ResponsePolicy

#if canImport(Glibc)
    import Glibc
#endif

/// Issue 23: a store others could tamper with is a run-time warning, not only a lint one: a
/// `problem` event at start, listed in `engine.problems` for good, without making
/// `PolicyEngine(checking:)` refuse the policy. The Redis cases are in
/// `ResponsePolicyRedisTests/CoordinationTrustWarningRedisTests`.
struct CoordinationTrustWarningTests {
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
}
