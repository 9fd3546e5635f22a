import Foundation
import ResponsePolicy
import TestSupport
import Testing

@testable import PolicyCLI

/// Policies that once linted clean and then did something else, end to end through the built
/// `policy` binary: lint, explain, graph and simulate must tell one story.
struct OneFlowCommandTests {
    static let escalation = """
        policy: 1
        name: esc
        rules:
          - name: transient
            when: { status: [503] }
            then: { do: retry, max-retries: 2, on-exhausted: logout }
        retry: { backoff: constant, initial: 1s }
        logout: { cooldown: 5s }

        """

    static func lint(_ yaml: String, strict: Bool = false) async throws -> CLIResult {
        let directory = try TemporaryDirectory()
        try directory.write("p.yaml", yaml)
        return try await runPolicy(["lint"] + (strict ? ["--strict"] : []) + ["p.yaml"], in: directory.url)
    }

    static func run(_ arguments: [String], _ yaml: String, script: String? = nil) async throws -> CLIResult {
        let directory = try TemporaryDirectory()
        try directory.write("p.yaml", yaml)
        if let script { try directory.write("s.yaml", script) }
        return try await runPolicy(
            arguments + ["p.yaml"] + (script == nil ? [] : ["--script", "s.yaml"]), in: directory.url)
    }

    // MARK: - The issue's example

    @Test func anOverriddenOnExhaustedLogoutIsUsedByLintGraphExplainAndSimulate() async throws {
        expectResult(
            try await Self.lint(Self.escalation, strict: true), stdout: "1 file checked: 0 errors, 0 warnings\n",
            status: 0)

        let graph = try await Self.run(["graph", "--format", "dot"], Self.escalation)
        #expect(graph.stdoutLines.contains(#"  "default.rule.1.retry" -> "default.logout" [label="on-exhausted"];"#))
        #expect(graph.stdoutLines.contains(#"  "default.logout" -> "logged-out" [label="cooldown 5s"];"#))

        let explain = try explanation(of: Self.escalation, file: "p.yaml")
        #expect(explain.contains("when retries run out, the session is logged out (cooldown 5s)."))
        #expect(explain.contains("\n  Logout: every request in flight or waiting is cancelled"))

        let simulate = try await Self.run(
            ["simulate", "--format", "json"], Self.escalation,
            script: "requests:\n  - { id: a, responses: [{ status: 503 }, { status: 503 }, { status: 503 }] }\n")
        #expect(simulate.status == 0)
        #expect(
            simulate.stdoutLines.contains(
                #"{"t":2.15,"request":"a","event":"response","attempt":3,"status":503,"rule":"transient","action":"logout","reason":"on-exhausted"}"#
            ), "\(simulate.stdout)")
        #expect(simulate.stdoutLines.last?.contains(#""logged-out":1"#) == true)
    }

    // MARK: - graph --format json

    @Test func graphJSONHasStableIdsRuleOrderEffectiveSettingsAndEdgeKinds() async throws {
        let result = try await Self.run(["graph", "--format", "json"], Self.escalation)
        #expect(result.status == 0 && result.stderr == "")
        let json = try #require(
            try JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [String: Any])
        let nodes = try #require(json["nodes"] as? [[String: Any]])
        let edges = try #require(json["edges"] as? [[String: Any]])
        let retry = try #require(nodes.first { $0["id"] as? String == "default.rule.1.retry" })
        #expect(retry["kind"] as? String == "action" && retry["index"] as? Int == 1)
        let settings = try #require(retry["settings"] as? [String: String])
        // The rule's override, not the section's default of 3 retries and deliver.
        #expect(settings["max-retries"] == "2" && settings["on-exhausted"] == "logout" && settings["initial"] == "1s")
        let kinds = Set(edges.compactMap { $0["kind"] as? String })
        #expect(
            kinds.isSuperset(of: [
                "match", "then", "retry", "on-exhausted", "budget", "deadline", "not-retryable", "cooldown",
            ]))
        let ids = edges.compactMap { $0["id"] as? String }
        #expect(Set(ids).count == ids.count)
        #expect(ids.contains("default.rule.1.retry>on-exhausted>default.logout"))
        // No orphan: every node but the classifier is the target of an edge.
        let targets = Set(edges.compactMap { $0["to"] as? String })
        for node in nodes where node["kind"] as? String != "classifier" {
            #expect(targets.contains(node["id"] as? String ?? ""), "orphan \(node["id"] ?? "?")")
        }
        let scopes = try #require(json["scopes"] as? [[String: Any]])
        let rules = try #require(scopes.first?["rules"] as? [[String: Any]])
        #expect(rules.map { $0["index"] as? Int } == [1])
    }

    @Test func drawingsHaveNoOrphanNodes() throws {
        let policy = try Policy.load(path: repositoryRoot.appendingPathComponent("policies/default.yaml").path)
        let targets = Set(policy.graph.edges.map(\.to))
        for node in policy.graph.nodes where node.kind != .classifier {
            #expect(targets.contains(node.id), "orphan \(node.id)")
        }
    }

    // MARK: - Codes

    @Test func businessCodeRangesMatchAndDotRangesAreErrors() async throws {
        let ranged =
            "policy: 1\nname: r\nclassify: { code: body.status }\nrules:\n  - { name: client, when: { code: [\"1400-1499\"] }, then: fail }\n"
        expectResult(
            try await Self.lint(ranged, strict: true), stdout: "1 file checked: 0 errors, 0 warnings\n", status: 0)
        let simulate = try await Self.run(
            ["simulate", "--format", "json"], ranged,
            script: "requests:\n  - { id: a, responses: [{ body: '{\"status\":1417}' }] }\n")
        #expect(simulate.stdout.contains(#""rule":"client","action":"fail""#), "\(simulate.stdout)")
        // What ops read names the range, as the engine matches it.
        let explain = try explanation(of: ranged, file: "p.yaml")
        #expect(explain.contains("1. client: when the business code is 1400-1499, fail the request."))
        let graph = try await Self.run(["graph", "--format", "json"], ranged)
        #expect(graph.stdout.contains(#""when":"code 1400-1499""#), "\(graph.stdout)")

        let dots = ranged.replacingOccurrences(of: "1400-1499", with: "1400..1499")
        expectResult(
            try await Self.lint(dots),
            stdout: "p.yaml:5:36: error: '1400..1499' is not a code range; write \"1400-1499\" [invalid-code]\n"
                + "1 file checked: 1 error, 0 warnings\n", status: 1)
        let zero = ranged.replacingOccurrences(of: "\"1400-1499\"", with: "\"0202\"")
        expectResult(
            try await Self.lint(zero),
            stdout: "p.yaml:5:36: warning: code '0202' has a leading zero, so it is not 202: codes compare by their "
                + "text; write 202 if the server sends a number [code-leading-zero]\n"
                + "1 file checked: 0 errors, 1 warning\n", status: 0)
    }

    // MARK: - Retries that never happen

    @Test func aRetryThatCanNeverHappenWarnsAndExplainSaysSo() async throws {
        let yaml = """
            policy: 1
            name: posts
            retry: { idempotency-key: none }
            rules:
              - { name: create, when: { status: [503], method: [POST] }, then: { do: retry, max-retries: 1 } }

            """
        expectResult(
            try await Self.lint(yaml),
            stdout: "p.yaml:5:68: warning: rule 'create' never retries: POST is not in retry.methods and "
                + "'idempotency-key' is none; list the method in 'methods' or set 'idempotency-key' [never-retried]\n"
                + "1 file checked: 0 errors, 1 warning\n", status: 0)
        let explain = try explanation(of: yaml, file: "p.yaml")
        #expect(explain.contains("not retried: POST is not in retry.methods"), "\(explain)")
        #expect(!explain.contains("retry up to 1 time"))
    }

    // MARK: - Routes

    @Test func routesAreLinted() async throws {
        let yaml = """
            policy: 1
            name: routes
            classify: { code: body.status }
            rules:
              - { name: forced-logout, when: { code: [202] }, then: logout }
            routes:
              - match: { path: "/api/*" }
                retry: { max-retries: 1 }
              - match: { path: "/api/upload", method: [POST] }
                rules:
                  - { name: busy, when: { status: [503] }, then: retry }
              - match: { path: "https://api.example.com/v2/*" }
                rules: []

            """
        let result = try await Self.lint(yaml)
        #expect(result.status == 1)
        #expect(
            result.stdoutLines == [
                "p.yaml:9:5: warning: this route's rules replace the top-level rules and leave out 'forced-logout' "
                    + "(logout); add it to the route's rules, or write 'rules: []' if the route should have none "
                    + "[route-drops-rules]",
                "p.yaml:9:5: warning: route 2 never applies: route 1 comes first and matches every request it does "
                    + "[shadowed-route]",
                "p.yaml:7:5: note: route 1 is here",
                "p.yaml:12:5: error: route path 'https://api.example.com/v2/*' has a scheme and host, but only the "
                    + "request's path is matched; write '/v2/*' [invalid-path]",
                "1 file checked: 1 error, 2 warnings",
            ])
        let explainable = yaml.replacingOccurrences(of: "https://api.example.com/v2/*", with: "/v2/*")
        let explain = try explanation(of: explainable, file: "p.yaml")
        #expect(
            explain.contains(
                "  Its own rules replace the top-level rules, so these do not apply here: 'forced-logout' (logout).\n"))
    }

    // MARK: - Findings that follow from an error

    @Test func findingsThatFollowFromAnErrorAreNotShown() async throws {
        let unknownAction = """
            policy: 1
            name: x
            logout: { cooldown: 5s }
            rules:
              - { name: gone, when: { status: [401] }, then: logot }

            """
        let result = try await Self.lint(unknownAction)
        #expect(result.stdoutLines.count == 2, "\(result.stdout)")
        #expect(result.stdout.contains("[invalid-value]") && !result.stdout.contains("unused-section"))

        let badPath = """
            policy: 1
            name: x
            classify: { code: status }
            rules:
              - { name: gone, when: { code: [202] }, then: fail }

            """
        let second = try await Self.lint(badPath)
        #expect(!second.stdout.contains("add 'classify"), "\(second.stdout)")
        #expect(second.stdout.contains("[invalid-value]"))
    }

    // MARK: - Settings that surprised

    @Test func theShareWindowTrapWarnsAndTheShippedPoliciesAvoidIt() async throws {
        let trap = """
            policy: 1
            name: trap
            refresh:
              use: oauth2
              with: { token-url: "https://auth.example.com/token", client-id: app }
              share-window: 20s
              max-per-request: 1
              on-exhausted: logout
            rules:
              - { name: unauthorized, when: { status: [401] }, then: refresh }

            """
        let result = try await Self.lint(trap)
        #expect(result.stdout.contains("p.yaml:6:17: warning: with 'share-window: 20s' a token that expires again"))
        #expect(result.stdout.contains("[share-window-logout]"))
        let shipped = try await runPolicy(["lint", "--strict", "policies"])
        #expect(shipped.status == 0, "\(shipped.stdout)")
        let defaults = try Policy.load(yaml: "policy: 1\nname: d\n")
        #expect(defaults.refresh.shareWindow == .zero)
        #expect(defaults.retry.budget == RetrySettings.Budget(ratio: 0.2, min: 100))
    }

    @Test func retryAfterWithoutMaxDelayWarnsWhateverTheBackoff() async throws {
        let yaml = """
            policy: 1
            name: x
            retry: { backoff: linear, max-delay: none, retry-after: honor }
            rules:
              - { name: busy, when: { status: [503] }, then: retry }

            """
        let result = try await Self.lint(yaml)
        #expect(result.stdout.contains("[unbounded-retry-after]"), "\(result.stdout)")
    }

    @Test(arguments: [
        (
            "retry: { initial: 1000 }",
            "'initial' needs a unit; a bare number could be seconds or milliseconds: write 1000s or 1000ms"
        ),
        ("retry: { initial: -5s }", "'initial' cannot be negative: '-5s'"),
        ("retry: { initial: 9999999999h }", "'initial' is out of range: '9999999999h'"),
        ("retry: { max-retries: \"3\" }", "'max-retries' must be a whole number, not the text '3'; remove the quotes"),
        (
            "logout: { cancel-in-flight: \"true\" }",
            "'cancel-in-flight' must be true or false, not the text 'true'; remove the quotes"
        ),
        (
            "retry: { initial: 10s, max-delay: 5s }\nrules: [{ name: b, when: { status: [503] }, then: retry }]",
            "'initial: 10s' is longer than 'max-delay: 5s'"
        ),
    ])
    func hintsLeadSomewhereGood(_ yaml: String, _ message: String) async throws {
        let result = try await Self.lint("policy: 1\nname: x\n" + yaml + "\n")
        #expect(result.stdout.contains(message), "\(result.stdout)")
    }

    @Test func aNewerSchemaSaysANewerToolIsNeeded() async throws {
        let result = try await Self.lint("policy: 2\nname: x\n")
        #expect(
            result.stdoutLines.first
                == "p.yaml:1:9: error: this tool reads policy schema 1; 'policy: 2' needs a newer version of the tool [unsupported-version]"
        )
    }

    // MARK: - Visible reasons

    @Test func simulateTextSaysWhy() async throws {
        let yaml = """
            policy: 1
            name: why
            classify: { code: body.status }
            rules:
              - { name: token-expired, when: { code: [1401] }, then: refresh }
              - { name: transient, when: { status: [503] }, then: retry }
            refresh:
              use: oauth2
              with: { token-url: "https://auth.example.com/token", client-id: app }
            retry: { budget: { ratio: 0, min: 0 } }

            """
        let script = """
            requests:
              - { id: a-request-with-a-long-id, responses: [{ status: 503 }] }
              - { id: b, method: POST, responses: [{ status: 503 }] }
              - { id: c, at: 1s, responses: [{ body: '{"status":1401}' }] }
            refresh: [{ result: fail }]

            """
        let result = try await Self.run(["simulate"], yaml, script: script)
        #expect(result.status == 0)
        let lines = result.stdoutLines
        #expect(
            lines.contains("    0.050s  a-request-with-a-long-id  => delivered 503 (retry refused: budget)"),
            "\(result.stdout)")
        #expect(lines.contains("    0.050s  b                         => delivered 503 (POST not retried)"))
        #expect(
            lines.contains("    1.150s  c                         logout (refresh failed: scripted refresh failure)"))
        // Every time column and id column lines up.
        #expect(Set(lines.dropLast().map { $0.prefix(37).last }).count == 1)
    }

    @Test func fetchNeverSetsATransportTimeoutBelowTheAttemptTimeout() throws {
        let slow = try Policy.load(yaml: "policy: 1\nname: x\nretry: { attempt-timeout: 2m, deadline: 5m }\n")
        #expect(transportTimeout(for: slow) == .seconds(121))
        let usual = try Policy.load(yaml: "policy: 1\nname: x\n")
        #expect(transportTimeout(for: usual) == .seconds(60))
    }
}
