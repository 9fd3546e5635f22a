import Foundation
import Testing

@testable import PolicyCLI

/// Help on stdout with exit 0 however it is asked for; usage errors on stderr with exit 64.
struct HelpAndUsageTests {
    static let subcommandNames = ["lint", "graph", "explain", "simulate", "fetch", "test", "diff", "schema"]

    @Test(arguments: [["--help"], ["-h"], ["help"], []])
    func topLevelHelp(_ arguments: [String]) async throws {
        let result = try await runPolicy(arguments)
        expectResult(result, stdout: PolicyCommand.top.helpText, status: 0)
        let lines = result.stdoutLines
        for section in ["OVERVIEW:", "USAGE:", "OPTIONS:", "SUBCOMMANDS:"] {
            #expect(lines.contains { $0.hasPrefix(section) }, "no \(section) section")
        }
        #expect(lines.contains("USAGE: \(topUsage)"))
        for name in Self.subcommandNames + ["help"] {
            #expect(lines.contains { $0.hasPrefix("  \(name) ") }, "subcommand '\(name)' is not listed")
        }
        #expect(lines.contains("  -h, --help              Show help information."))
    }

    @Test(arguments: subcommandNames)
    func subcommandHelpIsTheSameHoweverItIsAskedFor(_ name: String) async throws {
        let spec = try #require(PolicyCommand.subcommands[name])
        let viaHelp = try await runPolicy(["help", name])
        expectResult(viaHelp, stdout: spec.helpText, status: 0)
        for flag in ["--help", "-h"] {
            let viaFlag = try await runPolicy([name, flag])
            expectResult(viaFlag, stdout: spec.helpText, status: 0)
        }
        let lines = viaHelp.stdoutLines
        #expect(lines.first?.hasPrefix("OVERVIEW: ") == true)
        #expect(lines.contains("USAGE: \(spec.usage)"))
        #expect(lines.contains("OPTIONS:"))
        #expect(!lines.contains("SUBCOMMANDS:"))
    }

    @Test func lintHelpDocumentsEveryOption() async throws {
        let result = try await runPolicy(["lint", "--help"])
        #expect(result.status == 0)
        #expect(result.stderr == "")
        let lines = result.stdoutLines
        #expect(lines.first == "OVERVIEW: Check policy files for errors and risky settings.")
        #expect(lines.contains("USAGE: \(lintUsage)"))
        #expect(lines.contains("ARGUMENTS:"))
        #expect(
            lines.contains(
                "  PATH                    A policy file, a folder searched for *.yaml and *.yml files, or - for standard input."
            ))
        for option in ["--format <format>", "--strict", "--plugin <kind:name>", "-h, --help"] {
            #expect(lines.contains { $0.hasPrefix("  \(option) ") }, "'\(option)' is not documented")
        }
        for option in LintCommand.spec.options {
            let names = option.names.joined(separator: ", ")
            #expect(lines.contains { $0.hasPrefix("  \(names)") && $0.hasSuffix(option.help) }, "'\(names)'")
        }
    }

    @Test func helpWinsOverOtherArguments() async throws {
        let result = try await runPolicy(["lint", "missing.yaml", "--strict", "--help"])
        expectResult(result, stdout: LintCommand.spec.helpText, status: 0)
    }

    @Test func version() async throws {
        let result = try await runPolicy(["--version"])
        expectResult(result, stdout: "policy 1.0.0 (schema 1)\n", status: 0)
    }

    struct Misspelling: Sendable, CustomTestStringConvertible {
        var typed: String
        var meant: String
        var testDescription: String { "\(typed) → \(meant)" }
    }

    @Test(arguments: [
        Misspelling(typed: "lnt", meant: "lint"), Misspelling(typed: "explian", meant: "explain"),
        Misspelling(typed: "grpah", meant: "graph"), Misspelling(typed: "simulat", meant: "simulate"),
    ])
    func unknownSubcommandSuggestsTheClosest(_ misspelling: Misspelling) async throws {
        let result = try await runPolicy([misspelling.typed, "policies"])
        expectResult(
            result, stdout: "",
            stderr: usageError(
                "Unknown subcommand '\(misspelling.typed)'; did you mean '\(misspelling.meant)'?", usage: topUsage,
                help: "policy --help"),
            status: 64)
    }

    @Test func unknownSubcommandFarFromAnyNameHasNoHint() async throws {
        let result = try await runPolicy(["zzzzzzzzzz"])
        expectResult(
            result, stdout: "",
            stderr: usageError("Unknown subcommand 'zzzzzzzzzz'", usage: topUsage, help: "policy --help"),
            status: 64)
    }

    @Test func helpForAnUnknownSubcommandExits64() async throws {
        let result = try await runPolicy(["help", "bogus"])
        expectResult(
            result, stdout: "",
            stderr: usageError("Unknown subcommand 'bogus'", usage: topUsage, help: "policy --help"),
            status: 64)
    }

    @Test func unknownTopLevelOptionExits64() async throws {
        let result = try await runPolicy(["--foo"])
        expectResult(
            result, stdout: "",
            stderr: usageError("Unknown option '--foo'", usage: topUsage, help: "policy --help"),
            status: 64)
    }

    @Test(arguments: ["lint", "graph", "explain"])
    func unknownSubcommandOptionNamesTheSubcommandsHelp(_ name: String) async throws {
        let spec = try #require(PolicyCommand.subcommands[name])
        let result = try await runPolicy([name, "--foo", "policies/default.yaml"])
        expectResult(
            result, stdout: "",
            stderr: usageError("Unknown option '--foo'", usage: spec.usage, help: "policy \(name) --help"),
            status: 64)
    }

    @Test func doubleDashEndsOptions() async throws {
        let directory = try TemporaryDirectory()
        try directory.write("--strict", "policy: 1\nname: dashes\n")
        let result = try await runPolicy(["lint", "--", "--strict"], in: directory.url)
        expectResult(result, stdout: "1 file checked: 0 errors, 0 warnings\n", status: 0)
    }

    /// `policy --help` once listed graph, explain, simulate, test and schema with a summary that
    /// said something else than their own `--help` (two texts per command): a command's one
    /// summary is its OVERVIEW line and its row in the list, word for word.
    @Test(arguments: subcommandNames)
    func aCommandIsDescribedByOneTextInItsHelpAndInTheList(_ name: String) async throws {
        let top = try await runPolicy(["--help"])
        let own = try await runPolicy([name, "--help"])
        let overview = try #require(own.stdoutLines.first?.dropFirst("OVERVIEW: ".count))
        let row = try #require(top.stdoutLines.first { $0.hasPrefix("  \(name) ") })
        #expect(row.dropFirst(2 + name.count).trimmingCharacters(in: .whitespaces) == String(overview))
        #expect(CommandReference.markdown().contains("| [`policy \(name)`](#policy-\(name)) | \(overview) |"))
    }

    /// `--formt` got no hint where a mistyped subcommand did: every option of every command, one
    /// letter dropped, gets "did you mean" with the option itself.
    @Test(arguments: subcommandNames)
    func aMistypedOptionGetsDidYouMean(_ name: String) async throws {
        let spec = try #require(PolicyCommand.subcommands[name])
        for option in spec.options.flatMap(\.names) where option.hasPrefix("--") && option.count > 5 {
            var typed = option
            typed.remove(at: typed.index(typed.startIndex, offsetBy: 4))
            let result = await runInProcess([name, typed])
            #expect(result.status == 64)
            #expect(
                result.stderr.hasPrefix("Error: Unknown option '\(typed)'; did you mean '\(option)'?\n"),
                "\(typed): \(result.stderr)")
        }
    }

    @Test func aMistypedTopLevelOptionGetsDidYouMean() async throws {
        let result = try await runPolicy(["--verison"])
        expectResult(
            result, stdout: "",
            stderr: usageError(
                "Unknown option '--verison'; did you mean '--version'?", usage: topUsage, help: "policy --help"),
            status: 64)
    }
}
