import Foundation
import ResponsePolicy

/// The `policy` command line: dispatches to the subcommands and owns the usage-error contract
/// (message on stderr, exit 64).
package enum PolicyCommand {
    static let versionFlag = Option.flag(["--version"], help: "Show the version.")

    static let top = CommandSpec(
        name: "policy",
        summary: "Check, explain and run declarative response policies (token refresh, forced logout, retries).",
        options: [versionFlag.declaration],
        exitCodes: [(0, "help or the version was printed"), (64, "usage error")],
        subcommands: CommandTable.commands.map { ($0.name, $0.spec.summary) }
            + [("help", "Show help for a subcommand.")],
        usage: "policy <subcommand> [options]")

    /// Every subcommand's declaration by name (from ``CommandTable``).
    static let subcommands: [String: CommandSpec] = Dictionary(
        uniqueKeysWithValues: CommandTable.commands.map { ($0.name, $0.spec) })

    static let version = ResponsePolicyVersion.version
    /// The `User-Agent` of the token and logout calls the commands make.
    package static let userAgent = "policy/\(version)"

    /// Runs the command line `arguments` (without the program name) and returns the exit code.
    package static func run(_ arguments: [String], output: CommandOutput = .standard) async -> Int32 {
        guard let first = arguments.first else {
            output.stdout(top.helpText)
            return ExitCode.success
        }
        let rest = Array(arguments.dropFirst())
        switch first {
        case "-h", "--help":
            output.stdout(top.helpText)
            return ExitCode.success
        case "--version":
            output.stdout("policy \(version) (schema \(ResponsePolicyVersion.schema))\n")
            return ExitCode.success
        case "help":
            guard let name = rest.first else {
                output.stdout(top.helpText)
                return ExitCode.success
            }
            switch name {
            case "--markdown":
                output.stdout(CommandReference.markdown())
                return ExitCode.success
            case "--man":
                output.stdout(CommandReference.manPage())
                return ExitCode.success
            default: break
            }
            guard let command = CommandTable.named(name) else {
                return usageError("Unknown subcommand '\(name)'\(subcommandHint(name))", spec: top, output: output)
            }
            output.stdout(command.spec.helpText)
            return ExitCode.success
        default:
            guard let command = CommandTable.named(first) else {
                if first.hasPrefix("-") {
                    let hint = Suggestion.hint(for: first, in: ["--help", "--version"])
                    return usageError("Unknown option '\(first)'\(hint)", spec: top, output: output)
                }
                return usageError("Unknown subcommand '\(first)'\(subcommandHint(first))", spec: top, output: output)
            }
            do {
                let parsed = try command.spec.parse(rest)
                if parsed.wantsHelp {
                    output.stdout(command.spec.helpText)
                    return ExitCode.success
                }
                return try await command.run(parsed, output)
            } catch {
                return usageError(error.message, spec: command.spec, output: output)
            }
        }
    }

    static func subcommandHint(_ name: String) -> String {
        Suggestion.closest(to: name, in: CommandTable.commands.map(\.name)).map { "; did you mean '\($0)'?" } ?? ""
    }

    static func usageError(_ message: String, spec: CommandSpec, output: CommandOutput) -> Int32 {
        let helpName = spec.name == "policy" ? "policy --help" : "policy \(spec.name) --help"
        output.stderr("Error: \(message)\nUsage: \(spec.usage)\n  See '\(helpName)' for more information.\n")
        return ExitCode.usage
    }
}

/// Loads one policy for graph/explain/simulate/fetch; prints diagnostics on failure. `owner`:
/// `.userOrRoot` for a policy that runs against real servers (`fetch`), `.anyone` for the
/// commands that only read or simulate it.
func loadPolicy(
    _ path: String, catalog: PluginCatalog, output: CommandOutput, owner: SafeFile.Owner = .anyone
) -> (Policy?, Int32) {
    do {
        let policy = try Policy.load(path: path, plugins: catalog, owner: owner)
        return (policy, ExitCode.success)
    } catch {
        switch error {
        case .unreadable(let path, let reason):
            output.stderr("error: cannot read '\(path)': \(reason)\n")
            return (nil, ExitCode.noInput)
        case .invalid(_, let diagnostics):
            for diagnostic in diagnostics {
                var shown = diagnostic
                shown.file = path
                output.stderr(shown.description + "\n")
            }
            let errors = diagnostics.filter { $0.severity == .error }.count
            output.stderr(
                "error: '\(path)' has \(errors) error\(errors == 1 ? "" : "s"); run 'policy lint \(path)' for details\n"
            )
            return (nil, ExitCode.failure)
        }
    }
}

/// Parses `--plugin KIND:NAME` values into a catalog.
func catalog(from declarations: [String]) throws(UsageError) -> PluginCatalog {
    var catalog = PluginCatalog()
    for declaration in declarations {
        let parts = declaration.split(separator: ":", maxSplits: 1).map(String.init)
        let kinds = PluginKind.allCases.map(\.rawValue)
        guard parts.count == 2, !parts[1].isEmpty else {
            throw UsageError(message: "Invalid plugin '\(declaration)'; write KIND:NAME, like refresh:my-sso")
        }
        guard let kind = PluginKind(rawValue: parts[0]) else {
            throw UsageError(message: "Unknown plugin kind '\(parts[0])'; use one of \(kinds.joined(separator: ", "))")
        }
        catalog.declare(kind, parts[1])
    }
    return catalog
}
