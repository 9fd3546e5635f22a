import Foundation
import ResponsePolicy
import Testing

@testable import PolicyCLI

/// What the commands print when a policy wrongly holds a secret, and what `policy simulate`
/// prints when the script's requests and answers are full of tokens: never the secret.
///
/// `policy fetch` against the real server is checked in
/// `ResponsePolicyURLSessionTests/FetchRedactionTests.swift`.
struct SecretRedactionCLITests {
    static let secret = "PLANTED-CLIENT-SECRET-4be0"

    static let secretPolicy = """
        policy: 1
        name: secret
        classify: { code: body.status }
        rules:
          - { name: expired, when: { code: [1401] }, then: refresh }
          - { name: unauthorized, when: { status: [401], header: { WWW-Authenticate: '*invalid_token*' } }, then: refresh }
        refresh:
          use: oauth2
          with:
            token-url: https://auth.example.com/token
            client-id: app
            client-secret: \(secret)
        logout: { use: none }

        """

    static let message =
        "'client-secret' would put a secret in the policy file; store it in an environment variable and name that "
        + "with 'client-secret-env'"

    // MARK: - lint

    /// On a pipe (the binary run with its output captured) lint names the option and the fix,
    /// never the value, in both formats.
    @Test(arguments: ["text", "json"])
    func lintOnAPipeReportsTheSecretWithoutItsValue(_ format: String) async throws {
        let directory = try TemporaryDirectory()
        try directory.write("secret.yaml", Self.secretPolicy)
        let result = try await runPolicy(["lint", "--format", format, "secret.yaml"], in: directory.url)
        let expected =
            format == "text"
            ? "secret.yaml:12:5: error: \(Self.message) [secret-in-policy]\n1 file checked: 1 error, 0 warnings\n"
            : #"{"files":1,"errors":1,"warnings":0,"diagnostics":[{"file":"secret.yaml","line":12,"column":5,"#
                + #""severity":"error","rule":"secret-in-policy","message":"\#(Self.message)","#
                + #""endLine":12,"endColumn":18,"doc":"\#(lintRuleDoc("secret-in-policy"))","related":[]}]}"# + "\n"
        expectResult(result, stdout: expected, status: 1)
        #expect(!(result.stdout + result.stderr).contains(Self.secret))
    }

    /// On a terminal lint shows each finding's source line under it, except for a
    /// `client-secret:` finding, whose line is the secret's own.
    @Test func lintOnATerminalDoesNotShowTheSecretsLine() async throws {
        let directory = try TemporaryDirectory()
        let file = try directory.write("secret.yaml", Self.secretPolicy).path
        let result = await Self.runInProcess(["lint", file], terminal: true)
        #expect(result.status == 1)
        #expect(
            result.stdout.contains("secret.yaml:12:5: \u{1B}[1;31merror\u{1B}[0m: \(Self.message) [secret-in-policy]"))
        #expect(!result.stdout.contains(Self.secret), "\(result.stdout)")
    }

    /// Every other command that loads the policy refuses it with the one-line finding.
    @Test(arguments: [
        ["explain"], ["graph"], ["simulate", "--script", "script.yaml"],
        ["fetch", "--count", "1", "--policy"],
    ])
    func otherCommandsRefuseThePolicyWithoutEchoingTheSecret(_ command: [String]) async throws {
        let directory = try TemporaryDirectory()
        let file = try directory.write("secret.yaml", Self.secretPolicy).path
        try directory.write("script.yaml", "requests:\n  - id: a\n    responses: [{ status: 200 }]\n")
        var arguments = command.map { $0 == "script.yaml" ? directory.url.appendingPathComponent($0).path : $0 }
        arguments.append(file)
        if command.first == "fetch" { arguments.append("http://127.0.0.1:9/never") }
        let result = await Self.runInProcess(arguments, terminal: true)
        expectResult(
            result, stdout: "",
            stderr: "\(file):12:5: error: \(Self.message) [secret-in-policy]\n"
                + "error: '\(file)' has 1 error; run 'policy lint \(file)' for details\n",
            status: 1)
    }

    // MARK: - simulate

    /// The script signs its requests with planted tokens, its answers carry tokens in headers
    /// and bodies, a refresh fails with a token in its answer, and the simulated refresh hands
    /// out its own tokens (`sim-token-N`, `sim-refresh-N`): none of it is printed.
    @Test(arguments: ["text", "json"])
    func simulateNeverPrintsTokens(_ format: String) async throws {
        let directory = try TemporaryDirectory()
        let policy = try directory.write(
            "policy.yaml",
            """
            policy: 1
            name: sim
            classify: { code: body.status }
            rules:
              - { name: expired, when: { code: [1401] }, then: refresh }
              - { name: forced-logout, when: { code: [202] }, then: logout }
              - { name: forbidden, when: { status: [403] }, then: fail }
            refresh:
              use: oauth2
              with: { token-url: "https://auth.example.com/token", client-id: app }
              on-failure: fail
              share-window: 0s
            """
        ).path
        let script = try directory.write(
            "script.yaml",
            """
            requests:
              - id: expired
                headers: { Authorization: "Bearer PLANTED-CALLER-1", Cookie: "s=PLANTED-COOKIE" }
                responses:
                  - { body: '{"status":1401,"token":"PLANTED-BODY-1"}', headers: { Set-Cookie: "t=PLANTED-SET" } }
                  - { body: '{"status":0,"access_token":"PLANTED-BODY-2"}' }
              - id: forbidden
                at: 1s
                headers: { X-Api-Key: PLANTED-KEY }
                responses: [{ status: 403, body: 'PLANTED-BODY-3', headers: { WWW-Authenticate: "PLANTED-WWW" } }]
              - id: refused
                at: 2s
                responses: [{ body: '{"status":1401,"refresh_token":"PLANTED-BODY-4"}' }]
              - id: revoked
                at: 5s
                responses: [{ body: '{"status":202,"token":"PLANTED-BODY-5"}' }]
            refresh:
              - { after: 100ms, result: ok }
              - { after: 100ms, result: fail, status: 400, body: '{"error":"invalid_grant","t":"PLANTED-BODY-6"}' }
            """
        ).path
        let result = await Self.runInProcess(
            ["simulate", policy, "--script", script, "--format", format], terminal: false)
        #expect(result.status == 0, "\(result.stderr)")
        #expect(result.stderr == "note: running policy '\(policy)' (name 'sim')\n")
        let summary =
            format == "json"
            ? #"{"event":"summary","requests":4,"delivered":1,"failed":2,"logged-out":1,"refreshes":2,"logouts":1,"#
                + #""attempts":5}"#
            : "summary: 4 requests: 1 delivered, 2 failed, 1 logged out; 2 refreshes, 1 logout, 5 attempts"
        #expect(result.stdoutLines.last == summary)
        for planted in ["PLANTED", "sim-token", "sim-refresh"] {
            #expect(!result.stdout.contains(planted), "'\(planted)' in \(result.stdout)")
        }
    }
}

extension SecretRedactionCLITests {
    /// Runs the command in-process like ``runInProcess(_:)``, as if its output were a terminal or not.
    static func runInProcess(_ arguments: [String], terminal: Bool) async -> CLIResult {
        let stdout = Locked("")
        let stderr = Locked("")
        let output = CommandOutput(
            stdout: { text in stdout.withLock { $0 += text } },
            stderr: { text in stderr.withLock { $0 += text } },
            isTerminal: terminal)
        let status = await PolicyCommand.run(arguments, output: output)
        return CLIResult(stdout: stdout.withLock { $0 }, stderr: stderr.withLock { $0 }, status: status)
    }
}
