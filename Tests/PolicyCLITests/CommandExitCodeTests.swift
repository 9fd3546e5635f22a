import Foundation
import Testing

@testable import PolicyCLI

/// What scripts rely on: every exit status a command returns is listed in its `--help` (and so in
/// docs/commands.md's generated table), and every command words a missing file the same way.
///
/// `policy fetch` returned 73 for an unwritable credentials folder while its help listed only
/// 0/1/64/65/66 (FetchCredentialSafetyTests checks 73 against the help where it makes it); lint,
/// graph, explain and fetch said "no such file" where lint and test said "no such file or
/// directory". Serialized: each case runs the binary.
@Suite(.serialized)
struct CommandExitCodeTests {
    static let good = """
        policy: 1
        name: good
        rules: [{ name: transient, when: { status: [503] }, then: retry }]
        retry: { max-retries: 2, max-delay: 4s }

        """
    static let other = good.replacingOccurrences(of: "max-retries: 2", with: "max-retries: 3")
    static let warned = good.replacingOccurrences(of: "max-delay: 4s", with: "max-delay: none")
    static let bad = "policy: 1\nname: bad\nretyr: {}\n"
    static let script = """
        policy: good.yaml
        requests:
          - { id: a, at: 0s, responses: [{ status: 503 }, { status: 200 }], expect: delivered }

        """
    static let failingScript = script.replacingOccurrences(of: "expect: delivered", with: "expect: failed")
    /// One request answered 503 three times: `good.yaml` retries it twice, `other.yaml` three times.
    static let recording = """
        {"log": {"entries": [
          {"startedDateTime": "2026-01-01T00:00:00Z", "time": 5, "request": {"method": "GET", "url": "https://a.example/x"}, "response": {"status": 503}},
          {"startedDateTime": "2026-01-01T00:00:01Z", "time": 5, "request": {"method": "GET", "url": "https://a.example/x"}, "response": {"status": 503}},
          {"startedDateTime": "2026-01-01T00:00:03Z", "time": 5, "request": {"method": "GET", "url": "https://a.example/x"}, "response": {"status": 503}}
        ]}}

        """

    struct Case: Sendable, CustomTestStringConvertible {
        var arguments: [String]
        var status: Int32
        var testDescription: String { "policy \(arguments.joined(separator: " ")) → \(status)" }
        init(_ arguments: [String], _ status: Int32) {
            self.arguments = arguments
            self.status = status
        }
    }

    static let cases: [Case] = [
        Case(["lint", "good.yaml"], 0), Case(["lint", "bad.yaml"], 1), Case(["lint", "--strict", "warned.yaml"], 1),
        Case(["lint", "--bogus", "good.yaml"], 64), Case(["lint", "missing.yaml"], 66), Case(["lint", "k8s"], 66),
        Case(["graph", "good.yaml"], 0), Case(["graph", "bad.yaml"], 1), Case(["graph"], 64),
        Case(["graph", "missing.yaml"], 66),
        Case(["explain", "good.yaml"], 0), Case(["explain", "bad.yaml"], 1), Case(["explain", "missing.yaml"], 66),
        Case(["explain", "good.yaml", "other.yaml"], 64),
        Case(["simulate", "good.yaml", "--script", "script.yaml"], 0),
        Case(["simulate", "bad.yaml", "--script", "script.yaml"], 1),
        Case(["simulate", "good.yaml", "--script", "missing.yaml"], 66), Case(["simulate", "good.yaml"], 64),
        Case(["test", "script.yaml"], 0), Case(["test", "failing.yaml"], 1), Case(["test", "missing.yaml"], 66),
        Case(["test"], 64),
        Case(["diff", "good.yaml", "good.yaml"], 0), Case(["diff", "good.yaml", "other.yaml"], 1),
        Case(["diff", "good.yaml", "bad.yaml"], 65), Case(["diff", "good.yaml", "missing.yaml"], 66),
        Case(["diff", "good.yaml"], 64),
        Case(["schema"], 0), Case(["schema", "extra"], 64),
        Case(["replay", "good.yaml", "recording.har"], 0),
        Case(["replay", "good.yaml", "recording.har", "--against", "other.yaml"], 1),
        Case(["replay", "bad.yaml", "recording.har"], 1), Case(["replay", "good.yaml", "malformed.json"], 65),
        Case(["replay", "good.yaml", "missing.yaml"], 66), Case(["replay", "good.yaml"], 64),
        Case(["fetch", "--policy", "missing.yaml", "http://127.0.0.1:9/"], 66),
        Case(["fetch", "--policy", "bad.yaml", "http://127.0.0.1:9/"], 1),
        Case(["fetch", "--policy", "good.yaml", "--credentials", "missing.json", "http://127.0.0.1:9/"], 66),
        Case(["fetch", "--policy", "good.yaml", "--credentials", "malformed.json", "http://127.0.0.1:9/"], 65),
        Case(["fetch", "--policy", "good.yaml"], 64),
    ]

    static func folder() throws -> TemporaryDirectory {
        let dir = try TemporaryDirectory()
        for (name, text) in [
            ("good.yaml", good), ("other.yaml", other), ("warned.yaml", warned), ("bad.yaml", bad),
            ("script.yaml", script), ("failing.yaml", failingScript), ("malformed.json", "{\"token\": 1}\n"),
            ("recording.har", recording),
        ] {
            try dir.write(name, text)
        }
        try dir.makeFolder("k8s")
        try dir.write("k8s/pod.yaml", "apiVersion: v1\nkind: Pod\n")
        return dir
    }

    /// The statuses `policy NAME --help` lists under EXIT CODES.
    static func documentedStatuses(_ name: String) async throws -> Set<Int32> {
        let help = try await runPolicy([name, "--help"])
        let lines = help.stdoutLines.drop { $0 != "EXIT CODES:" }.dropFirst().prefix { $0.hasPrefix("  ") }
        return Set(lines.compactMap { Int32($0.split(separator: " ").first ?? "") })
    }

    @Test(arguments: cases)
    func everyStatusACommandReturnsIsInItsHelp(_ scenario: Case) async throws {
        let dir = try Self.folder()
        let result = try await runPolicy(scenario.arguments, in: dir.url)
        #expect(result.status == scenario.status, "\(result.stdout)\(result.stderr)")
        let name = try #require(scenario.arguments.first)
        let documented = try await Self.documentedStatuses(name)
        #expect(documented.contains(result.status), "policy \(name) --help lists \(documented.sorted())")
        let spec = try #require(PolicyCommand.subcommands[name])
        #expect(Set(spec.exitCodes.map(\.0)) == documented)
    }

    /// Every status a command declares is one this suite makes it return (fetch's 0 and 73 need a
    /// server: EngineIntegrationTests and FetchCredentialSafetyTests make them): the help lists
    /// nothing that cannot happen.
    @Test func everyListedStatusIsOneACommandReturns() {
        for command in CommandTable.commands {
            let made = Set(Self.cases.filter { $0.arguments.first == command.name }.map(\.status))
            let listed = Set(command.spec.exitCodes.map(\.0))
            let elsewhere: Set<Int32> = command.name == "fetch" ? [0, 73] : []
            #expect(listed.subtracting(made).subtracting(elsewhere).isEmpty, "\(command.name): \(listed) \(made)")
        }
    }

    @Test(arguments: [
        ["lint", "missing.yaml"], ["graph", "missing.yaml"], ["explain", "missing.yaml"],
        ["simulate", "missing.yaml", "--script", "script.yaml"], ["simulate", "good.yaml", "--script", "missing.yaml"],
        ["test", "missing.yaml"], ["diff", "good.yaml", "missing.yaml"], ["replay", "good.yaml", "missing.yaml"],
        ["fetch", "--policy", "missing.yaml", "http://127.0.0.1:9/"],
        ["fetch", "--policy", "good.yaml", "--credentials", "missing.yaml", "http://127.0.0.1:9/"],
    ])
    func aMissingFileIsWordedAlikeByEveryCommand(_ arguments: [String]) async throws {
        let dir = try Self.folder()
        let result = try await runPolicy(arguments, in: dir.url)
        #expect(result.status == 66)
        #expect(
            result.stderr.contains("error: cannot read 'missing.yaml': no such file or directory\n"), "\(result.stderr)"
        )
    }
}
