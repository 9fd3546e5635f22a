import Foundation
import ResponsePolicy

/// `policy lint [--format text|json] [--strict] [--check-env] [--plugin KIND:NAME]... PATH...`
enum LintCommand {
    static let spec = CommandSpec(
        name: "lint",
        overview: "Check policy files for errors and risky settings.",
        usage: "policy lint [--format text|json] [--strict] [--plugin KIND:NAME]... PATH...",
        arguments: [("PATH", "A policy file, or a folder searched for *.yaml and *.yml files.")],
        options: [
            .init(names: ["--format"], valueName: "format", help: "Output format: text (default) or json."),
            .init(names: ["--strict"], valueName: nil, help: "Treat warnings as errors (exit 1 when there are any)."),
            .init(
                names: ["--list-rules"], valueName: nil, help: "Print the reference of every check (Markdown) and exit."
            ),
            .init(
                names: ["--plugin"], valueName: "kind:name",
                help: "Declare a host plugin, like refresh:my-sso, so 'use:' may name it. Repeatable.",
                repeatable: true),
            .init(
                names: ["--plugins"], valueName: "file",
                help: "Declare the host plugins, with their option schemas, of a file written by "
                    + "PluginRegistry.exportSchemas()."),
            .init(
                names: ["--check-env"], valueName: nil,
                help: "Also make each built-in plugin as the engine would here: report unset {env:} and *-env "
                    + "variables, unreadable {file:} and *-file secrets, missing exec commands."),
        ])

    struct FileResult {
        var path: String
        var diagnostics: [Diagnostic]
        var source: String?
    }

    static func run(_ arguments: ParsedArguments, output: CommandOutput) throws(UsageError) -> Int32 {
        let format = arguments.value("--format") ?? "text"
        guard format == "text" || format == "json" else {
            throw UsageError(message: "Unknown format '\(format)'; use text or json")
        }
        if arguments.flags.contains("--list-rules") {
            output.stdout(ruleReference())
            return ExitCode.success
        }
        guard !arguments.positional.isEmpty else { throw UsageError(message: "Missing expected argument 'PATH'") }
        var catalog = try catalog(from: arguments.all("--plugin"))
        if let schemas = arguments.value("--plugins") {
            guard let text = try? String(contentsOfFile: schemas, encoding: .utf8) else {
                output.stderr("error: cannot read '\(schemas)'\n")
                return ExitCode.noInput
            }
            do {
                try catalog.declare(schemasYAML: text, file: schemas)
            } catch {
                for diagnostic in error.diagnostics { output.stderr(diagnostic.description + "\n") }
                throw UsageError(message: "The plugin schema file '\(schemas)' is not valid")
            }
        }
        let strict = arguments.flags.contains("--strict")
        let checkEnvironment = arguments.flags.contains("--check-env")

        var results: [FileResult] = []
        var unreadable: [(String, String)] = []
        for path in arguments.positional {
            switch expand(path) {
            case .failure(let error): unreadable.append((path, error.reason))
            case .success(let files):
                for file in files {
                    do {
                        let bytes = try Policy.readFile(file, limits: .default)
                        let parsed = Policy.parse(bytes: bytes, limits: .default)
                        if SimulationScript.isScript(parsed.root) {
                            results.append(
                                FileResult(
                                    path: file, diagnostics: checkScript(parsed, file: file), source: parsed.source))
                            continue
                        }
                        if PluginCatalog.isSchemaFile(parsed.root) {
                            results.append(
                                FileResult(
                                    path: file, diagnostics: PluginCatalog.checkSchemaFile(bytes, file: file),
                                    source: parsed.source))
                            continue
                        }
                        let analysis = Policy.analyze(parsed, file: file, catalog: catalog)
                        var diagnostics = analysis.diagnostics
                        if checkEnvironment, let policy = analysis.policy {
                            // Only what this program can make: host plugins are the host's to check.
                            diagnostics += PluginRegistry().problems(in: policy, onlyRegistered: true)
                                .map { $0.diagnostic(file: file) }
                            diagnostics = diagnostics.sortedByPosition()
                        }
                        results.append(FileResult(path: file, diagnostics: diagnostics, source: analysis.source))
                    } catch {
                        if case .unreadable(_, let reason) = error { unreadable.append((file, reason)) }
                    }
                }
            }
        }

        let all = results.flatMap(\.diagnostics)
        let errors = all.filter { $0.severity == .error }.count
        let warnings = all.count - errors
        if format == "json" {
            let unreadableDiagnostics = unreadable.map { path, reason in
                JSONText.object([
                    ("file", JSONText.string(path)), ("line", "0"), ("column", "0"),
                    ("severity", JSONText.string("error")),
                    ("rule", JSONText.string("unreadable-file")),
                    ("message", JSONText.string("cannot read the file: \(reason)")),
                ])
            }
            let items = all.map { d in
                JSONText.object([
                    ("file", JSONText.string(d.file ?? "")), ("line", String(d.range.start.line)),
                    ("column", String(d.range.start.column)), ("severity", JSONText.string(d.severity.rawValue)),
                    ("rule", JSONText.string(d.rule)), ("message", JSONText.string(d.message)),
                ])
            }
            output.stdout(
                JSONText.object([
                    ("files", String(results.count)), ("errors", String(errors + unreadable.count)),
                    ("warnings", String(warnings)),
                    ("diagnostics", "[" + (unreadableDiagnostics + items).joined(separator: ",") + "]"),
                ]) + "\n")
        } else {
            let renderer = DiagnosticRenderer(colour: output.isTerminal, showSource: output.isTerminal)
            for (path, reason) in unreadable {
                output.stderr("error: cannot read '\(path)': \(reason)\n")
            }
            for result in results {
                // Split into lines once per file, and only when snippets are shown.
                let lines = output.isTerminal ? result.source.map(DiagnosticRenderer.yamlLines) : nil
                for diagnostic in result.diagnostics {
                    output.stdout(renderer.render(diagnostic, lines: lines) + "\n")
                }
            }
            output.stdout(summary(files: results.count, errors: errors, warnings: warnings) + "\n")
        }
        if !unreadable.isEmpty { return ExitCode.noInput }
        if errors > 0 || (strict && warnings > 0) { return ExitCode.failure }
        return ExitCode.success
    }

    /// A simulation script (a top-level `requests:` and no `policy:`) is checked as a script:
    /// its schema, and that every policy its `reload:` names exists.
    static func checkScript(_ parsed: Policy.Parsed, file: String) -> [Diagnostic] {
        let (script, diagnostics) = SimulationScript.parse(parsed, file: file)
        var all = diagnostics
        let directory = URL(fileURLWithPath: file).deletingLastPathComponent().path
        for step in script?.reload ?? [] {
            let path = step.policy.hasPrefix("/") ? step.policy : directory + "/" + step.policy
            if !FileManager.default.fileExists(atPath: path) {
                var missing = Diagnostic.error(
                    "missing-file", "reload names '\(step.policy)', which does not exist", at: step.range)
                missing.file = file
                all.append(missing)
            }
        }
        return all
    }

    /// The rule reference, generated from each rule's description (docs/lint-rules.md).
    static func ruleReference() -> String {
        var out = "# Lint rules\n\nGenerated by `policy lint --list-rules` from the rules' own descriptions; "
        out += "a test keeps this file in step.\n\n"
        out += "| rule | severity | finds |\n|---|---|---|\n"
        let all = Linter.descriptions.sorted { ($0.severity.rawValue, $0.id) < ($1.severity.rawValue, $1.id) }
        for rule in all { out += "| [`\(rule.id)`](#\(rule.id)) | \(rule.severity.rawValue) | \(rule.summary) |\n" }
        for rule in all {
            out += "\n## \(rule.id)\n\n**\(rule.severity.rawValue)**: \(rule.summary).\n\n\(rule.rationale)\n"
            for (title, examples) in [("Reported", rule.triggering), ("Not reported", rule.nonTriggering)] {
                for example in examples where example.count < 600 {
                    out += "\n\(title):\n\n```yaml\n\(example)\(example.hasSuffix("\n") ? "" : "\n")```\n"
                }
            }
        }
        return out
    }

    static func summary(files: Int, errors: Int, warnings: Int) -> String {
        func plural(_ n: Int, _ word: String) -> String { "\(n) \(word)\(n == 1 ? "" : "s")" }
        return "\(plural(files, "file")) checked: \(plural(errors, "error")), \(plural(warnings, "warning"))"
    }

    /// A file as itself; a folder as its *.yaml and *.yml files, recursively (hidden folders
    /// skipped), sorted.
    static func expand(_ path: String) -> Result<[String], LintPathError> {
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory) else {
            return .failure(LintPathError("no such file or directory"))
        }
        guard isDirectory.boolValue else { return .success([path]) }
        guard let enumerator = FileManager.default.enumerator(atPath: path) else {
            return .failure(LintPathError("the folder cannot be read"))
        }
        var files: [String] = []
        while let entry = enumerator.nextObject() as? String {
            // Hidden folders (.build, .git, .swiftpm) hold build products and tools' YAML, not policies.
            if entry.split(separator: "/").contains(where: { $0.hasPrefix(".") }) { continue }
            guard entry.hasSuffix(".yaml") || entry.hasSuffix(".yml") else { continue }
            let full = path.hasSuffix("/") ? path + entry : path + "/" + entry
            var entryIsDirectory: ObjCBool = false
            if FileManager.default.fileExists(atPath: full, isDirectory: &entryIsDirectory), !entryIsDirectory.boolValue
            {
                files.append(full)
            }
        }
        guard !files.isEmpty else { return .failure(LintPathError("no *.yaml or *.yml files in the folder")) }
        return .success(files.sorted())
    }
}

struct LintPathError: Error, CustomStringConvertible {
    var reason: String
    init(_ reason: String) { self.reason = reason }
    var description: String { reason }
}
