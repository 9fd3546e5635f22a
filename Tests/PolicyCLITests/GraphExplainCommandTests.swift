import Foundation
import ResponsePolicy
import TestSupport
import Testing

@testable import PolicyCLI

/// `policy graph` and `policy explain` end to end, checked against the library's own graph.
struct GraphExplainCommandTests {
    static let defaultPolicy = "policies/default.yaml"

    static let invalid = "policy: 1\nname: x\nretyr: {}\n"
    static let invalidReport =
        "bad.yaml:3:1: error: unknown key 'retyr'; did you mean 'retry'? [unknown-key]\n"
        + "error: 'bad.yaml' has 1 error; run 'policy lint bad.yaml' for details\n"

    static func loadDefault() throws -> Policy {
        try Policy.load(path: repositoryRoot.appendingPathComponent(defaultPolicy).path)
    }

    // MARK: - graph

    @Test func dotHasEveryNodeAndEdgeOfTheCompiledGraph() async throws {
        let policy = try Self.loadDefault()
        let result = try await runPolicy(["graph", Self.defaultPolicy])
        #expect(result.status == 0)
        #expect(result.stderr == "")
        #expect(result.stdout.hasPrefix("digraph \"\(policy.name)\" {\n"))
        #expect(result.stdout.hasSuffix("}\n"))
        for node in policy.graph.nodes {
            #expect(result.stdout.contains("\"\(node.id)\" ["), "no node '\(node.id)'")
        }
        for edge in policy.graph.edges {
            #expect(result.stdout.contains("\"\(edge.from)\" -> \"\(edge.to)\""), "no edge \(edge.from) -> \(edge.to)")
        }
        // One box per rule, labelled with its name, in each scope that runs it.
        let lines = result.stdoutLines
        for rule in policy.rules {
            let boxes = lines.filter { $0.contains("[shape=box, label=\"") && $0.contains(". \(rule.name): ") }
            #expect(boxes.count == 1, "rule '\(rule.name)'")
        }
    }

    @Test func dotOfTheDefaultPolicyHasTheEscalationEdges() async throws {
        let result = try await runPolicy(["graph", "--format", "dot", Self.defaultPolicy])
        #expect(result.status == 0)
        let lines = Set(result.stdoutLines)
        for expected in [
            #"    "default.rule.1" [shape=box, label="1. token-expired: code 1401"];"#,
            #"    "default.rule.2" [shape=box, label="2. forced-logout: code 202"];"#,
            #"    "default.rule.3" [shape=box, label="3. missing-scope: status 401, 403 and header WWW-Authenticate = *insufficient_scope*"];"#,
            #"    "default.rule.4" [shape=box, label="4. unauthorized: status 401"];"#,
            #"  "default.rule.1" -> "default.rule.1.refresh";"#,
            #"  "default.rule.2" -> "default.logout";"#,
            #"  "default.rule.3" -> "default.deliver";"#,
            #"  "default.rule.5" -> "default.rule.5.retry";"#,
            #"  "default.rule.1.refresh" -> "default.logout" [label="on-exhausted"];"#,
            #"  "default.rule.1.refresh" -> "default.logout" [label="on-failure"];"#,
            #"  "default.rule.5.retry" -> "default.deliver" [label="on-exhausted"];"#,
            #"  "default.logout" -> "logged-out" [label="cooldown 20s"];"#,
        ] {
            #expect(lines.contains(expected), "missing line: \(expected)")
        }
    }

    @Test func mermaidHasEveryRuleAndTheEscalationEdges() async throws {
        let policy = try Self.loadDefault()
        let result = try await runPolicy(["graph", "--format", "mermaid", Self.defaultPolicy])
        #expect(result.status == 0)
        #expect(result.stderr == "")
        #expect(result.stdout.hasPrefix("flowchart LR\n"))
        for rule in policy.rules {
            #expect(result.stdout.contains(". \(rule.name): "), "rule '\(rule.name)'")
        }
        let lines = Set(result.stdoutLines)
        for expected in [
            #"    default_rule_1["1. token-expired: code 1401"]"#,
            #"  default_rule_1_refresh -->|"on-exhausted"| default_logout"#,
            #"  default_rule_1_refresh -->|"on-failure"| default_logout"#,
            #"  default_rule_5_retry -->|"on-exhausted"| default_deliver"#,
        ] {
            #expect(lines.contains(expected), "missing line: \(expected)")
        }
    }

    @Test func graphOfAnInvalidPolicyExitsOneWithDiagnosticsOnStderr() async throws {
        let directory = try TemporaryDirectory()
        try directory.write("bad.yaml", Self.invalid)
        for format in ["dot", "mermaid"] {
            let result = try await runPolicy(["graph", "--format", format, "bad.yaml"], in: directory.url)
            expectResult(result, stdout: "", stderr: Self.invalidReport, status: 1)
        }
    }

    @Test func graphOfAMissingFileExits66() async throws {
        let directory = try TemporaryDirectory()
        let result = try await runPolicy(["graph", "missing.yaml"], in: directory.url)
        expectResult(
            result, stdout: "", stderr: "error: cannot read 'missing.yaml': no such file or directory\n", status: 66)
    }

    @Test func graphOfAFolderExits66() async throws {
        let directory = try TemporaryDirectory()
        try directory.makeFolder("folder")
        let result = try await runPolicy(["graph", "folder"], in: directory.url)
        expectResult(result, stdout: "", stderr: "error: cannot read 'folder': it is a directory\n", status: 66)
    }

    @Test func graphWithAnUnknownFormatExits64() async throws {
        let result = try await runPolicy(["graph", "--format", "svg", Self.defaultPolicy])
        expectResult(
            result, stdout: "",
            stderr: usageError(
                "Unknown format 'svg'; use dot, mermaid or json",
                usage: "policy graph [--format dot|mermaid|json] [--plugin KIND:NAME]... FILE",
                help: "policy graph --help"),
            status: 64)
    }

    @Test func graphTakesExactlyOneFile() async throws {
        let result = try await runPolicy(["graph", Self.defaultPolicy, "policies/transient.yaml"])
        expectResult(
            result, stdout: "",
            stderr: usageError(
                "Unexpected argument 'policies/transient.yaml'",
                usage: "policy graph [--format dot|mermaid|json] [--plugin KIND:NAME]... FILE",
                help: "policy graph --help"),
            status: 64)
    }

    // MARK: - explain

    @Test func explainOfTheDefaultPolicyStatesEveryRuleAndTheWorstCase() async throws {
        let result = try await runPolicy(["explain", Self.defaultPolicy])
        #expect(result.status == 0)
        #expect(result.stderr == "")
        // The binary prints the library's text wrapped at 80 columns (its output is not a terminal).
        let policy = try Policy.load(
            yaml: String(contentsOf: repositoryRoot.appendingPathComponent(Self.defaultPolicy), encoding: .utf8),
            file: Self.defaultPolicy)
        #expect(result.stdout == PolicyExplainer.explain(policy, width: 80))
        let lines = PolicyExplainer.explain(policy, width: nil).split(separator: "\n").map(String.init)
        #expect(lines.first == "Policy 'mobile-api' (policies/default.yaml)")
        for expected in [
            "Requests to /oauth/* (route at line 59):",
            "  There are no rules: every response is delivered as it is, and no response leads to a retry, a refresh "
                + "or a logout.",
            "All other requests:",
            "  The business code is read from the JSON body at 'status'.",
            "  Rules, first match wins:",
            "    1. token-expired: when the business code is 1401, refresh the token and send the request again, "
                + "at most 1 time per request; after that the session is logged out (cooldown 20s).",
            "    2. forced-logout: when the business code is 202, log out (cooldown 20s).",
            "    3. missing-scope: when the status is 401 or 403 and the 'WWW-Authenticate' header matches"
                + " '*insufficient_scope*', deliver the response.",
            "    4. unauthorized: when the status is 401, refresh the token and send the request again, "
                + "at most 1 time per request; after that the session is logged out (cooldown 20s).",
            "    5. transient: when the status is 502, 503 or 504, or the attempt fails with a timeout or connection "
                + "error, retry up to 3 times, waiting 1s, 2s, 4s (exponential, capped at 8s, no jitter, "
                + "Retry-After honoured, within the retry budget of 100 + 20% per 10s); a request whose method is not "
                + "GET, HEAD, PUT, DELETE or OPTIONS and that carries no 'Idempotency-Key' header is not retried; when "
                + "retries run out, the last response is delivered.",
            "  Any other response is delivered; any other failed attempt fails the request.",
            // Every term of the bound: 5 attempts × 10s, each possibly held 10s for a refresh, the
            // trigger's own refresh of 10s, and the waits.
            "  Worst case: 5 attempts (1 + 3 retries + 1 re-send after a refresh), plus one re-send each time"
                + " another request's refresh replaced the token an attempt carried, or a refresh's answer was read"
                + " past refresh.timeout (the deadline bounds those),"
                + " waiting at most 7s in total "
                + "(1s + 2s + 4s); each attempt may first wait up to 10s for a refresh (held while one is in flight, "
                + "or refreshing before sending); with every attempt and refresh timing out, 117s (134s if the "
                + "server's Retry-After asks for the longest waits); the deadline is 2m.",
            "  Worst case: 1 attempt; each attempt may first wait up to 10s for a refresh (held while one is in "
                + "flight, or refreshing before sending); with every attempt and refresh timing out, 20s; the "
                + "deadline is 2m.",
        ] {
            #expect(lines.contains(expected), "missing line: \(expected)")
        }
    }

    @Test func explainOfTheTransientPolicyMatchesItsComment() async throws {
        let result = try await runPolicy(["explain", "policies/transient.yaml"])
        #expect(result.status == 0)
        #expect(result.stderr == "")
        #expect(
            try explanation(ofFile: repositoryRoot.appendingPathComponent("policies/transient.yaml").path)
                .split(separator: "\n").map(String.init).contains(
                    "  Worst case: 5 attempts (1 + 4 retries), waiting at most 9s in total (600ms + 1.2s + 2.4s + 4.8s); "
                        + "with every attempt and refresh timing out, 34s (65s if the server's Retry-After asks for "
                        + "the longest waits); the deadline is 70s."))
    }

    @Test func explainListsWarningsAtTheEnd() async throws {
        let directory = try TemporaryDirectory()
        try directory.write("warn.yaml", LintCommandTests.warningsOnly)
        let result = try await runPolicy(["explain", "warn.yaml"], in: directory.url)
        #expect(result.status == 0)
        #expect(result.stderr == "")
        #expect(
            result.stdout
                == PolicyExplainer.explain(
                    try Policy.load(yaml: LintCommandTests.warningsOnly, file: "warn.yaml"), width: 80))
        #expect(
            try explanation(of: LintCommandTests.warningsOnly, file: "warn.yaml").hasSuffix(
                "\n\nWarning (line 10): 'POST' in 'methods' retries requests that may already have been applied; "
                    + "rely on an idempotency key instead.\n"
                    + "Warning (line 16): rule 'busy-again' never matches: rule 'busy' comes first and matches "
                    + "everything it does.\n"))
    }

    @Test func explainOfAnInvalidPolicyExitsOne() async throws {
        let directory = try TemporaryDirectory()
        try directory.write("bad.yaml", Self.invalid)
        let result = try await runPolicy(["explain", "bad.yaml"], in: directory.url)
        expectResult(result, stdout: "", stderr: Self.invalidReport, status: 1)
    }

    @Test func explainOfAMissingFileExits66() async throws {
        let directory = try TemporaryDirectory()
        let result = try await runPolicy(["explain", "missing.yaml"], in: directory.url)
        expectResult(
            result, stdout: "", stderr: "error: cannot read 'missing.yaml': no such file or directory\n", status: 66)
    }

    @Test func explainWithoutAFileExits64() async throws {
        let result = try await runPolicy(["explain"])
        expectResult(
            result, stdout: "",
            stderr: usageError(
                "Missing expected argument 'FILE'", usage: "policy explain [--plugin KIND:NAME]... FILE",
                help: "policy explain --help"),
            status: 64)
    }

    // MARK: - The binary and the library agree

    @Test(arguments: [
        ["explain", "policies/default.yaml"], ["graph", "policies/default.yaml"],
        ["graph", "--format", "mermaid", "policies/default.yaml"], ["lint", "--format", "json", "policies"],
    ])
    func binaryPrintsWhatTheCommandReturnsInProcess(_ arguments: [String]) async throws {
        let binary = try await runPolicy(arguments)
        // The in-process run resolves relative paths against the test's working directory; use
        // absolute ones there and compare after mapping them back.
        let root = repositoryRoot.path + "/"
        let absolute = arguments.map { $0.hasPrefix("policies") ? root + $0 : $0 }
        var inProcess = await runInProcess(absolute)
        inProcess.stdout = inProcess.stdout.replacingOccurrences(of: root, with: "")
        #expect(inProcess == binary)
    }
}

/// Issue 35 item 8 and issue 31 item 8: `explain` wraps its lines and does not contradict itself.
struct ExplainWordingTests {
    static let twoScopes = """
        policy: 1
        name: api
        classify: { code: body.status }
        rules:
          - { name: expired, when: { code: [1401] }, then: refresh }
          - { name: busy, when: { status: [503] }, then: { do: retry, methods: [GET, POST] } }
        refresh: { use: oauth2, with: { token-url: "https://auth.example.com/oauth/token", client-id: app }, ahead: 30s }
        routes:
          - match: { path: "/oauth/*" }
            rules: []
        """

    /// Every line at most 80 columns through the binary (a pipe), unless it is one word; the words
    /// are the library's, in the same order.
    @Test func explainWrapsAtEightyColumnsWhenNotATerminal() async throws {
        let directory = try TemporaryDirectory()
        let file = try directory.write("p.yaml", Self.twoScopes)
        let result = try await runPolicy(["explain", "p.yaml"], in: directory.url)
        #expect(result.status == 0)
        for line in result.stdoutLines {
            #expect(line.count <= 80 || !line.trimmingCharacters(in: .whitespaces).contains(" "), "\(line)")
        }
        #expect(FileManager.default.fileExists(atPath: file.path))
        let unwrapped = try explanation(of: Self.twoScopes, file: "p.yaml")
        #expect(unwrapped.split(separator: "\n").contains { $0.count > 200 })
        #expect(result.stdout.split(whereSeparator: \.isWhitespace) == unwrapped.split(whereSeparator: \.isWhitespace))
    }

    @Test(arguments: [20, 40, 72, 120, 1_000])
    func wrappingKeepsEveryWordAndHangsListItems(_ width: Int) throws {
        let policy = try Policy.load(yaml: Self.twoScopes, file: "p.yaml")
        let wrapped = PolicyExplainer.explain(policy, width: width)
        let unwrapped = PolicyExplainer.explain(policy, width: nil)
        #expect(wrapped.split(whereSeparator: \.isWhitespace) == unwrapped.split(whereSeparator: \.isWhitespace))
        let lines = wrapped.split(separator: "\n", omittingEmptySubsequences: false)
        for line in lines where line.count > width {
            #expect(!line.trimmingCharacters(in: .whitespaces).contains(" "), "\(line)")
        }
        // A rule's next lines start under its text, after its number.
        if width < 100, let item = lines.firstIndex(where: { $0.hasPrefix("    1. expired:") }) {
            #expect(lines[item + 1].hasPrefix("       ") && !lines[item + 1].hasPrefix("        "))
        }
    }

    /// A route with `rules: []` said "nothing is retried or refreshed", then described a refresh
    /// before sending and its logout: it says what its flow has, without the contradiction.
    @Test func aRouteWithoutRulesSaysOnlyWhatItsFlowDoes() throws {
        let text = try explanation(of: Self.twoScopes, file: "p.yaml")
        let oauth = try #require(text.components(separatedBy: "\n\n").first { $0.hasPrefix("Requests to /oauth/*") })
        #expect(!oauth.contains("nothing is retried or refreshed"))
        #expect(
            oauth.contains(
                "There are no rules: every response is delivered as it is, and no response leads to a retry, a refresh or a logout."
            ))
        #expect(oauth.contains("Before sending: a token expiring within 30s"))
        #expect(!oauth.contains("requests that hit a trigger wait for it"), "\(oauth)")
        #expect(!oauth.contains("Retries apply"))
        // The engine's flow has the refresh before sending for this route: what explain says is there.
        let policy = try Policy.load(yaml: Self.twoScopes, file: "p.yaml")
        #expect(policy.graph.scopes[0].reachableActions.contains(.refresh))
        #expect(policy.graph.scopes[0].beforeSendingFailure != nil)
    }

    /// A rule with its own `methods: [GET, POST]` was explained with "not in retry.methods" and the
    /// section's "Retries apply to GET, HEAD, PUT, DELETE, OPTIONS", which no rule used.
    @Test func aRulesOwnRetryMethodsAreTheOnesSaid() throws {
        let text = try explanation(of: Self.twoScopes, file: "p.yaml")
        #expect(
            text.contains(
                "a request whose method is not GET or POST and that carries no 'Idempotency-Key' header is not retried")
        )
        #expect(!text.contains("retry.methods"))
        #expect(!text.contains("Retries apply to GET, HEAD, PUT, DELETE, OPTIONS"))
        #expect(text.contains("Retries apply to GET, POST requests"))
        // Two retry rules with different methods: no one list is claimed for the scope.
        let mixed = Self.twoScopes.replacingOccurrences(
            of: "  - { name: busy,",
            with: "  - { name: slow, when: { status: [504] }, then: retry }\n  - { name: busy,")
        let both = try explanation(of: mixed, file: "p.yaml")
        #expect(both.contains("Which requests are retried depends on the rule (each rule above says)."))
        #expect(both.contains("a request whose method is not GET, HEAD, PUT, DELETE or OPTIONS"))
    }
}
