import Foundation
import Testing

@testable import PolicyCLI

/// The stumbles a new ops engineer and a new service developer met following the docs (issue
/// 21), each with the test that would have caught it.
@Suite(.serialized)
struct NewcomerStumbleTests {
    /// `lint --check-env` on a policy with two routes printed one missing variable three times
    /// (once per scope) and named only the first of two missing variables.
    @Test func checkEnvReportsEachPluginOnceWithEveryMissingVariable() async throws {
        let dir = try TemporaryDirectory()
        try dir.write(
            "policy.yaml",
            """
            policy: 1
            name: routes
            rules: [{ name: unauthorized, when: { status: [401] }, then: refresh }]
            refresh:
              use: oauth2
              with:
                token-url: https://auth.example.com/token
                client-id: app
                grant: password
                username-env: RP_STUMBLE_UNSET_USER
                password-env: RP_STUMBLE_UNSET_PASSWORD
            routes:
              - { match: { path: "/a/*" }, retry: { max-retries: 1 } }
              - { match: { path: "/b/*" }, retry: { max-retries: 2 } }

            """)
        let result = try await runPolicy(["lint", "--check-env", "policy.yaml"], in: dir.url)
        let expected = """
            policy.yaml:5:8: error: refresh plugin 'oauth2' cannot be made: the environment variable \
            'RP_STUMBLE_UNSET_USER' named by 'username-env' is not set; also the environment variable \
            'RP_STUMBLE_UNSET_PASSWORD' named by 'password-env' is not set [plugin-unavailable]
            1 file checked: 1 error, 0 warnings

            """
        expectResult(result, stdout: expected, status: 1)
    }
}
