import Foundation
import ResponsePolicy
import Testing

@testable import PolicyCLI

/// `policy lint` end to end: the built binary, its stdout, stderr and exit code.
struct LintCommandTests {
    /// Five errors of different kinds, spread over the file: all must be reported, in file order.
    static let severalErrors = """
        policy: 1
        name: Bad_Name
        retyr: {}
        rules:
          - name: expired
            when: { code: [1401] }
            then: refresh
          - name: busy
            when: { status: [503] }
            then: retry
        retry:
          initial: 5
          max-delay: 8s
          attempt-timeout: 5s
        logout: { cooldown: 20s }

        """

    static let severalErrorsReport = [
        "bad.yaml:2:7: error: policy name 'Bad_Name' must use only lower-case letters, digits and '-' [invalid-name]",
        "bad.yaml:3:1: error: unknown key 'retyr'; did you mean 'retry'? [unknown-key]",
        "bad.yaml:6:20: error: rule 'expired' matches a business code, but 'classify' does not say where it is; "
            + "add 'classify: { code: body.status }' [code-without-classify]",
        "bad.yaml:7:11: error: rule 'expired' refreshes the token, but no refresh plugin is set; "
            + "add 'refresh: { use: oauth2, with: {...} }' or a host plugin [missing-refresh-plugin]",
        "bad.yaml:12:12: error: 'initial' needs a unit; a bare number could be seconds or milliseconds: "
            + "write 5s or 5ms [invalid-duration]",
    ]

    /// Two warnings and no error. The retry settings are explicit so the worst case fits the deadline.
    static let warningsOnly = """
        policy: 1
        name: warnings-only
        retry:
          max-retries: 2
          backoff: constant
          initial: 1s
          attempt-timeout: 5s
          deadline: 30s
          retry-after: ignore
          methods: [GET, POST]
        rules:
          - name: busy
            when: { status: [503] }
            then: retry
          - name: busy-again
            when: { status: [503] }
            then: retry

        """

    static let warningsOnlyReport = [
        "warn.yaml:10:12: warning: 'POST' in 'methods' retries requests that may already have been applied; "
            + "rely on an idempotency key instead [post-retried]",
        "warn.yaml:16:11: warning: rule 'busy-again' never matches: rule 'busy' comes first and matches "
            + "everything it does [shadowed-rule]",
        "warn.yaml:12:5: note: 'busy' is here",
    ]

    static let minimal = "policy: 1\nname: ok\n"

    static let hostPlugin = """
        policy: 1
        name: sso
        rules:
          - name: expired
            when: { status: [401], header: { WWW-Authenticate: '*invalid_token*' } }
            then: refresh
        refresh:
          use: my-sso
          with: { realm: staff }
        logout: { cooldown: 20s }

        """

    // MARK: - Text format and exit codes

    @Test func reportsEveryErrorSortedByPositionAndExitsOne() async throws {
        let directory = try TemporaryDirectory()
        try directory.write("bad.yaml", Self.severalErrors)
        let result = try await runPolicy(["lint", "bad.yaml"], in: directory.url)
        expectResult(
            result,
            stdout: (Self.severalErrorsReport + ["1 file checked: 5 errors, 0 warnings"]).joined(separator: "\n")
                + "\n",
            status: 1)
        let positions = result.stdoutLines.dropLast().compactMap { line -> [Int]? in
            let fields = line.split(separator: ":").dropFirst().prefix(2).compactMap { Int($0) }
            return fields.count == 2 ? fields : nil
        }
        #expect(positions.count == 5)
        #expect(positions == positions.sorted { $0.lexicographicallyPrecedes($1) })
    }

    @Test func warningsAloneExitZero() async throws {
        let directory = try TemporaryDirectory()
        try directory.write("warn.yaml", Self.warningsOnly)
        let result = try await runPolicy(["lint", "warn.yaml"], in: directory.url)
        expectResult(
            result,
            stdout: (Self.warningsOnlyReport + ["1 file checked: 0 errors, 2 warnings"]).joined(separator: "\n") + "\n",
            status: 0)
    }

    @Test func strictTurnsWarningsIntoExitOne() async throws {
        let directory = try TemporaryDirectory()
        try directory.write("warn.yaml", Self.warningsOnly)
        let result = try await runPolicy(["lint", "--strict", "warn.yaml"], in: directory.url)
        // The summary says why the exit status is 1 with no error.
        expectResult(
            result,
            stdout: (Self.warningsOnlyReport + ["1 file checked: 0 errors, 2 warnings (--strict: warnings fail)"])
                .joined(separator: "\n") + "\n",
            status: 1)
    }

    @Test func strictOnACleanFileExitsZero() async throws {
        let directory = try TemporaryDirectory()
        try directory.write("ok.yaml", Self.minimal)
        let result = try await runPolicy(["lint", "--strict", "ok.yaml"], in: directory.url)
        expectResult(result, stdout: "1 file checked: 0 errors, 0 warnings\n", status: 0)
    }

    @Test func severalFilesAreReportedInArgumentOrderWithOneSummary() async throws {
        let directory = try TemporaryDirectory()
        try directory.write("bad.yaml", Self.severalErrors)
        try directory.write("warn.yaml", Self.warningsOnly)
        let result = try await runPolicy(["lint", "warn.yaml", "bad.yaml"], in: directory.url)
        let lines = Self.warningsOnlyReport + Self.severalErrorsReport + ["2 files checked: 5 errors, 2 warnings"]
        expectResult(result, stdout: lines.joined(separator: "\n") + "\n", status: 1)
    }

    // MARK: - Folders and unreadable paths

    @Test func folderIsSearchedRecursivelyForYamlAndYmlOnly() async throws {
        let directory = try TemporaryDirectory()
        try directory.write("tree/a.yaml", Self.minimal)
        try directory.write("tree/sub/b.yml", Self.warningsOnly)
        try directory.write("tree/sub/deeper/c.yaml", "")
        try directory.write("tree/readme.txt", "not: [a policy")
        try directory.write("tree/sub/notes.json", "{ broken")
        try directory.write("tree/sub/policy.yaml.bak", "also: [not read")
        try directory.makeFolder("tree/folder.yaml")
        let result = try await runPolicy(["lint", "tree"], in: directory.url)
        let lines = [
            "tree/sub/b.yml:10:12: warning: 'POST' in 'methods' retries requests that may already have been applied; "
                + "rely on an idempotency key instead [post-retried]",
            "tree/sub/b.yml:16:11: warning: rule 'busy-again' never matches: rule 'busy' comes first and matches "
                + "everything it does [shadowed-rule]",
            "tree/sub/b.yml:12:5: note: 'busy' is here",
            "tree/sub/deeper/c.yaml:1:1: error: the file is empty; a policy needs at least 'policy: 1' and 'name:' "
                + "[empty-file]",
            "3 files checked: 1 error, 2 warnings",
        ]
        expectResult(result, stdout: lines.joined(separator: "\n") + "\n", status: 1)
    }

    /// The summary once said `0 errors` beside exit 66 while JSON said `"errors":1`: a path that
    /// cannot be read is an error in every format's count.
    @Test func missingPathExits66WithAMessageOnStderr() async throws {
        let directory = try TemporaryDirectory()
        let result = try await runPolicy(["lint", "missing.yaml"], in: directory.url)
        expectResult(
            result,
            stdout: "0 files checked: 1 error, 0 warnings\n",
            stderr: "error: cannot read 'missing.yaml': no such file or directory\n",
            status: 66)
    }

    @Test func missingPathBesideAGoodFileStillExits66() async throws {
        let directory = try TemporaryDirectory()
        try directory.write("ok.yaml", Self.minimal)
        let result = try await runPolicy(["lint", "ok.yaml", "missing.yaml"], in: directory.url)
        expectResult(
            result,
            stdout: "1 file checked: 1 error, 0 warnings\n",
            stderr: "error: cannot read 'missing.yaml': no such file or directory\n",
            status: 66)
    }

    @Test func folderWithoutYamlExits66() async throws {
        let directory = try TemporaryDirectory()
        try directory.write("empty/readme.md", "# nothing to lint\n")
        let result = try await runPolicy(["lint", "empty"], in: directory.url)
        expectResult(
            result,
            stdout: "0 files checked: 1 error, 0 warnings\n",
            stderr: "error: cannot read 'empty': no *.yaml or *.yml files in the folder\n",
            status: 66)
    }

    /// A CI step pointed at a folder of Kubernetes manifests once printed `0 files checked` and
    /// passed (exit 0) where an empty folder exits 66: a path that yields no policy exits 66,
    /// whatever it holds, in every format.
    @Test(arguments: ["text", "json", "github", "sarif"])
    func aFolderOfOnlyOtherYAMLExits66(_ format: String) async throws {
        let directory = try TemporaryDirectory()
        try directory.write("k8s/pod.yaml", "apiVersion: v1\nkind: Pod\n")
        try directory.write("k8s/ci/workflow.yml", "on: [push]\njobs: {}\n")
        let result = try await runPolicy(["lint", "--format", format, "k8s"], in: directory.url)
        #expect(result.status == 66)
        let reason = "no policy, simulation script or plugin schema in the folder: its 2 YAML files are not a policy"
        switch format {
        case "text":
            expectResult(
                result, stdout: "0 files checked: 1 error, 0 warnings\n",
                stderr:
                    "note: skipped 'k8s/ci/workflow.yml': not a policy (no 'policy:' key); use --exclude to silence this\n"
                    + "note: skipped 'k8s/pod.yaml': not a policy (no 'policy:' key); use --exclude to silence this\n"
                    + "error: cannot read 'k8s': \(reason)\n",
                status: 66)
        case "json":
            let object = try #require(
                try JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [String: Any])
            #expect(object["files"] as? Int == 0 && object["errors"] as? Int == 1)
            let first = try #require((object["diagnostics"] as? [[String: Any]])?.first)
            #expect(
                first["file"] as? String == "k8s" && first["message"] as? String == "cannot read the file: \(reason)")
        case "github":
            #expect(
                result.stdoutLines == [
                    "::error file=k8s,title=policy lint [unreadable-file]::cannot read the file: \(reason)",
                    "0 files checked: 1 error, 0 warnings",
                ])
        default:
            #expect(result.stdout.contains(#""ruleId":"unreadable-file""#))
        }
    }

    /// One policy among the manifests is enough: the folder checked something.
    @Test func aFolderWithOnePolicyAmongOtherYAMLPasses() async throws {
        let directory = try TemporaryDirectory()
        try directory.write("deploy/pod.yaml", "apiVersion: v1\nkind: Pod\n")
        try directory.write("deploy/policy.yaml", Self.minimal)
        let result = try await runPolicy(["lint", "deploy"], in: directory.url)
        #expect(result.status == 0)
        #expect(result.stdout == "1 file checked: 0 errors, 0 warnings\n")
    }

    /// The GitHub format printed `::error` for a missing path and then `0 errors`.
    @Test func aMissingPathIsCountedInTheGitHubSummary() async throws {
        let directory = try TemporaryDirectory()
        let result = try await runPolicy(["lint", "--format", "github", "nope.yaml"], in: directory.url)
        expectResult(
            result,
            stdout: "::error file=nope.yaml,title=policy lint [unreadable-file]::cannot read the file: no such file or "
                + "directory\n0 files checked: 1 error, 0 warnings\n",
            status: 66)
    }

    /// Colour follows `--color`, and `NO_COLOR` on a terminal (https://no-color.org): the
    /// severity is coloured only when wanted. Run in-process to play a terminal.
    @Test(arguments: [
        (false, false, "auto", false), (true, false, "auto", true), (true, true, "auto", false),
        (false, false, "always", true), (true, true, "always", true), (true, false, "never", false),
    ])
    func colourFollowsColorAndNoColor(_ terminal: Bool, _ noColor: Bool, _ choice: String, _ coloured: Bool)
        async throws
    {
        let directory = try TemporaryDirectory()
        let file = try directory.write("warn.yaml", Self.warningsOnly)
        let result = await runInProcess(
            ["lint", "--color", choice, file.path], isTerminal: terminal, noColor: noColor)
        #expect(result.status == 0)
        #expect(result.stdout.contains("\u{1B}[1;33mwarning\u{1B}[0m") == coloured, "\(result.stdout)")
        #expect(result.stdout.contains(": warning: ") == !coloured)
    }

    @Test func colorTakesOnlyAutoAlwaysOrNever() async throws {
        let result = try await runPolicy(["lint", "--color", "yes", "policies/default.yaml"])
        expectResult(
            result, stdout: "",
            stderr: usageError(
                "Unknown color 'yes'; use auto, always or never", usage: lintUsage, help: "policy lint --help"),
            status: 64)
    }

    // MARK: - Usage errors

    @Test func unknownOptionExits64WithUsageOnStderr() async throws {
        let result = try await runPolicy(["lint", "--foo", "policies"])
        expectResult(
            result, stdout: "",
            stderr: "Error: Unknown option '--foo'\nUsage: \(lintUsage)\n"
                + "  See 'policy lint --help' for more information.\n",
            status: 64)
    }

    struct UsageCase: Sendable, CustomTestStringConvertible {
        var name: String
        var arguments: [String]
        var message: String
        var testDescription: String { name }
    }

    static let usageCases: [UsageCase] = [
        .init(
            name: "format xml", arguments: ["lint", "--format", "xml", "policies"],
            message: "Unknown format 'xml'; use text, json, sarif or github"),
        .init(
            name: "plugin without kind", arguments: ["lint", "--plugin", "bad", "policies"],
            message: "Invalid plugin 'bad'; write KIND:NAME, like refresh:my-sso"),
        .init(
            name: "plugin of an unknown kind", arguments: ["lint", "--plugin", "foo:bar", "policies"],
            message:
                "Unknown plugin kind 'foo'; use one of refresh, authorize, logout, extract, observe, store, coordination"
        ),
        .init(name: "no path", arguments: ["lint"], message: "Missing expected argument 'PATH'"),
        .init(
            name: "value for a flag", arguments: ["lint", "--strict=yes", "policies"],
            message: "The option '--strict' does not take a value"),
        .init(
            name: "format twice", arguments: ["lint", "--format", "json", "--format", "text", "policies"],
            message: "The option '--format' was given more than once"),
        .init(
            name: "format without value", arguments: ["lint", "policies", "--format"],
            message: "Missing value for '--format <format>'"),
    ]

    @Test(arguments: usageCases)
    func usageErrorsExit64(_ usage: UsageCase) async throws {
        let result = try await runPolicy(usage.arguments)
        expectResult(
            result, stdout: "", stderr: usageError(usage.message, usage: lintUsage, help: "policy lint --help"),
            status: 64)
    }

    // MARK: - Plugins

    @Test func unknownPluginIsAnErrorUntilDeclared() async throws {
        let directory = try TemporaryDirectory()
        try directory.write("sso.yaml", Self.hostPlugin)
        let undeclared = try await runPolicy(["lint", "sso.yaml"], in: directory.url)
        expectResult(
            undeclared,
            stdout: "sso.yaml:8:8: error: unknown refresh plugin 'my-sso' (known: exec, http, oauth2; "
                + "declare a host plugin with --plugin refresh:my-sso) [unknown-plugin]\n1 file checked: 1 error, 0 warnings\n",
            status: 1)
        let declared = try await runPolicy(["lint", "--plugin", "refresh:my-sso", "sso.yaml"], in: directory.url)
        expectResult(declared, stdout: "1 file checked: 0 errors, 0 warnings\n", status: 0)
        let inline = try await runPolicy(
            ["lint", "--plugin=refresh:my-sso", "--strict", "sso.yaml"], in: directory.url)
        expectResult(inline, stdout: "1 file checked: 0 errors, 0 warnings\n", status: 0)
    }

    @Test func pluginOfAnotherKindDoesNotCount() async throws {
        let directory = try TemporaryDirectory()
        try directory.write("sso.yaml", Self.hostPlugin)
        let result = try await runPolicy(["lint", "--plugin", "logout:my-sso", "sso.yaml"], in: directory.url)
        #expect(result.status == 1)
        #expect(result.stdoutLines.first?.hasSuffix("[unknown-plugin]") == true)
    }

    // MARK: - JSON

    @Test func jsonHasTheDocumentedStructure() async throws {
        let directory = try TemporaryDirectory()
        try directory.write("bad.yaml", Self.severalErrors)
        try directory.write("warn.yaml", Self.warningsOnly)
        let result = try await runPolicy(["lint", "--format", "json", "bad.yaml", "warn.yaml"], in: directory.url)
        #expect(result.status == 1)
        #expect(result.stderr == "")
        #expect(result.stdout.hasSuffix("}\n"))
        #expect(result.stdoutLines.count == 1)

        let object = try #require(
            try JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [String: Any])
        #expect(Set(object.keys) == ["files", "errors", "warnings", "diagnostics"])
        #expect(object["files"] as? Int == 2)
        #expect(object["errors"] as? Int == 5)
        #expect(object["warnings"] as? Int == 2)
        let diagnostics = try #require(object["diagnostics"] as? [[String: Any]])
        #expect(diagnostics.count == 7)
        for diagnostic in diagnostics {
            #expect(
                Set(diagnostic.keys) == [
                    "file", "line", "column", "endLine", "endColumn", "severity", "rule", "message", "doc", "related",
                ])
        }
        let first = try #require(diagnostics.first)
        #expect(first["file"] as? String == "bad.yaml")
        #expect(first["line"] as? Int == 2)
        #expect(first["column"] as? Int == 7)
        #expect(first["severity"] as? String == "error")
        #expect(first["rule"] as? String == "invalid-name")
        #expect(
            first["message"] as? String == "policy name 'Bad_Name' must use only lower-case letters, digits and '-'")

        // The same findings as the text format, notes aside.
        let asText = diagnostics.map { d in
            let file = d["file"] as? String ?? "?"
            let line = d["line"] as? Int ?? 0
            let column = d["column"] as? Int ?? 0
            let severity = d["severity"] as? String ?? "?"
            let message = d["message"] as? String ?? "?"
            let rule = d["rule"] as? String ?? "?"
            return "\(file):\(line):\(column): \(severity): \(message) [\(rule)]"
        }
        let warningLines = Self.warningsOnlyReport.filter { !$0.contains(": note: ") }
        #expect(asText == Self.severalErrorsReport + warningLines)
    }

    @Test func jsonOfACleanFile() async throws {
        let directory = try TemporaryDirectory()
        try directory.write("ok.yaml", Self.minimal)
        let result = try await runPolicy(["lint", "--format=json", "ok.yaml"], in: directory.url)
        expectResult(result, stdout: #"{"files":1,"errors":0,"warnings":0,"diagnostics":[]}"# + "\n", status: 0)
    }

    @Test func jsonReportsAnUnreadablePathAsADiagnostic() async throws {
        let directory = try TemporaryDirectory()
        try directory.write("ok.yaml", Self.minimal)
        let result = try await runPolicy(["lint", "--format", "json", "missing.yaml", "ok.yaml"], in: directory.url)
        #expect(result.status == 66)
        #expect(result.stderr == "")
        let object = try #require(
            try JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [String: Any])
        #expect(object["files"] as? Int == 1)
        #expect(object["errors"] as? Int == 1)
        #expect(object["warnings"] as? Int == 0)
        let diagnostics = try #require(object["diagnostics"] as? [[String: Any]])
        #expect(diagnostics.count == 1)
        #expect(diagnostics.first?["file"] as? String == "missing.yaml")
        #expect(diagnostics.first?["rule"] as? String == "unreadable-file")
        #expect(diagnostics.first?["severity"] as? String == "error")
    }

    // MARK: - Hostile input

    struct HostileCase: Sendable, CustomTestStringConvertible {
        var name: String
        var bytes: [UInt8]
        /// The one diagnostic line expected for `hostile.yaml`.
        var line: String
        var testDescription: String { name }
    }

    static let hostileCases: [HostileCase] = [
        .init(
            name: "NUL byte", bytes: Array("policy: 1\nname: a\u{0}b\n".utf8),
            line: "hostile.yaml:2:8: error: the file contains a NUL byte; policy files are text [yaml-syntax]"),
        .init(
            name: "invalid UTF-8", bytes: Array("policy: 1\nname: ".utf8) + [0xFF, 0xFE, 0x0A],
            line: "hostile.yaml:2:7: error: the file is not valid UTF-8 (invalid leading UTF-8 octet) [yaml-syntax]"),
        .init(
            name: "billion laughs", bytes: Array(billionLaughs.utf8),
            line: "hostile.yaml:9:16: error: the document expands to more than 2000000 nodes "
                + "(aliases count what they repeat) [too-many-nodes]"),
        .init(
            name: "10,000-deep nesting",
            bytes: Array(
                ("policy: 1\nname: x\nx-deep: " + String(repeating: "[", count: 10_000)
                    + String(repeating: "]", count: 10_000) + "\n").utf8),
            line: "hostile.yaml:3:72: error: nesting deeper than 64 levels; policy files are shallow [nesting-too-deep]"
        ),
        .init(
            name: "tab indent", bytes: Array("policy: 1\nname: x\nretry:\n\tmax-retries: 3\n".utf8),
            line: "hostile.yaml:4:1: error: a tab indents this line; YAML indents with spaces only: replace the tab "
                + "with spaces [yaml-syntax]"),
        .init(
            name: "binary garbage", bytes: (0..<4096).map { UInt8(truncatingIfNeeded: $0 * 7919 + 13) },
            line: "hostile.yaml:1:2: error: the file is not valid UTF-8 (invalid leading UTF-8 octet) [yaml-syntax]"),
        .init(
            name: "empty file", bytes: [],
            line: "hostile.yaml:1:1: error: the file is empty; a policy needs at least 'policy: 1' and 'name:' "
                + "[empty-file]"),
    ]

    /// Ten levels of nine aliases each: 9^10 nodes if expanded. Anchors live under `x-` keys.
    static var billionLaughs: String {
        var lines = ["policy: 1", "name: x", #"x-a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]"#]
        let letters = Array("abcdefghij")
        for index in 1..<letters.count {
            let aliases = Array(repeating: "*\(letters[index - 1])", count: 9).joined(separator: ",")
            lines.append("x-\(letters[index]): &\(letters[index]) [\(aliases)]")
        }
        return lines.joined(separator: "\n") + "\n"
    }

    @Test(arguments: hostileCases)
    func hostileFileGivesOnePositionedErrorAndExitsOne(_ hostile: HostileCase) async throws {
        let directory = try TemporaryDirectory()
        try directory.write("hostile.yaml", bytes: Data(hostile.bytes))
        let result = try await runPolicy(["lint", "hostile.yaml"], in: directory.url)
        expectResult(result, stdout: hostile.line + "\n1 file checked: 1 error, 0 warnings\n", status: 1)
    }

    /// Long flat collections under an ignored `x-` key: valid, small files (200-600 KB, far
    /// inside ``YAMLLimits``) that must lint clean. The YAML tree builder once copied a
    /// collection on every append and scanned every earlier key for a duplicate, so these hung;
    /// both are linear now (0.1-0.2 s of CPU each in a debug build), and a regression shows here
    /// as the run's timeout.
    @Test(
        arguments: [
            ("list", "x-list: [" + Array(repeating: "1", count: 100_000).joined(separator: ",") + "]"),
            ("mapping", "x-map: {" + (0..<50_000).map { "k\($0): 1" }.joined(separator: ",") + "}"),
        ])
    func longCollectionsLintWithoutHanging(_ kind: String, _ line: String) async throws {
        let directory = try TemporaryDirectory()
        try directory.write("long.yaml", "policy: 1\nname: long-\(kind)\n" + line + "\n")
        let result = try await runPolicy(["lint", "long.yaml"], in: directory.url)
        expectResult(result, stdout: "1 file checked: 0 errors, 0 warnings\n", status: 0)
    }

    @Test(arguments: hostileCases)
    func hostileFileIsRefusedByGraphAndExplain(_ hostile: HostileCase) async throws {
        let directory = try TemporaryDirectory()
        try directory.write("hostile.yaml", bytes: Data(hostile.bytes))
        for command in ["graph", "explain"] {
            let result = try await runPolicy([command, "hostile.yaml"], in: directory.url)
            expectResult(
                result, stdout: "",
                stderr: hostile.line
                    + "\nerror: 'hostile.yaml' has 1 error; run 'policy lint hostile.yaml' for details\n",
                status: 1)
        }
    }
}
