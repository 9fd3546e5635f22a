import Foundation
import TestSupport
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
            rules: [{ name: missing-scope, when: { status: [401], header: { WWW-Authenticate: '*insufficient_scope*' } }, then: deliver }, { name: unauthorized, when: { status: [401] }, then: refresh }]
            refresh:
              use: oauth2
              with:
                token-url: https://auth.example.com/token
                client-id: app
                grant: password
                username-env: RP_STUMBLE_UNSET_USER
                password-env: RP_STUMBLE_UNSET_PASSWORD
              on-exhausted: fail
              on-failure: fail
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

    struct Case: Sendable, CustomTestStringConvertible {
        var name: String
        var yaml: String
        var findings: [String]
        var testDescription: String { name }
    }

    /// Messages that said what was wrong but not how to fix it, each now with the fix.
    @Test(arguments: [
        Case(
            name: "a key of another section",
            yaml: "retry: { cooldown: 20s }\n",
            findings: [
                "p.yaml:3:10: error: unknown key 'cooldown' in 'retry'; 'cooldown' is a key of 'logout': move it to "
                    + "the 'logout' section [unknown-key]"
            ]),
        Case(
            name: "a shortened key",
            yaml: "retry: { retries: 3 }\n",
            findings: ["p.yaml:3:10: error: unknown key 'retries'; did you mean 'max-retries'? [unknown-key]"]),
        Case(
            name: "a section indented into another",
            yaml: "logout:\n  cooldown: 20s\n  retry: { max-retries: 1 }\n",
            findings: [
                "p.yaml:5:3: error: unknown key 'retry' in 'logout'; 'retry' is a top-level section: move it out "
                    + "(check its indentation) [unknown-key]"
            ]),
        Case(
            name: "a when key written on the rule",
            yaml: "rules: [{ name: a, when: { status: [503] }, error: [timeout], then: retry }]\n",
            findings: [
                "p.yaml:3:45: error: unknown key 'error' in a rule; 'error' is a key of 'when': write it under "
                    + "'when:', as in when: { error: … } [unknown-key]"
            ]),
        Case(
            name: "a negative number",
            yaml: "retry: { max-retries: -1 }\n",
            findings: ["p.yaml:3:23: error: 'max-retries' must be between 0 and 100, not -1 [invalid-value]"]),
        Case(
            name: "a number past any range",
            yaml: "retry: { max-retries: 99999999999999999999 }\n",
            findings: [
                "p.yaml:3:23: error: 'max-retries' must be between 0 and 100, not 99999999999999999999 [invalid-value]"
            ]),
        Case(
            name: "a negative duration",
            yaml: "logout: { cooldown: -5s }\n",
            findings: [
                "p.yaml:3:21: error: 'cooldown' cannot be negative: '-5s'; a duration is 0s or more, like 5s "
                    + "[invalid-duration]"
            ]),
        Case(
            name: "a tab",
            yaml: "retry:\n\tmax-retries: 3\n",
            findings: [
                "p.yaml:4:1: error: a tab indents this line; YAML indents with spaces only: replace the tab with "
                    + "spaces [yaml-syntax]"
            ]),
        Case(
            name: "a key indented too far",
            yaml: "retry:\n  max-retries: 3\n   initial: 1s\n",
            findings: [
                "p.yaml:5:11: error: unexpected ':' here: this line is indented more than the keys above it (line "
                    + "it up with them), or a value holds ': ' and needs quotes [yaml-syntax]"
            ]),
        Case(
            name: "a rule key outdented from its list item",
            yaml: "rules:\n  - name: a\n    when: { status: [503] }\n  then: retry\n",
            findings: [
                "p.yaml:6:3: error: this line does not line up with the list that starts on line 4: start a new "
                    + "item with '- ' or indent it like the item's other keys [yaml-syntax]",
                "p.yaml:4:3: note: the list starts here",
            ]),
        Case(
            name: "an unclosed quote",
            yaml: "classify: { code: \"body.status }\n",
            findings: [
                "p.yaml:4:1: error: a quoted text is not closed: add the closing quote [yaml-syntax]",
                "p.yaml:3:19: note: the quoted text starts here",
            ]),
    ])
    func messagesSayHowToFixThem(_ stumble: Case) async throws {
        let dir = try TemporaryDirectory()
        try dir.write("p.yaml", "policy: 1\nname: p\n" + stumble.yaml)
        let result = try await runPolicy(["lint", "p.yaml"], in: dir.url)
        let errors = stumble.findings.filter { $0.contains(": error: ") }.count
        expectResult(
            result,
            stdout: stumble.findings.map { $0 + "\n" }.joined()
                + "1 file checked: \(errors) error\(errors == 1 ? "" : "s"), 0 warnings\n",
            status: 1)
    }

    /// A script whose response body is written as a YAML mapping gets the JSON text to write.
    @Test func aScriptBodyWrittenAsAMappingGetsTheJSONToWrite() async throws {
        let dir = try TemporaryDirectory()
        try dir.write("policy.yaml", "policy: 1\nname: p\n")
        try dir.write(
            "script.yaml",
            "policy: policy.yaml\nrequests:\n  - { id: a, responses: [{ body: { status: 1401, ok: true, "
                + "msg: hi } }], expect: delivered }\n")
        let result = try await runPolicy(["lint", "script.yaml"], in: dir.url)
        expectResult(
            result,
            stdout: "script.yaml:3:34: error: 'body' is the body's text, not a mapping; write its JSON in quotes: "
                + "body: '{\"status\":1401,\"ok\":true,\"msg\":\"hi\"}' [invalid-type]\n"
                + "1 file checked: 1 error, 0 warnings\n",
            status: 1)
    }

    /// `policy: 1` in a script (a policy's schema version where a script names its policy file)
    /// was answered "it has no top-level 'requests:'" by `policy test`, for a file that has one.
    @Test func aScriptWithASchemaVersionIsToldWhatPolicyMeansInAScript() async throws {
        let dir = try TemporaryDirectory()
        try dir.write(
            "script.yaml", "policy: 1\nrequests:\n  - { id: a, responses: [{ status: 200 }], expect: delivered }\n")
        let explanation =
            "this file has 'requests:' like a simulation script, but 'policy: 1' is a policy file's schema "
            + "version; in a script, 'policy:' names the policy file to run, like policy: ../policies/default.yaml "
            + "(or leave it out and pass the policy on the command line) [invalid-value]"
        let test = try await runPolicy(["test", "script.yaml"], in: dir.url)
        expectResult(
            test, stdout: "FAIL script.yaml\nscript.yaml:1:9: error: \(explanation)\n1 script: 0 passed, 1 failed\n",
            status: 1)
        let lint = try await runPolicy(["lint", "script.yaml"], in: dir.url)
        #expect(lint.status == 1)
        #expect(
            lint.stdout.contains(
                "script.yaml:2:1: error: unknown key 'requests' in a policy; a simulation script has 'requests:' and "
                    + "names the policy file to run with 'policy: PATH' (a number after 'policy:' makes this file a "
                    + "policy) [unknown-key]"))
    }

    /// A refresh rule that runs out of re-sends said "(retries exhausted)".
    @Test func aRefreshThatRunsOutSaysSoNotRetriesExhausted() async throws {
        let result = try await runPolicy([
            "simulate", "--script",
            repositoryRoot.appendingPathComponent(
                "examples/simulations/04-max-per-request.yaml"
            ).path,
        ])
        #expect(result.status == 0)
        #expect(result.stdout.contains("(refreshes exhausted: refresh.max-per-request reached)"))
        #expect(!result.stdout.contains("retries exhausted"))
    }

    /// A request another request's logout ends has the outcome `logged-out` (SPEC §5). A script
    /// that expected `cancelled` failed without saying why; the failure and the text output say so.
    @Test func aRequestEndedByAnotherRequestsLogoutExplainsItsOutcome() async throws {
        let dir = try TemporaryDirectory()
        try dir.write(
            "policy.yaml",
            "policy: 1\nname: p\nclassify: { code: body.status }\n"
                + "rules: [{ name: revoked, when: { code: [202] }, then: logout }]\n")
        try dir.write(
            "script.yaml",
            """
            policy: policy.yaml
            requests:
              - { id: slow, responses: [{ body: '{"status":0}', latency: 5s }], expect: cancelled }
              - { id: trigger, at: 10ms, responses: [{ body: '{"status":202}' }], expect: logged-out }

            """)
        let test = try await runPolicy(["test", "script.yaml"], in: dir.url)
        #expect(test.status == 1)
        #expect(
            test.stdout.contains(
                "script.yaml:3:77: request 'slow': expected outcome 'cancelled', got 'logged-out' (a request a logout "
                    + "ends, on the wire, waiting or refused during the cooldown, has the outcome 'logged-out'; "
                    + "'cancelled' is for a caller that cancels its own request)\n"))
        #expect(test.stdout.contains("slow      cancelled by the logout (its outcome is logged-out)\n"))
    }

    /// `shadowed-rule` was reported for a rule an invalid code had widened (decoded without it).
    @Test func noShadowedRuleFollowsFromAnInvalidCode() async throws {
        let dir = try TemporaryDirectory()
        try dir.write(
            "p.yaml",
            """
            policy: 1
            name: p
            classify: { code: body.status }
            rules:
              - { name: expired, when: { code: [1401] }, then: fail }
              - { name: gone, when: { code: [1401, "1400..1499"] }, then: fail }

            """)
        let result = try await runPolicy(["lint", "p.yaml"], in: dir.url)
        expectResult(
            result,
            stdout: "p.yaml:6:40: error: '1400..1499' is not a code range; write \"1400-1499\" [invalid-code]\n"
                + "1 file checked: 1 error, 0 warnings\n",
            status: 1)
    }
}
