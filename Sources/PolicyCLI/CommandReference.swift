import Foundation
import ResponsePolicy

/// The command reference printed from ``CommandTable``: the generated blocks of
/// docs/commands.md (`policy help --markdown`) and the man page (`policy help --man`).
///
/// docs/commands.md keeps its hand-written prose (examples, output formats) between the blocks;
/// `CommandReferenceTests` fails when a block differs from what the table prints now, and
/// `scripts/update-docs.sh` rewrites them.
enum CommandReference {
    static let begin = "<!-- BEGIN GENERATED from the command table by `policy help --markdown`: "
    static let end = "<!-- END GENERATED -->"

    /// Every generated block, in the order docs/commands.md holds them: the list of commands,
    /// then one block per command.
    static func markdown() -> String {
        blocks().map { $0.text }.joined(separator: "\n")
    }

    /// The generated blocks with their names (`commands`, then each command's name).
    static func blocks() -> [(name: String, text: String)] {
        var list = "| command | what it does |\n|---|---|\n"
        for command in CommandTable.commands {
            list += "| [`policy \(command.name)`](#policy-\(command.name)) | \(cell(command.spec.summary)) |\n"
        }
        return [("commands", wrap("commands", list))]
            + CommandTable.commands.map { ($0.name, wrap($0.name, markdown(for: $0.spec))) }
    }

    static func wrap(_ name: String, _ body: String) -> String {
        "\(begin)\(name) -->\n\(body)\(end)\n"
    }

    /// One command: usage, summary, arguments, options and exit codes.
    static func markdown(for spec: CommandSpec) -> String {
        var out = "```text\n\(spec.usage)\n```\n\n\(spec.summary)\n"
        if !spec.arguments.isEmpty {
            out += "\n| argument | meaning |\n|---|---|\n"
            for argument in spec.arguments { out += "| `\(argument.usage)` | \(cell(argument.help)) |\n" }
        }
        out += "\n| option | meaning |\n|---|---|\n"
        for option in spec.options { out += "| `\(option.helpNames)` | \(cell(option.help)) |\n" }
        out += "| `-h, --help` | Show help information. |\n"
        if !spec.exitCodes.isEmpty {
            out += "\n| exit code | meaning |\n|---|---|\n"
            for (code, meaning) in spec.exitCodes { out += "| \(code) | \(cell(meaning)) |\n" }
        }
        return out
    }

    /// Text in a table cell: `|` would end the cell and `*` start emphasis.
    static func cell(_ text: String) -> String {
        text.replacingOccurrences(of: "|", with: "\\|").replacingOccurrences(of: "*", with: "\\*")
    }

    // MARK: - man page

    /// policy(1) in roff (man macros), shipped in the .deb as /usr/share/man/man1/policy.1.gz.
    static func manPage() -> String {
        let top = PolicyCommand.top
        var out = ".TH POLICY 1 \"\" \"policy \(PolicyCommand.version)\" \"User Commands\"\n"
        out += ".SH NAME\npolicy \\- \(roff(lowercasedFirst(top.summary)))\n"
        out += ".SH SYNOPSIS\n"
        for command in CommandTable.commands { out += ".PP\n" + synopsis(command.spec.usage) }
        out += ".SH DESCRIPTION\n\(roff(top.summary))\n"
        out += ".PP\nEvery subcommand has \\fB\\-\\-help\\fR (also \\fBpolicy help\\fR \\fIsubcommand\\fR); "
        out += "usage errors print the usage on standard error and exit 64. "
        out += "\\fBpolicy \\-\\-version\\fR prints the version.\n"
        out += ".SH COMMANDS\n"
        for command in CommandTable.commands {
            let spec = command.spec
            out += ".SS \"policy \(spec.name)\"\n\(roff(spec.summary))\n"
            for argument in spec.arguments {
                out += ".TP\n.I \(quoted(argument.usage))\n\(roff(argument.help))\n"
            }
            for option in spec.options {
                out += ".TP\n" + optionHeader(option) + "\(roff(option.help))\n"
            }
            if !spec.exitCodes.isEmpty {
                out += ".PP\nExit status: "
                out += spec.exitCodes.map { "\($0.0) \(roff($0.1))" }.joined(separator: "; ") + ".\n"
            }
        }
        out += ".SH FILES\n.TP\n.I /usr/share/doc/policy\n"
        out += "README.md, the documentation (docs/) and the shipped policies (policies/).\n"
        out += ".SH SEE ALSO\n"
        out += "The policy file reference, /usr/share/doc/policy/docs/policy.md; "
        out += "every lint rule, /usr/share/doc/policy/docs/lint-rules.md.\n"
        return out
    }

    /// `\fBpolicy lint\fR [\-\-format text|json] ...`: the command in bold, the rest as written.
    static func synopsis(_ usage: String) -> String {
        let words = usage.split(separator: " ", maxSplits: 2).map(String.init)
        let command = words.prefix(2).joined(separator: " ")
        let rest = words.count > 2 ? " " + roff(words[2]) : ""
        return "\\fB\(roff(command))\\fR\(rest)\n"
    }

    static func optionHeader(_ option: CommandSpec.OptionDeclaration) -> String {
        let names = option.names.map { "\\fB\(roff($0))\\fR" }.joined(separator: ", ")
        return names + (option.valueName.map { " \\fI\(roff($0))\\fR" } ?? "") + "\n"
    }

    /// Text safe in a roff line: backslashes doubled, hyphens as `\-` (so they copy as ASCII),
    /// and a leading `.` or `'` (a request) escaped.
    static func roff(_ text: String) -> String {
        var out = text.replacingOccurrences(of: "\\", with: "\\e").replacingOccurrences(of: "-", with: "\\-")
        if out.hasPrefix(".") || out.hasPrefix("'") { out = "\\&" + out }
        return out
    }

    static func quoted(_ text: String) -> String { "\"\(roff(text))\"" }

    static func lowercasedFirst(_ text: String) -> String {
        guard let first = text.first else { return text }
        var trimmed = text
        if trimmed.hasSuffix(".") { trimmed.removeLast() }
        return first.lowercased() + trimmed.dropFirst()
    }
}
