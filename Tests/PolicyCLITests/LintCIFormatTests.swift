import Foundation
import ResponsePolicy
import TestSupport
import Testing

@testable import PolicyCLI

/// Lint in CI: SARIF, GitHub annotations, richer JSON, suppressions, stdin, `--exclude`, files
/// that are not policies.
/// Serialized: each test runs the binary, and a burst of parallel processes on a 2-core CI machine
/// starves the real-time-sensitive scheduler suites.
@Suite(.serialized)
struct LintCIFormatTests {
    /// A shadowed rule (with its "first listed here" note) and an unbounded backoff.
    static let policy = """
        policy: 1
        name: t
        rules:
          - { name: busy, when: { status: [503] }, then: retry }
          - { name: busy-again, when: { status: [503] }, then: retry }
        retry:
          backoff: exponential
          max-delay: none
          retry-after: ignore

        """

    static func json(_ text: String) throws -> [String: Any] {
        try #require(try JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any])
    }

    @Test func jsonCarriesEndsDocumentationAndRelatedLocations() async throws {
        let dir = try TemporaryDirectory()
        try dir.write("p.yaml", Self.policy)
        let result = try await runPolicy(["lint", "--format", "json", "p.yaml"], in: dir.url)
        #expect(result.status == 0)
        let diagnostics = try #require(try Self.json(result.stdout)["diagnostics"] as? [[String: Any]])
        let shadowed = try #require(diagnostics.first { $0["rule"] as? String == "shadowed-rule" })
        #expect(shadowed["line"] as? Int == 5)
        #expect(shadowed["doc"] as? String == lintRuleDoc("shadowed-rule"))
        let related = try #require(shadowed["related"] as? [[String: Any]])
        #expect(related.count == 1)
        #expect(related.first?["line"] as? Int == 4)
        #expect(related.first?["message"] as? String == "'busy' is here")
        let backoff = try #require(diagnostics.first { $0["rule"] as? String == "unbounded-backoff" })
        #expect(backoff["line"] as? Int == 8 && backoff["column"] as? Int == 14)
        #expect(backoff["endLine"] as? Int == 8 && backoff["endColumn"] as? Int == 18)
    }

    @Test func sarifHasOneResultPerFindingWithRegionAndHelp() async throws {
        let dir = try TemporaryDirectory()
        try dir.write("p.yaml", Self.policy)
        let result = try await runPolicy(["lint", "--format", "sarif", "p.yaml", "missing.yaml"], in: dir.url)
        #expect(result.status == 66)
        let sarif = try Self.json(result.stdout)
        #expect(sarif["version"] as? String == "2.1.0")
        let run = try #require((sarif["runs"] as? [[String: Any]])?.first)
        let driver = try #require((run["tool"] as? [String: Any])?["driver"] as? [String: Any])
        let rules = try #require(driver["rules"] as? [[String: Any]])
        let ids = rules.compactMap { $0["id"] as? String }
        #expect(ids.contains("unreadable-file") && ids.contains("shadowed-rule") && ids.contains("unused-suppression"))
        for rule in rules {
            #expect((rule["help"] as? [String: Any])?["text"] as? String != nil)
        }
        let results = try #require(run["results"] as? [[String: Any]])
        #expect(results.map { $0["ruleId"] as? String } == ["unreadable-file", "shadowed-rule", "unbounded-backoff"])
        let backoff = results[2]
        #expect(backoff["level"] as? String == "warning")
        #expect(ids[try #require(backoff["ruleIndex"] as? Int)] == "unbounded-backoff")
        let location = try #require((backoff["locations"] as? [[String: Any]])?.first)
        let physical = try #require(location["physicalLocation"] as? [String: Any])
        #expect((physical["artifactLocation"] as? [String: Any])?["uri"] as? String == "p.yaml")
        let region = try #require(physical["region"] as? [String: Any])
        #expect(region["startLine"] as? Int == 8 && region["startColumn"] as? Int == 14)
        #expect(region["endLine"] as? Int == 8 && region["endColumn"] as? Int == 18)
        let related = try #require(results[1]["relatedLocations"] as? [[String: Any]])
        #expect((related.first?["message"] as? [String: Any])?["text"] as? String == "'busy' is here")
    }

    @Test func githubPrintsOneWorkflowCommandPerFinding() async throws {
        let dir = try TemporaryDirectory()
        try dir.write("p.yaml", Self.policy)
        let result = try await runPolicy(["lint", "--format", "github", "p.yaml"], in: dir.url)
        let lines = result.stdoutLines
        #expect(
            lines[1]
                == "::warning file=p.yaml,line=8,col=14,endLine=8,endColumn=18,title=policy lint [unbounded-backoff]::"
                + "exponential backoff has no 'max-delay', so waits double without limit; add 'max-delay: 30s'"
                + "%0Asee \(lintRuleDoc("unbounded-backoff"))")
        #expect(lines.count == 3)
        #expect(lines[0].hasPrefix("::warning file=p.yaml,line=5,col=31,"))
        #expect(lines[0].contains("%0Anote: line 4, column 5: 'busy' is here%0A"))
        #expect(lines[2] == "1 file checked: 0 errors, 2 warnings")
        // Property values escape ':' and ','.
        #expect(LintCommand.Report.property("a:b,c%") == "a%3Ab%2Cc%25")
    }

    @Test func suppressionsOnOrAboveALineAreCountedAndUnusedOnesReported() async throws {
        let dir = try TemporaryDirectory()
        try dir.write(
            "p.yaml",
            """
            policy: 1
            name: t
            rules:
              - { name: busy, when: { status: [503] }, then: retry }
              # policy-lint: disable=shadowed-rule kept while clients migrate

              - { name: busy-again, when: { status: [503] }, then: retry }
            retry:
              backoff: exponential
              max-delay: none  # policy-lint: disable=unbounded-backoff the deadline bounds it
              methods: [GET]  # policy-lint: disable=post-retried,unknwn-rule
              initial: 1s  # policy-lint: disable=conflicting-codes errors are not suppressible
              retry-after: ignore

            """)
        let result = try await runPolicy(["lint", "--strict", "p.yaml"], in: dir.url)
        let expected = """
            p.yaml:11:42: warning: the suppression of 'post-retried' is unused: line 11 has no such finding [unused-suppression]
            p.yaml:11:55: warning: the suppression names an unknown rule 'unknwn-rule' [unused-suppression]
            p.yaml:12:39: warning: 'conflicting-codes' is an error and cannot be suppressed; fix the policy instead [unused-suppression]
            1 file checked: 0 errors, 3 warnings, 2 suppressed (--strict: warnings fail)

            """
        expectResult(result, stdout: expected, status: 1)
    }

    @Test func errorsStayWhenSuppressedAndDisableRefusesErrorRules() async throws {
        let dir = try TemporaryDirectory()
        try dir.write(
            "p.yaml",
            "policy: 1\nname: t\nretry: { max-retries: -1 }  # policy-lint: disable=invalid-value nope\n")
        let result = try await runPolicy(["lint", "p.yaml"], in: dir.url)
        #expect(result.status == 1)
        #expect(result.stdoutLines.contains { $0.contains("[invalid-value]") && $0.contains(": error: ") })
        #expect(
            result.stdoutLines.contains {
                $0.hasSuffix(
                    "'invalid-value' is an error and cannot be suppressed; fix the policy instead [unused-suppression]")
            })
        let disable = try await runPolicy(["lint", "--disable", "invalid-value", "p.yaml"], in: dir.url)
        expectResult(
            disable, stdout: "",
            stderr: usageError(
                "Cannot disable 'invalid-value': errors cannot be suppressed", usage: lintUsage,
                help: "policy lint --help"), status: 64)
    }

    @Test func disableSuppressesAWarningRuleEverywhere() async throws {
        let dir = try TemporaryDirectory()
        try dir.write("p.yaml", Self.policy)
        let result = try await runPolicy(
            ["lint", "--strict", "--disable", "shadowed-rule", "--disable", "unbounded-backoff", "p.yaml"], in: dir.url)
        expectResult(result, stdout: "1 file checked: 0 errors, 0 warnings, 2 suppressed\n", status: 0)
        let json = try await runPolicy(
            ["lint", "--format", "json", "--disable", "shadowed-rule", "p.yaml"], in: dir.url)
        #expect(try Self.json(json.stdout)["suppressed"] as? Int == 1)
    }

    @Test func dashReadsStandardInput() async throws {
        let dir = try TemporaryDirectory()
        let input = try dir.write("in.yaml", Self.policy)
        let result = try await runPolicyWithInput(["lint", "-"], input: input, in: dir.url)
        #expect(result.status == 0)
        #expect(result.stdoutLines.first?.hasPrefix("<stdin>:5:31: warning: ") == true)
        #expect(result.stdoutLines.last == "1 file checked: 0 errors, 2 warnings")
    }

    @Test func folderSearchSkipsNonPoliciesWithANoteAndHonoursExclude() async throws {
        let dir = try TemporaryDirectory()
        try dir.write("conf/policy.yaml", "policy: 1\nname: ok\n")
        try dir.write("conf/deploy.yaml", "apiVersion: apps/v1\nkind: Deployment\n")
        try dir.write("conf/vendor/x.yaml", "policy: 1\nname: Bad\n")
        try dir.write("conf/k8s.yaml", "apiVersion: v1\nkind: A\n---\napiVersion: v1\nkind: B\n")
        try dir.write("conf/play.yml", "- hosts: all\n  tasks: []\n")
        let searched = try await runPolicy(["lint", "conf"], in: dir.url)
        expectResult(
            searched,
            stdout: "conf/vendor/x.yaml:2:7: error: policy name 'Bad' must use only lower-case letters, "
                + "digits and '-' [invalid-name]\n2 files checked: 1 error, 0 warnings\n",
            stderr: ["conf/deploy.yaml", "conf/k8s.yaml", "conf/play.yml"].map {
                "note: skipped '\($0)': not a policy (no 'policy:' key); use --exclude to silence this\n"
            }.joined(),
            status: 1)
        let excluded = try await runPolicy(
            [
                "lint", "--exclude", "vendor", "--exclude", "deploy.*", "--exclude", "k8s*", "--exclude", "*.yml",
                "conf",
            ],
            in: dir.url)
        expectResult(excluded, stdout: "1 file checked: 0 errors, 0 warnings\n", status: 0)
        let named = try await runPolicy(["lint", "conf/deploy.yaml"], in: dir.url)
        expectResult(
            named,
            stdout: "conf/deploy.yaml:1:1: error: this is not a policy file: it has no 'policy:' key and no policy "
                + "section (it has 'apiVersion', 'kind') [not-a-policy]\n1 file checked: 1 error, 0 warnings\n",
            status: 1)
        // A broken policy is still a policy: it gets the usual findings, not 'not-a-policy'.
        try dir.write("typo.yaml", "name: t\nrules: []\n")
        let typo = try await runPolicy(["lint", "typo.yaml"], in: dir.url)
        #expect(typo.stdout.contains("[missing-key]"))
    }

    @Test func helpListsExitCodes() async throws {
        let result = try await runPolicy(["lint", "--help"])
        #expect(result.stdout.contains("EXIT CODES:\n  0 "))
        #expect(result.stdout.contains("  66 "))
    }

    @Test func everyRuleThatCanAppearIsInTheReference() {
        let reference = LintCommand.ruleReference()
        for id in ["unreadable-file", "not-a-policy", "unused-suppression", "missing-file", "duplicate-id"] {
            #expect(reference.contains("\n## \(id)\n"), "\(id) is missing from --list-rules")
        }
    }

    /// The file-level checks' examples, run through `policy lint` since they need a file.
    @Test(arguments: FileChecks.descriptions.map(\.id))
    func fileCheckExamplesBehaveAsDocumented(_ id: String) async throws {
        let rule = try #require(FileChecks.descriptions.first { $0.id == id })
        for example in rule.triggering {
            let dir = try TemporaryDirectory()
            try dir.write("example.yaml", example)
            let result = try await runPolicy(["lint", "example.yaml"], in: dir.url)
            #expect(result.stdout.contains("[\(id)]"), "\(example)")
        }
        for example in rule.nonTriggering {
            let dir = try TemporaryDirectory()
            try dir.write("example.yaml", example)
            let result = try await runPolicy(["lint", "example.yaml"], in: dir.url)
            #expect(!result.stdout.contains("[\(id)]"), "\(example)")
        }
    }
}

/// ``runPolicy(_:in:timeout:)`` with a file as standard input.
func runPolicyWithInput(_ arguments: [String], input: URL, in directory: URL) async throws -> CLIResult {
    try await offPool { try runPolicyWithInputBlocking(arguments, input: input, in: directory) }
}

private func runPolicyWithInputBlocking(_ arguments: [String], input: URL, in directory: URL) throws -> CLIResult {
    let process = Process()
    process.executableURL = try policyBinary.get()
    process.arguments = arguments
    process.currentDirectoryURL = directory
    let stdout = Pipe()
    let stderr = Pipe()
    process.standardOutput = stdout
    process.standardError = stderr
    process.standardInput = try FileHandle(forReadingFrom: input)
    try process.run()
    let out = stdout.fileHandleForReading.readDataToEndOfFile()
    let err = stderr.fileHandleForReading.readDataToEndOfFile()
    process.waitUntilExit()
    return CLIResult(
        stdout: String(decoding: out, as: UTF8.self), stderr: String(decoding: err, as: UTF8.self),
        status: process.terminationStatus)
}

/// Every rule id the sources can report is in `--list-rules` (and so in docs/lint-rules.md and
/// SARIF's rule list).
struct EmittedRuleIdTests {
    @Test func everyEmittedRuleIdIsDocumented() async throws {
        let pattern = try NSRegularExpression(pattern: #"\.(?:error|warning)\(\s*"([a-z]+(?:-[a-z]+)*)""#)
        let known = Set(LintCommand.knownRules.keys)
        let sources = repositoryRoot.appendingPathComponent("Sources")
        let enumerator = try #require(FileManager.default.enumerator(atPath: sources.path))
        var found = Set<String>()
        while let entry = enumerator.nextObject() as? String {
            guard entry.hasSuffix(".swift"), !entry.hasPrefix("policy-bench"), !entry.hasPrefix("policy-fuzz") else {
                continue
            }
            let text = try String(contentsOf: sources.appendingPathComponent(entry), encoding: .utf8)
            let range = NSRange(text.startIndex..., in: text)
            for match in pattern.matches(in: text, range: range) {
                if let id = Range(match.range(at: 1), in: text) { found.insert(String(text[id])) }
            }
        }
        #expect(found.count > 20)
        #expect(found.subtracting(known).sorted() == [], "rule ids reported but not described")
    }
}
