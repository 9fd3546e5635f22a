import Foundation
import ResponsePolicy

/// The `policy` command line: dispatches to the subcommands and owns the usage-error contract
/// (message on stderr, exit 64).
package enum PolicyCommand {
    static let top = CommandSpec(
        name: "policy",
        overview: "Check, explain and run declarative response policies (token refresh, forced logout, retries).",
        usage: "policy <subcommand> [options]",
        arguments: [],
        options: [.init(names: ["--version"], valueName: nil, help: "Show the version.")],
        subcommands: [
            ("lint", "Check policy files for errors and risky settings."),
            ("graph", "Print a policy's rule graph as DOT or Mermaid."),
            ("explain", "Describe a policy in plain sentences, with its worst case."),
            ("simulate", "Run the engine against a scripted server on a virtual clock."),
            ("fetch", "Send real HTTP requests through the engine."),
            ("test", "Run simulation scripts with expectations, like a test runner."),
            ("diff", "Show what changes in behaviour between two policies."),
            ("schema", "Print the JSON Schema of the policy file, for editor completion."),
            ("help", "Show help for a subcommand."),
        ])

    static let subcommands: [String: CommandSpec] = [
        "lint": LintCommand.spec, "graph": GraphCommand.spec, "explain": ExplainCommand.spec,
        "simulate": SimulateCommand.spec, "fetch": FetchCommand.spec, "test": TestCommand.spec,
        "schema": SchemaCommand.spec, "diff": DiffCommand.spec,
    ]

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
            guard let spec = subcommands[name] else {
                return usageError("Unknown subcommand '\(name)'\(subcommandHint(name))", spec: top, output: output)
            }
            output.stdout(spec.helpText)
            return ExitCode.success
        default:
            guard let spec = subcommands[first] else {
                if first.hasPrefix("-") { return usageError("Unknown option '\(first)'", spec: top, output: output) }
                return usageError("Unknown subcommand '\(first)'\(subcommandHint(first))", spec: top, output: output)
            }
            let parsed: ParsedArguments
            do {
                parsed = try spec.parse(rest)
            } catch {
                return usageError(error.message, spec: spec, output: output)
            }
            if parsed.wantsHelp {
                output.stdout(spec.helpText)
                return ExitCode.success
            }
            do {
                switch first {
                case "lint": return try LintCommand.run(parsed, output: output)
                case "graph": return try GraphCommand.run(parsed, output: output)
                case "explain": return try ExplainCommand.run(parsed, output: output)
                case "simulate": return try await SimulateCommand.run(parsed, output: output)
                case "fetch": return try await FetchCommand.run(parsed, output: output)
                case "test": return try await TestCommand.run(parsed, output: output)
                case "schema": return try SchemaCommand.run(parsed, output: output)
                case "diff": return try DiffCommand.run(parsed, output: output)
                default: return ExitCode.usage
                }
            } catch {
                return usageError(error.message, spec: spec, output: output)
            }
        }
    }

    static func subcommandHint(_ name: String) -> String {
        Suggestion.closest(to: name, in: subcommands.keys.sorted()).map { "; did you mean '\($0)'?" } ?? ""
    }

    static func usageError(_ message: String, spec: CommandSpec, output: CommandOutput) -> Int32 {
        let helpName = spec.name == "policy" ? "policy --help" : "policy \(spec.name) --help"
        output.stderr("Error: \(message)\nUsage: \(spec.usage)\n  See '\(helpName)' for more information.\n")
        return ExitCode.usage
    }
}

/// Loads one policy for graph/explain/simulate/fetch; prints diagnostics on failure.
func loadPolicy(_ path: String, catalog: PluginCatalog, output: CommandOutput) -> (Policy?, Int32) {
    do {
        let policy = try Policy.load(path: path, plugins: catalog)
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
