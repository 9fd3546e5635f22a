import Foundation
import TestSupport
import Testing

@testable import PolicyCLI

/// One command table: the top-level help, each command's help and usage line, docs/commands.md
/// and the man page are all printed from `CommandTable`, so none can drift from the others.
struct CommandReferenceTests {
    /// docs/commands.md holds every generated block, each exactly as the table prints it now.
    @Test func theGeneratedBlocksOfDocsCommandsAreTheTablesOutput() throws {
        let file = try String(
            contentsOf: repositoryRoot.appendingPathComponent("docs/commands.md"), encoding: .utf8)
        var inFile: [String: String] = [:]
        let blockPattern = #/<!-- BEGIN GENERATED [^\n]*?: (\S+) -->\n(?s:.*?)<!-- END GENERATED -->\n/#
        for match in file.matches(of: blockPattern) { inFile[String(match.1)] = String(match.0) }
        let generated = CommandReference.blocks()
        #expect(inFile.keys.sorted() == generated.map(\.name).sorted(), "run scripts/update-docs.sh")
        for block in generated {
            #expect(inFile[block.name] == block.text, "docs/commands.md '\(block.name)': run scripts/update-docs.sh")
        }
        // Each command's block sits under its own heading, which the list of commands links to.
        for command in CommandTable.commands {
            #expect(file.contains("## policy \(command.name)\n\n" + CommandReference.begin + command.name))
        }
    }

    /// Every option and exit code of every command is in its help, its docs block and the man page.
    @Test(arguments: CommandTable.commands.map(\.name))
    func everyOptionIsInHelpDocsAndManPage(_ name: String) throws {
        let command = try #require(CommandTable.named(name))
        let help = command.spec.helpText
        let docs = CommandReference.markdown(for: command.spec)
        let man = CommandReference.manPage()
        #expect(help.contains("USAGE: \(command.spec.usage)\n"))
        #expect(docs.contains("```text\n\(command.spec.usage)\n```"))
        #expect(man.contains(".SS \"policy \(name)\"\n"))
        for option in command.spec.options {
            #expect(help.contains("  \(option.helpNames)"), "help lacks \(option.helpNames)")
            #expect(docs.contains("| `\(option.helpNames)` |"), "docs lack \(option.helpNames)")
            #expect(command.spec.usage.contains(option.names[0]), "usage lacks \(option.names[0])")
            for optionName in option.names {
                #expect(man.contains("\\fB\(CommandReference.roff(optionName))\\fR"), "man page lacks \(optionName)")
            }
        }
        #expect(!command.spec.exitCodes.isEmpty, "\(name) declares no exit codes")
        for (code, meaning) in command.spec.exitCodes {
            #expect(help.contains(CommandSpec.column(String(code), meaning)))
            #expect(docs.contains("| \(code) | \(CommandReference.cell(meaning)) |"))
        }
    }

    /// The top-level list of subcommands is the table's, summaries included (it once said graph
    /// printed "DOT or Mermaid" while graph's own help also offered JSON).
    @Test func topLevelHelpListsTheTablesCommandsWithTheirSummaries() async throws {
        let result = try await runPolicy(["--help"])
        #expect(result.status == 0)
        for command in CommandTable.commands {
            #expect(result.stdout.contains(CommandSpec.column(command.name, command.spec.summary)))
        }
        let graph = try #require(CommandTable.named("graph"))
        for format in GraphCommand.Format.allCases {
            #expect(graph.spec.summary.lowercased().contains(format.rawValue), "summary omits \(format.rawValue)")
        }
    }

    @Test func helpMarkdownAndManArePrintedByTheBinary() async throws {
        let markdown = try await runPolicy(["help", "--markdown"])
        expectResult(markdown, stdout: CommandReference.markdown(), status: 0)
        let man = try await runPolicy(["help", "--man"])
        expectResult(man, stdout: CommandReference.manPage(), status: 0)
    }

    /// The man page is valid roff: groff formats it without a warning (groff-base is installed by
    /// .ci/run; without it only the structure is checked).
    @Test func theManPageFormatsWithoutWarnings() async throws {
        let page = CommandReference.manPage()
        #expect(page.hasPrefix(".TH POLICY 1 "))
        for section in ["NAME", "SYNOPSIS", "DESCRIPTION", "COMMANDS", "FILES", "SEE ALSO"] {
            #expect(page.contains("\n.SH \(section)\n"))
        }
        // No line may start a request by accident (a sentence starting with '.' or "'").
        for line in page.split(separator: "\n") where !line.hasPrefix(".") {
            #expect(!line.hasPrefix("'"), "\(line)")
        }
        guard FileManager.default.isExecutableFile(atPath: "/usr/bin/groff") else { return }
        let directory = try TemporaryDirectory()
        try directory.write("policy.1", page)
        let result = try await runExecutable(
            URL(fileURLWithPath: "/usr/bin/groff"), ["-man", "-Tutf8", "-ww", "-z", "policy.1"], in: directory.url)
        #expect(result.status == 0)
        #expect(result.stderr == "", "groff: \(result.stderr)")
    }
}
