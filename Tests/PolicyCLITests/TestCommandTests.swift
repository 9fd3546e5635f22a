import Foundation
import Testing

@testable import PolicyCLI

/// `policy test`: scripts with expectations, run through the built binary.
/// Serialized: each test runs the binary, and a burst of parallel processes on a 2-core CI machine
/// starves the real-time-sensitive scheduler suites.
@Suite(.serialized)
struct TestCommandTests {
    static let policy = """
        policy: 1
        name: t
        classify: { code: body.status }
        rules:
          - { name: expired, when: { code: [1401] }, then: refresh }
          - { name: revoked, when: { code: [202] }, then: logout }
        refresh: { use: http, with: { url: "https://auth.example.com/refresh", token: body.token } }

        """

    static let passing = """
        policy: policy.yaml
        requests:
          - { id: a, at: 0s, responses: [{ status: 200, body: '{"status":1401}' }, { status: 200, body: '{"status":0}' }], expect: delivered }
          - { id: b, at: 500ms, responses: [{ status: 200, body: '{"status":202}' }], expect: logged-out }
        refresh: [{ after: 100ms, result: ok }]
        expect:
          summary: { refreshes: 1, logouts: 1, delivered: 1 }
          events:
            - { request: a, event: refresh-start }
            - { request: b, event: logout }

        """

    @Test func passingScriptExitsZero() async throws {
        let dir = try TemporaryDirectory()
        try dir.write("policy.yaml", Self.policy)
        try dir.write("ok.yaml", Self.passing)
        let result = try await runPolicy(["test", "ok.yaml"], in: dir.url)
        expectResult(
            result, stdout: "PASS ok.yaml with policy.yaml (7 expectations)\n1 script: 1 passed, 0 failed\n", status: 0)
    }

    @Test func failureNamesTheLineWhatWasExpectedAndWhatHappened() async throws {
        let dir = try TemporaryDirectory()
        try dir.write("policy.yaml", Self.policy)
        try dir.write(
            "bad.yaml",
            """
            policy: policy.yaml
            requests:
              - id: a
                responses: [{ status: 200, body: '{"status":202}' }]
                expect: { outcome: delivered, attempts: 2 }
            expect:
              summary: { refreshes: 1 }
              events:
                - { request: a, event: refresh-start }

            """)
        let result = try await runPolicy(["test", "bad.yaml"], in: dir.url)
        let expected = """
            FAIL bad.yaml with policy.yaml
            bad.yaml:5:13: request 'a': expected outcome 'delivered', got 'logged-out'; expected 2 attempts, got 1
              last events of 'a':
                  0.000s  a         send #1
                  0.050s  a         response #1: 200 code 202 -> revoked: logout
                  0.050s  a         logout (revoked)
                  0.050s  a         => logged-out 200 code 202
            bad.yaml:7:14: summary: expected refreshes 1, got 0
            bad.yaml:9:7: expected event 1 of 1, { request: a, event: refresh-start }, did not occur
              first events of 'a':
                  0.000s  a         send #1
                  0.050s  a         response #1: 200 code 202 -> revoked: logout
                  0.050s  a         logout (revoked)
                  0.050s  a         => logged-out 200 code 202
            1 script: 0 passed, 1 failed

            """
        expectResult(result, stdout: expected, status: 1)
    }

    @Test func junitReportsEachScriptAsATestCase() async throws {
        let dir = try TemporaryDirectory()
        try dir.write("policy.yaml", Self.policy)
        try dir.write("ok.yaml", Self.passing)
        try dir.write(
            "bad.yaml",
            """
            policy: policy.yaml
            requests:
              - { id: a, responses: [{ status: 200, body: '{"status":0}' }], expect: failed }

            """)
        let result = try await runPolicy(["test", "--format", "junit", "."], in: dir.url)
        #expect(result.status == 1)
        #expect(
            result.stdout.hasPrefix(
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites tests=\"2\" failures=\"1\""))
        #expect(result.stdout.contains("<testcase classname=\"policy-test\" name=\"./ok.yaml\" file=\"./ok.yaml\""))
        #expect(
            result.stdout.contains(
                "<failure message=\"./bad.yaml:3:74: request 'a': expected outcome 'failed', got 'delivered'\">"))
        #expect(result.stdout.hasSuffix("  </testsuite>\n</testsuites>\n"))
    }

    @Test func folderRunsScriptsAndSkipsPolicies() async throws {
        let dir = try TemporaryDirectory()
        try dir.write("policy.yaml", Self.policy)
        try dir.write("scripts/ok.yaml", Self.passing.replacingOccurrences(of: "policy.yaml", with: "../policy.yaml"))
        try dir.write("k8s.yaml", "apiVersion: v1\nkind: ConfigMap\n")
        let result = try await runPolicy(["test", "."], in: dir.url)
        expectResult(
            result, stdout: "PASS ./scripts/ok.yaml with policy.yaml (7 expectations)\n1 script: 1 passed, 0 failed\n",
            status: 0)
    }

    /// A retry policy and a candidate that retries twice as often, and a script written against
    /// the first: 3 retries, so 4 attempts.
    static let retryPolicy = """
        policy: 1
        name: retries
        rules: [{ name: transient, when: { status: [503] }, then: retry }]
        retry: { max-retries: 3, backoff: constant, initial: 1s, deadline: 60s }

        """
    static let retryScript = """
        policy: policy.yaml
        requests:
          - { id: a, responses: [{ status: 503 }], expect: { outcome: delivered, status: 503, attempts: 4 } }

        """

    /// The issue's false green: `--policy candidate.yaml` used to run each script with its own
    /// `policy:`, so a candidate passed whatever it did. The command line wins now, says which
    /// policy ran, and warns that the script names another.
    @Test func thePolicyOnTheCommandLineWinsOverTheScriptsOwn() async throws {
        let dir = try TemporaryDirectory()
        try dir.write("policy.yaml", Self.retryPolicy)
        try dir.write(
            "candidate.yaml", Self.retryPolicy.replacingOccurrences(of: "max-retries: 3", with: "max-retries: 5"))
        try dir.write(
            "tests/retry.yaml", Self.retryScript.replacingOccurrences(of: "policy.yaml", with: "../policy.yaml"))

        let own = try await runPolicy(["test", "tests/retry.yaml"], in: dir.url)
        expectResult(
            own, stdout: "PASS tests/retry.yaml with policy.yaml (1 expectation)\n1 script: 1 passed, 0 failed\n",
            status: 0)

        let candidate = try await runPolicy(["test", "--policy", "candidate.yaml", "tests/retry.yaml"], in: dir.url)
        #expect(candidate.status == 1)
        #expect(candidate.stdout.hasPrefix("FAIL tests/retry.yaml with candidate.yaml\n"))
        #expect(candidate.stdout.contains("expected 4 attempts, got 6"))
        #expect(
            candidate.stderr
                == "tests/retry.yaml:1:9: warning: the script names policy '../policy.yaml'; it runs with "
                + "'candidate.yaml' given by --policy\n")

        // simulate has the same precedence and says so the same way.
        let simulated = try await runPolicy(
            ["simulate", "candidate.yaml", "--script", "tests/retry.yaml"], in: dir.url)
        #expect(simulated.status == 0)
        #expect(simulated.stdout.hasSuffix("6 attempts\n"))
        #expect(
            simulated.stderr
                == "tests/retry.yaml:1:9: warning: the script names policy '../policy.yaml'; it runs with "
                + "'candidate.yaml' given on the command line\n"
                + "note: running policy 'candidate.yaml' (name 'retries')\n")

        // Naming the script's own policy, however the path is written, is no warning.
        let same = try await runPolicy(["test", "--policy", "./tests/../policy.yaml", "tests/retry.yaml"], in: dir.url)
        expectResult(
            same,
            stdout: "PASS tests/retry.yaml with ./tests/../policy.yaml (1 expectation)\n1 script: 1 passed, 0 failed\n",
            status: 0)
        let leftOut = try await runPolicy(["simulate", "--script", "tests/retry.yaml"], in: dir.url)
        #expect(leftOut.stdout.hasSuffix("4 attempts\n"))
        #expect(leftOut.stderr == "note: running policy 'policy.yaml' (name 'retries')\n")
    }

    @Test func junitNamesThePolicyEachScriptRanWith() async throws {
        let dir = try TemporaryDirectory()
        try dir.write("policy.yaml", Self.retryPolicy)
        try dir.write("retry.yaml", Self.retryScript)
        let result = try await runPolicy(["test", "--format", "junit", "retry.yaml"], in: dir.url)
        #expect(result.status == 0)
        #expect(result.stdout.contains("<properties><property name=\"policy\" value=\"policy.yaml\"/></properties>"))
    }

    @Test func scriptWithoutPolicyOrExpectationsFails() async throws {
        let dir = try TemporaryDirectory()
        try dir.write("policy.yaml", Self.policy)
        try dir.write("nopolicy.yaml", "requests:\n  - { id: a, responses: [{ status: 200 }], expect: delivered }\n")
        try dir.write("noexpect.yaml", "policy: policy.yaml\nrequests:\n  - { id: a, responses: [{ status: 200 }] }\n")
        let result = try await runPolicy(["test", "nopolicy.yaml", "noexpect.yaml"], in: dir.url)
        let expected = """
            FAIL nopolicy.yaml
            nopolicy.yaml:1:1: error: the script names no policy; add 'policy: PATH' (relative to the script) or pass --policy
            FAIL noexpect.yaml
            noexpect.yaml:1:1: error: the script states no expectations; add 'expect:' to a request or at the top level
            2 scripts: 0 passed, 2 failed

            """
        expectResult(result, stdout: expected, status: 1)
        let withPolicy = try await runPolicy(["test", "--policy", "policy.yaml", "nopolicy.yaml"], in: dir.url)
        expectResult(
            withPolicy, stdout: "PASS nopolicy.yaml with policy.yaml (1 expectation)\n1 script: 1 passed, 0 failed\n",
            status: 0)
    }

    @Test func badExpectationIsAPositionedError() async throws {
        let dir = try TemporaryDirectory()
        try dir.write("policy.yaml", Self.policy)
        try dir.write(
            "typo.yaml",
            "policy: policy.yaml\nrequests:\n  - { id: a, responses: [{ status: 200 }], expect: deliverd }\n"
                + "expect:\n  summary: { refreshs: 1 }\n")
        let result = try await runPolicy(["test", "typo.yaml"], in: dir.url)
        let expected = """
            FAIL typo.yaml
            typo.yaml:3:52: error: 'expect' cannot be 'deliverd'; did you mean 'delivered'? [invalid-value]
            typo.yaml:5:14: error: unknown key 'refreshs'; did you mean 'refreshes'? [unknown-key]
            1 script: 0 passed, 1 failed

            """
        expectResult(result, stdout: expected, status: 1)
        // lint checks the same expectations.
        let lint = try await runPolicy(["lint", "typo.yaml"], in: dir.url)
        #expect(lint.status == 1)
        #expect(lint.stdout.contains("typo.yaml:3:52: error: 'expect' cannot be 'deliverd'"))
    }

    @Test func missingPathAndUsageErrors() async throws {
        let dir = try TemporaryDirectory()
        let missing = try await runPolicy(["test", "nope.yaml"], in: dir.url)
        #expect(missing.status == 66)
        #expect(missing.stderr == "error: cannot read 'nope.yaml': no such file or directory\n")
        let usage = try await runPolicy(["test"], in: dir.url)
        #expect(usage.status == 64)
        let help = try await runPolicy(["test", "--help"], in: dir.url)
        #expect(help.status == 0)
        #expect(help.stdout.contains("EXIT CODES:\n  0"))
    }

    @Test func simulateTakesTheScriptsPolicyWhenNoFileIsGiven() async throws {
        let dir = try TemporaryDirectory()
        try dir.write("policy.yaml", Self.policy)
        try dir.write("scripts/ok.yaml", Self.passing.replacingOccurrences(of: "policy.yaml", with: "../policy.yaml"))
        let implicit = try await runPolicy(
            ["simulate", "--script", "scripts/ok.yaml", "--format", "json"], in: dir.url)
        let explicit = try await runPolicy(
            ["simulate", "policy.yaml", "--script", "scripts/ok.yaml", "--format", "json"], in: dir.url)
        #expect(implicit.status == 0)
        #expect(implicit.stdout == explicit.stdout)
        #expect(implicit.stdoutLines.last?.hasPrefix(#"{"event":"summary","requests":2,"delivered":1"#) == true)
    }

    @Test func shippedExamplesPass() async throws {
        let result = try await runPolicy(["test", "examples/"], timeout: 120)
        #expect(result.status == 0, "\(result.stdout)\(result.stderr)")
        #expect(result.stdout.hasSuffix(" passed, 0 failed\n"))
        #expect(!result.stdout.contains("FAIL"))
    }
}
