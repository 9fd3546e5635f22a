import Foundation
import TestSupport
import Testing

@testable import PolicyCLI

/// `policy diff`: behaviour, not text.
/// Serialized: each test runs the binary, and a burst of parallel processes on a 2-core CI machine
/// starves the real-time-sensitive scheduler suites.
@Suite(.serialized)
struct DiffCommandTests {
    static let base = """
        policy: 1
        name: api
        classify: { code: body.status }
        rules:
          - { name: expired, when: { code: [1401] }, then: refresh }
          - { name: revoked, when: { code: [202] }, then: logout }
          - { name: transient, when: { status: [503] }, then: retry }
        refresh: { use: http, with: { url: "https://auth.example.com/refresh", token: body.token } }
        retry: { max-retries: 3, initial: 1s, max-delay: 8s }

        """

    @Test func sameBehaviourWrittenDifferentlyIsNoChange() async throws {
        let dir = try TemporaryDirectory()
        try dir.write("old.yaml", Self.base)
        // Key order, flow vs block style, comments, anchors and defaults written out.
        try dir.write(
            "new.yaml",
            """
            # reviewed
            name: api
            policy: 1
            x-retry: &retry { initial: 1s, max-retries: 3, max-delay: 8s, backoff: exponential }
            retry: *retry
            refresh:
              with: { token: body.token, url: "https://auth.example.com/refresh" }
              use: http
              timeout: 10s
            classify:
              code: body.status
            rules:
              - name: expired
                when: { code: ["1401"] }
                then: refresh
              - { name: revoked, when: { code: [202] }, then: logout }
              - { name: transient, when: { status: [503] }, then: retry }

            """)
        let result = try await runPolicy(["diff", "old.yaml", "new.yaml"], in: dir.url)
        expectResult(result, stdout: "no change in behaviour between 'old.yaml' and 'new.yaml'\n", status: 0)
        let json = try await runPolicy(["diff", "--format", "json", "old.yaml", "new.yaml"], in: dir.url)
        expectResult(json, stdout: #"{"same":true,"changes":[]}"# + "\n", status: 0)
    }

    @Test func changedSettingsRulesTriggersAndWorstCaseAreListed() async throws {
        let dir = try TemporaryDirectory()
        try dir.write("old.yaml", Self.base)
        try dir.write(
            "new.yaml",
            Self.base.replacingOccurrences(of: "max-retries: 3", with: "max-retries: 5")
                .replacingOccurrences(of: "code: [202]", with: "code: [202, 203]")
                .replacingOccurrences(
                    of: "  - { name: transient, when: { status: [503] }, then: retry }",
                    with: "  - { name: transient, when: { status: [503] }, then: { do: retry, max-retries: 1 } }\n"
                        + "  - { name: busy, when: { status: [429] }, then: fail }"))
        let result = try await runPolicy(["diff", "old.yaml", "new.yaml"], in: dir.url)
        // The section's max-retries 3 -> 5 reaches no rule (the only retry rule now overrides
        // it), so it is no change in behaviour: the rule's own 3 -> 1 is.
        let expected = """
            all other requests (top level):
              rule 'revoked': when: code 202 -> code 202, 203
              rule 'transient': retry.max-retries: 3 -> 1
              rule 'busy' added: #4: status 429 -> fail
              logs out on: code 202 -> code 202, code 203
              fails on: none -> status 429
              worst case: 5 attempts, waits 1s + 2s + 4s = 7s, total 117s (with Retry-After 134s) -> 3 attempts, waits 1s, total 71s (with Retry-After 78s)
            6 changes in behaviour

            """
        expectResult(result, stdout: expected, status: 1)
        let json = try await runPolicy(["diff", "--format", "json", "old.yaml", "new.yaml"], in: dir.url)
        #expect(json.status == 1)
        let object = try #require(try JSONSerialization.jsonObject(with: Data(json.stdout.utf8)) as? [String: Any])
        #expect(object["same"] as? Bool == false)
        let changes = try #require(object["changes"] as? [[String: Any]])
        #expect(changes.count == 6)
        let setting = try #require(changes.first { $0["kind"] as? String == "setting" })
        #expect(setting["rule"] as? String == "transient")
        #expect(setting["key"] as? String == "retry.max-retries")
        #expect(setting["old"] as? String == "3")
        #expect(setting["new"] as? String == "1")
    }

    @Test func reorderingRulesChangesWhichMatchesFirst() async throws {
        let dir = try TemporaryDirectory()
        let old = """
            policy: 1
            name: api
            rules:
              - { name: unavailable, when: { status: [503] }, then: fail }
              - { name: server, when: { status: ["500-599"] }, then: retry }

            """
        try dir.write("old.yaml", old)
        let swapped = """
            policy: 1
            name: api
            rules:
              - { name: server, when: { status: ["500-599"] }, then: retry }
              - { name: unavailable, when: { status: [503] }, then: fail }

            """
        try dir.write("new.yaml", swapped)
        let result = try await runPolicy(["diff", "old.yaml", "new.yaml"], in: dir.url)
        #expect(result.status == 1)
        #expect(result.stdout.contains("  rule 'server': position: 2 -> 1\n"))
        #expect(result.stdout.contains("  fails on: status 503 -> none\n"))
        #expect(result.stdout.contains("  retries on: status 500-502, status 504-599 -> status 500-599\n"))
    }

    @Test func routesAreMatchedByWhatTheyMatchNotTheirPosition() async throws {
        let dir = try TemporaryDirectory()
        let routes = """
            policy: 1
            name: api
            rules: [{ name: transient, when: { status: [503] }, then: retry }]
            retry: { backoff: constant, initial: 1s }
            routes:
              - { match: { path: "/a/*" }, rules: [] }
              - { match: { path: "/b/*" }, retry: { max-retries: 1 } }

            """
        try dir.write("old.yaml", routes)
        try dir.write(
            "new.yaml",
            """
            policy: 1
            name: api
            rules: [{ name: transient, when: { status: [503] }, then: retry }]
            retry: { backoff: constant, initial: 1s }
            routes:
              - { match: { path: "/b/*" }, retry: { max-retries: 2 } }
              - { match: { path: "/a/*" }, rules: [] }
              - { match: { path: "/c/*", method: [POST] }, rules: [] }

            """)
        let result = try await runPolicy(["diff", "old.yaml", "new.yaml"], in: dir.url)
        let expected = """
            requests to /b/*:
              rule 'transient': retry.max-retries: 1 -> 2
              worst case: 2 attempts, waits 1s, total 21s (with Retry-After 50s) -> 3 attempts, waits 1s + 1s = 2s, total 32s (with Retry-After 90s)
            POST requests to /c/*:
              route added
            3 changes in behaviour

            """
        expectResult(result, stdout: expected, status: 1)
    }

    @Test func escalationTargetChangesAreReported() async throws {
        let dir = try TemporaryDirectory()
        try dir.write("old.yaml", Self.base)
        // Where retries and refreshes end changes; no setting a rule lists says so in text.
        try dir.write(
            "new.yaml",
            Self.base.replacingOccurrences(
                of: "when: { status: [503] }, then: retry }",
                with: "when: { status: [503] }, then: { do: retry, on-exhausted: logout } }"
            )
            .replacingOccurrences(of: "token: body.token } }", with: "token: body.token }, on-failure: deliver }"))
        let result = try await runPolicy(["diff", "old.yaml", "new.yaml"], in: dir.url)
        let expected = """
            all other requests (top level):
              rule 'expired': on-failure leads to: logout -> deliver
              rule 'transient': on-exhausted, not-retryable, budget leads to: deliver -> logout
            4 changes in behaviour

            """
        expectResult(result, stdout: expected, status: 1)
        let json = try await runPolicy(["diff", "--format", "json", "old.yaml", "new.yaml"], in: dir.url)
        let object = try #require(try JSONSerialization.jsonObject(with: Data(json.stdout.utf8)) as? [String: Any])
        let changes = try #require(object["changes"] as? [[String: Any]])
        #expect(changes.map { $0["kind"] as? String } == Array(repeating: "escalation", count: 4))
        #expect(changes.map { $0["key"] as? String } == ["on-failure", "on-exhausted", "not-retryable", "budget"])
        #expect(changes.last?["rule"] as? String == "transient")
        #expect(changes.last?["new"] as? String == "logout")
    }

    @Test func methodAndPathDependentTriggerChangesAreReported() async throws {
        let dir = try TemporaryDirectory()
        let old = """
            policy: 1
            name: api
            rules:
              - { name: uploads, when: { status: [503], method: [POST] }, then: fail }
              - { name: files, when: { error: [timeout], path: "/files/*" }, then: retry }
              - { name: transient, when: { status: [503] }, then: retry }

            """
        try dir.write("old.yaml", old)
        try dir.write(
            "new.yaml",
            old.replacingOccurrences(of: "method: [POST]", with: "method: [PUT]")
                .replacingOccurrences(of: "\"/files/*\"", with: "\"/blobs/*\""))
        let result = try await runPolicy(["diff", "old.yaml", "new.yaml"], in: dir.url)
        let expected = """
            all other requests (top level):
              rule 'uploads': when: status 503 on POST -> status 503 on PUT
              rule 'files': when: error timeout at /files/* -> error timeout at /blobs/*
              retries on: status 503 on any method but POST, error timeout at /files/* -> status 503 on any method but PUT, error timeout at /blobs/*
              fails on: status 503 on POST -> status 503 on PUT
            4 changes in behaviour

            """
        expectResult(result, stdout: expected, status: 1)
    }

    @Test func rangesListsOverridesAndRoutesWrittenDifferentlyAreNoChange() async throws {
        let dir = try TemporaryDirectory()
        try dir.write(
            "old.yaml",
            """
            policy: 1
            name: api
            classify: { code: body.status }
            rules:
              - { name: expired, when: { code: [1401, 1402, 1403] }, then: refresh }
              - { name: transient, when: { status: [502, 503, 504], method: [GET, PUT] }, then: retry }
            refresh: { use: http, with: { url: "https://auth.example.com/refresh", token: body.token } }
            retry: { max-retries: 3, initial: 1s, max-delay: 8s }
            routes:
              - { match: { method: [POST, PUT], path: "/upload/*" }, retry: { max-retries: 1 } }

            """)
        // Ranges for lists, repeats, other orders, a rule override that is the default, a
        // route's setting and anchors written out, comments. (An override `max-retries: 3`
        // would be a change: it applies over the route's `max-retries: 1` too.)
        try dir.write(
            "new.yaml",
            """
            policy: 1   # reviewed
            name: api
            classify: { code: body.status }
            x-limits: &limits { max-retries: 3, initial: 1s }
            rules:
              - { name: expired, when: { code: ["1401-1403", 1402] }, then: refresh }
              - name: transient
                when: { method: [PUT, GET], status: ["502-503", 504] }
                then: { do: retry, backoff: exponential }
            refresh: { with: { token: body.token, url: "https://auth.example.com/refresh" }, use: http }
            retry: { <<: *limits, max-delay: 8s }
            routes:
              - match: { path: "/upload/*", method: [PUT, POST] }
                retry: { max-retries: 1, initial: 1s }

            """)
        let result = try await runPolicy(["diff", "old.yaml", "new.yaml"], in: dir.url)
        expectResult(result, stdout: "no change in behaviour between 'old.yaml' and 'new.yaml'\n", status: 0)
    }

    @Test func codeRangeChangesAreReported() async throws {
        let dir = try TemporaryDirectory()
        let old = """
            policy: 1
            name: api
            classify: { code: body.status }
            rules:
              - { name: revoked, when: { code: [1403] }, then: logout }
              - { name: expired, when: { code: ["1400-1402", "1404-1499"] }, then: refresh }
            refresh: { use: http, with: { url: "https://auth.example.com/refresh", token: body.token } }

            """
        try dir.write("old.yaml", old)
        try dir.write("new.yaml", old.replacingOccurrences(of: "1404-1499", with: "1404-1449"))
        let result = try await runPolicy(["diff", "old.yaml", "new.yaml"], in: dir.url)
        let expected = """
            all other requests (top level):
              rule 'expired': when: code 1400-1402, 1404-1499 -> code 1400-1402, 1404-1449
              refreshes on: code 1400-1402, code 1404-1499 -> code 1400-1402, code 1404-1449
            2 changes in behaviour

            """
        expectResult(result, stdout: expected, status: 1)
    }

    /// The `policy diff` example in docs/commands.md is this run's real output.
    @Test func docsExampleIsRealOutput() async throws {
        let dir = try TemporaryDirectory()
        try dir.write("old.yaml", Self.base)
        try dir.write(
            "new.yaml",
            Self.base.replacingOccurrences(of: "max-retries: 3", with: "max-retries: 5")
                .replacingOccurrences(of: "code: [202]", with: "code: [202, \"2000-2099\"]")
                .replacingOccurrences(
                    of: "  - { name: transient, when: { status: [503] }, then: retry }",
                    with: "  - { name: transient, when: { status: [503] }, then: { do: retry, on-exhausted: fail } }\n"
                        + "  - { name: busy, when: { status: [429], method: [POST] }, then: fail }"))
        let result = try await runPolicy(["diff", "old.yaml", "new.yaml"], in: dir.url)
        #expect(result.status == 1)
        let docs = try String(
            contentsOf: repositoryRoot.appendingPathComponent("docs/commands.md"), encoding: .utf8)
        let start = try #require(docs.range(of: "$ policy diff old.yaml new.yaml\n"))
        let end = try #require(docs.range(of: "```", range: start.upperBound..<docs.endIndex))
        #expect(String(docs[start.upperBound..<end.lowerBound]) == result.stdout)
    }

    @Test func longTriggerListsShowWhatTheyGainAndLose() async throws {
        let dir = try TemporaryDirectory()
        let codes = (0..<20).map { "\(3000 + 2 * $0)" }.joined(separator: ", ")
        let old = """
            policy: 1
            name: api
            classify: { code: body.status }
            rules:
              - { name: revoked, when: { code: [\(codes)] }, then: logout }

            """
        try dir.write("old.yaml", old)
        try dir.write("new.yaml", old.replacingOccurrences(of: "[3000, ", with: "[9999, "))
        let result = try await runPolicy(["diff", "old.yaml", "new.yaml"], in: dir.url)
        #expect(result.status == 1)
        #expect(result.stdout.contains("  logs out on: + code 9999; - code 3000 (20 -> 20 items)\n"))
        let json = try await runPolicy(["diff", "--format", "json", "old.yaml", "new.yaml"], in: dir.url)
        #expect(json.stdout.contains(#""new":"code 3002, code 3004, "#))
    }

    @Test func invalidMissingAndUsage() async throws {
        let dir = try TemporaryDirectory()
        try dir.write("old.yaml", Self.base)
        try dir.write("bad.yaml", "policy: 1\nname: Bad\n")
        let invalid = try await runPolicy(["diff", "old.yaml", "bad.yaml"], in: dir.url)
        #expect(invalid.status == 65)
        #expect(invalid.stderr.contains("bad.yaml:2:7: error: "))
        let missing = try await runPolicy(["diff", "old.yaml", "nope.yaml"], in: dir.url)
        #expect(missing.status == 66)
        let usage = try await runPolicy(["diff", "old.yaml"], in: dir.url)
        #expect(usage.status == 64)
        #expect(usage.stderr.hasPrefix("Error: Missing expected argument 'NEW'\n"))
    }
}
