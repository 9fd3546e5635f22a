import Foundation
import Testing

/// Issue 23: `policy fetch` prints a store's trust warning (a Redis that is not on a loopback
/// address, without `signing-key-env`) like other coordination problems, once, before it sends.
struct CoordinationTrustWarningCLITests {
    @Test(arguments: [false, true])
    func fetchPrintsTheMissingSigningKeyOfARemoteRedis(keyed: Bool) async throws {
        let directory = try TemporaryDirectory()
        let key = keyed ? ", signing-key-env: FLEET_KEY" : ""
        let policy = try directory.write(
            "policy.yaml",
            """
            policy: 1
            name: fleet
            coordination: { use: redis, with: { url: "redis://0.0.0.0:1/0", connect-timeout: 10ms\(key) } }
            """)
        var environment = ProcessInfo.processInfo.environment
        environment["FLEET_KEY"] = "0123456789abcdef0123456789abcdef"
        let result = try await runExecutable(
            try policyBinary.get(), ["fetch", "--count", "1", "--policy", policy.path, "http://127.0.0.1:9/never"],
            environment: environment)
        let warning =
            "warning: coordination: redis://0.0.0.0:1/0 is not a loopback address and 'signing-key-env' is not set"
        #expect(result.stderr.components(separatedBy: warning).count - 1 == (keyed ? 0 : 1), "\(result.stderr)")
        #expect(!result.crashed)
    }

    @Test func explainSaysWhatTheSigningKeyProtects() async throws {
        let directory = try TemporaryDirectory()
        let policy = try directory.write(
            "policy.yaml",
            """
            policy: 1
            name: fleet
            coordination: { use: redis, with: { url: "redis://127.0.0.1:6379/0", signing-key-env: FLEET_KEY } }
            """)
        let result = try await runPolicy(["explain", policy.path])
        #expect(result.status == 0)
        #expect(
            try explanation(ofFile: policy.path).contains(
                "used only when signed with the key in FLEET_KEY (HMAC-SHA256)"),
            "\(result.stdout)")
    }
}
