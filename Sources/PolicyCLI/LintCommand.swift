import Foundation
import ResponsePolicy
import ResponsePolicyTesting

/// `policy lint PATH...`: checks policy files (and simulation scripts, plugin schema files) and
/// reports every finding at `file:line:col`.
enum LintCommand {
    enum Format: String, CaseIterable, Sendable { case text, json, sarif, github }

    static let format = Option.choice(
        ["--format"], "format", default: Format.text,
        help: "text (default), json, sarif (SARIF 2.1.0) or github (workflow annotations).")
    static let strict = Option.flag(
        ["--strict"], help: "Treat warnings as errors (exit 1 when there are any; the summary says so).")
    static let color = Option.color
    static let disable = Option.repeated(
        ["--disable"], "rule", help: "Suppress a warning rule everywhere (counted as suppressed). Repeatable.")
    static let exclude = Option.repeated(
        ["--exclude"], "glob",
        help: "Skip files a folder search finds whose path in the folder matches (* matches any text). Repeatable.")
    static let listRules = Option.flag(
        ["--list-rules"], help: "Print the reference of every check (Markdown) and exit.")
    static let plugin = Option.plugin()
    static let plugins = Option.value(
        ["--plugins"], "file",
        help: "Declare the host plugins, with their option schemas, of a file written by "
            + "PluginRegistry.exportSchemas().")
    static let checkEnv = Option.flag(
        ["--check-env"],
        help: "Also make each built-in plugin as the engine would here: report unset {env:} and *-env "
            + "variables, unreadable {file:} and *-file secrets, missing exec commands.")

    static let spec = CommandSpec(
        name: "lint",
        summary: "Check policy files for errors and risky settings.",
        arguments: [
            .init(
                name: "PATH",
                help: "A policy file, a folder searched for *.yaml and *.yml files, or - for standard input.",
                variadic: true)
        ],
        options: [
            format.declaration, strict.declaration, disable.declaration, exclude.declaration, listRules.declaration,
            plugin.declaration, plugins.declaration, checkEnv.declaration, color.declaration,
        ],
        exitCodes: [
            (0, "no errors (warnings allowed unless --strict)"), (1, "errors found, or warnings with --strict"),
            (64, "usage error, or a --plugins file that is not valid"),
            (66, "a PATH or the --plugins file cannot be read, or a PATH holds no policy, script or plugin schema"),
        ])

    struct FileResult {
        var path: String
        var diagnostics: [Diagnostic]
        var source: String?
        var suppressed: [LintSuppressions.Suppressed] = []
    }

    /// Every rule id lint can report, with its severity.
    static var knownRules: [String: Severity] {
        var known: [String: Severity] = [:]
        for rule in Linter.descriptions + FileChecks.descriptions { known[rule.id] = rule.severity }
        return known
    }

    static func run(_ arguments: ParsedArguments, output: CommandOutput) throws(UsageError) -> Int32 {
        let format = arguments[Self.format]
        if arguments[listRules] {
            output.stdout(ruleReference())
            return ExitCode.success
        }
        guard !arguments.positional.isEmpty else { throw UsageError(message: "Missing expected argument 'PATH'") }
        var catalog = try catalog(from: arguments[plugin])
        if let schemas = arguments[plugins] {
            // Read up to the limit and no further: a huge or endless file (a device, a FIFO) is
            // refused without holding it in memory.
            let limit = Self.maxPluginSchemaBytes
            let bytes: [UInt8]
            do {
                bytes = try Policy.readFile(schemas, limits: YAMLLimits(maxFileBytes: limit), owner: .anyone)
            } catch {
                var reason = "it cannot be read"
                if case .unreadable(_, let why) = error { reason = why }
                output.stderr("error: cannot read '\(schemas)': \(reason)\n")
                return ExitCode.noInput
            }
            guard bytes.count <= limit else {
                output.stderr(
                    "error: '\(schemas)' is larger than \(limit >> 20) MiB; a plugin schema file declares plugins "
                        + "and their options, and is far smaller\n")
                return ExitCode.noInput
            }
            guard let text = String(validating: bytes, as: UTF8.self) else {
                output.stderr("error: cannot read '\(schemas)': it is not UTF-8 text\n")
                return ExitCode.noInput
            }
            do {
                try catalog.declare(schemasYAML: text, file: schemas)
            } catch {
                for diagnostic in error.diagnostics { output.stderr(diagnostic.description + "\n") }
                throw UsageError(message: "The plugin schema file '\(schemas)' is not valid")
            }
        }
        let strict = arguments[Self.strict]
        let known = knownRules
        var disabled = Set<String>()
        for rule in arguments[disable] {
            guard let severity = known[rule] else {
                let hint = Suggestion.closest(to: rule, in: known.keys.sorted()).map { "; did you mean '\($0)'?" }
                throw UsageError(message: "Unknown rule '\(rule)'" + (hint ?? ""))
            }
            guard severity == .warning else {
                throw UsageError(message: "Cannot disable '\(rule)': errors cannot be suppressed")
            }
            disabled.insert(rule)
        }
        let excludes = arguments[exclude].map(Glob.init)
        let checkEnvironment = arguments[checkEnv]

        var results: [FileResult] = []
        var unreadable: [(String, String)] = []
        var skipped: [String] = []
        for path in arguments.positional {
            if path == "-" {
                // Named, so never skipped: something that is not a policy is an error.
                if let result = check(
                    readStandardInput(), file: "<stdin>", named: true, catalog: catalog,
                    checkEnvironment: checkEnvironment)
                {
                    results.append(result)
                }
                continue
            }
            switch expand(path, excluding: excludes) {
            case .failure(let error): unreadable.append((path, error.reason))
            case .success(let files):
                let named = files == [path]
                let (checked, skippedBefore, unreadableBefore) = (results.count, skipped.count, unreadable.count)
                var schemas = PluginSchemaDiscovery(
                    files: named ? PluginSchemaDiscovery.yamlFiles(besides: path) : files, base: catalog)
                for file in files {
                    do {
                        let bytes = try Policy.readFile(file, limits: .default, owner: .anyone)
                        if let result = check(
                            bytes, file: file, named: named, catalog: schemas.catalog(for: file),
                            checkEnvironment: checkEnvironment)
                        {
                            results.append(result)
                        } else {
                            skipped.append(file)
                        }
                    } catch {
                        if case .unreadable(_, let reason) = error { unreadable.append((file, reason)) }
                    }
                }
                // A folder whose YAML files are all something else (Kubernetes manifests, CI
                // files) checked nothing: a CI step pointed at the wrong folder must not pass.
                let notPolicies = skipped.count - skippedBefore
                if results.count == checked, unreadable.count == unreadableBefore, notPolicies > 0 {
                    unreadable.append(
                        (
                            path,
                            "no policy, simulation script or plugin schema in the folder: its \(notPolicies) YAML "
                                + "file\(notPolicies == 1 ? " is" : "s are") not a policy"
                        ))
                }
            }
        }
        for index in results.indices {
            let suppressions = LintSuppressions(source: results[index].source ?? "")
            let (kept, suppressed) = suppressions.apply(
                to: results[index].diagnostics, disabled: disabled, known: known, file: results[index].path)
            results[index].diagnostics = kept
            results[index].suppressed = suppressed
        }

        let all = results.flatMap(\.diagnostics)
        // A path that cannot be read is an error in every format's count, as in JSON's.
        let errors = all.filter { $0.severity == .error }.count + unreadable.count
        let warnings = all.count - (errors - unreadable.count)
        let suppressedCount = results.reduce(0) { $0 + $1.suppressed.count }
        for file in skipped {
            output.stderr("note: skipped '\(file)': not a policy (no 'policy:' key); use --exclude to silence this\n")
        }
        let report = Report(
            results: results, unreadable: unreadable, errors: errors, warnings: warnings,
            suppressed: suppressedCount, documentation: DocumentationLinks.current)
        let summaryLine = summary(
            files: results.count, errors: errors, warnings: warnings, suppressed: suppressedCount, strict: strict)
        switch format {
        case .json: output.stdout(report.json() + "\n")
        case .sarif: output.stdout(report.sarif())
        case .github:
            output.stdout(report.github())
            output.stdout(summaryLine + "\n")
        case .text:
            let renderer = DiagnosticRenderer(colour: output.colours(arguments[color]), showSource: output.isTerminal)
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
            output.stdout(summaryLine + "\n")
        }
        if !unreadable.isEmpty { return ExitCode.noInput }
        if errors > 0 || (strict && warnings > 0) { return ExitCode.failure }
        return ExitCode.success
    }

    /// Checks one file's bytes as a script or a policy; `nil` for YAML that is clearly not a
    /// policy found by a folder search (a named one gets a `not-a-policy` error).
    static func check(
        _ bytes: [UInt8], file: String, named: Bool, catalog: PluginCatalog, checkEnvironment: Bool = false
    ) -> FileResult? {
        let parsed = Policy.parse(bytes: bytes, limits: .default)
        if SimulationScript.isScript(parsed.root) {
            return FileResult(path: file, diagnostics: checkScript(parsed, file: file), source: parsed.source)
        }
        if PluginCatalog.isSchemaFile(parsed.root) {
            return FileResult(
                path: file, diagnostics: PluginCatalog.checkSchemaFile(bytes, file: file), source: parsed.source)
        }
        if let foreign = foreignContent(firstDocument(bytes, parsed)) {
            guard named else { return nil }
            var diagnostic = Diagnostic.error(
                "not-a-policy", "this is not a policy file: it has no 'policy:' key and no policy section (\(foreign))",
                at: .fileStart)
            diagnostic.file = file
            return FileResult(path: file, diagnostics: [diagnostic], source: parsed.source)
        }
        let analysis = Policy.analyze(consume parsed, file: file, catalog: catalog)
        var diagnostics = analysis.diagnostics
        if checkEnvironment, let policy = analysis.policy {
            // Only what this program can make: host plugins are the host's to check.
            let registry = PluginRegistry()
            diagnostics += registry.problems(in: policy, onlyRegistered: true).map { $0.diagnostic(file: file) }
            // The store's own settings (Redis evicting keys), asked of the store itself.
            diagnostics += registry.coordinationStoreWarnings(in: policy).map { warning in
                var located = warning
                located.file = file
                return located
            }
            diagnostics = diagnostics.sortedByPosition()
        }
        return FileResult(path: file, diagnostics: diagnostics, source: analysis.source)
    }

    /// What a document that is clearly not a policy holds (`it has 'apiVersion', 'kind'`): a
    /// list, or a mapping with no `policy:` and none of a policy's keys. `nil` for anything that
    /// may be a policy, even a broken one, which lint should report on.
    static func foreignContent(_ root: YAMLNode?) -> String? {
        if root?.items != nil { return "its top level is a list" }
        guard let pairs = root?.pairs, !pairs.isEmpty else { return nil }
        let keys = pairs.compactMap { $0.key.scalar }
        let policyKeys = Set(PolicyDecoder.topLevelKeys)
        guard keys.count == pairs.count, !keys.contains(where: { policyKeys.contains($0) || $0.hasPrefix("x-") })
        else { return nil }
        return "it has " + keys.prefix(3).map { "'\($0.truncatedForMessage)'" }.joined(separator: ", ")
    }

    /// The file's root, or for a stream of several documents (a Kubernetes manifest) the first
    /// one's: the loader refuses a second document, so the text before it is parsed alone.
    static func firstDocument(_ bytes: [UInt8], _ parsed: Policy.Parsed) -> YAMLNode? {
        if let root = parsed.root { return root }
        guard let second = parsed.diagnostics.first(where: { $0.rule == "multiple-documents" }) else { return nil }
        var line = 1
        var end = 0
        while end < bytes.count, line < second.range.start.line {
            if bytes[end] == UInt8(ascii: "\n") { line += 1 }
            end += 1
        }
        return Policy.parse(bytes: Array(bytes[..<end]), limits: .default).root
    }

    /// The largest `--plugins` file read: 1 MiB.
    static let maxPluginSchemaBytes = 1 << 20

    /// Standard input, up to the file size limit (one byte more, so the limit is reported).
    static func readStandardInput() -> [UInt8] {
        let limit = YAMLLimits.default.maxFileBytes + 1
        var bytes: [UInt8] = []
        while bytes.count < limit {
            let chunk = FileHandle.standardInput.readData(ofLength: min(65_536, limit - bytes.count))
            if chunk.isEmpty { break }
            bytes += chunk
        }
        return bytes
    }

    /// A simulation script (a top-level `requests:`, no `policy: 1`) is checked as a script: its
    /// schema and expectations, and that every policy its `policy:` and `reload:` name exists.
    static func checkScript(_ parsed: Policy.Parsed, file: String) -> [Diagnostic] {
        let (script, diagnostics) = SimulationScript.parse(parsed, file: file)
        let (expectations, expectDiagnostics) = SimulationExpectations.parse(parsed, file: file)
        var all = (diagnostics + expectDiagnostics).sortedByPosition()
        let directory = URL(fileURLWithPath: file).deletingLastPathComponent().path
        if let policy = expectations.policy, let range = expectations.policyRange {
            let path = policy.hasPrefix("/") ? policy : directory + "/" + policy
            if !FileManager.default.fileExists(atPath: path) {
                var missing = Diagnostic.error(
                    "missing-file", "the script's policy '\(policy)' does not exist", at: range)
                missing.file = file
                all.append(missing)
            }
        }
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
        let all = (Linter.descriptions + FileChecks.descriptions).sorted {
            ($0.severity.rawValue, $0.id) < ($1.severity.rawValue, $1.id)
        }
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

    /// `2 files checked: 1 error, 0 warnings`, and `, 3 suppressed` when any were; with
    /// `--strict` and warnings, `(--strict: warnings fail)`, so the exit status 1 is explained.
    static func summary(files: Int, errors: Int, warnings: Int, suppressed: Int = 0, strict: Bool = false) -> String {
        func plural(_ n: Int, _ word: String) -> String { "\(n) \(word)\(n == 1 ? "" : "s")" }
        return "\(plural(files, "file")) checked: \(plural(errors, "error")), \(plural(warnings, "warning"))"
            + (suppressed > 0 ? ", \(suppressed) suppressed" : "")
            + (strict && warnings > 0 ? " (--strict: warnings fail)" : "")
    }

    /// A file as itself; a folder as its *.yaml and *.yml files, recursively (hidden folders
    /// skipped), sorted, without
    /// those whose path in the folder (or a folder on the way, or the name) matches an exclude.
    static func expand(_ path: String, excluding excludes: [Glob] = []) -> Result<[String], LintPathError> {
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory) else {
            return .failure(LintPathError(PolicyError.noSuchFile))
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
            if isExcluded(entry, by: excludes) { continue }
            let full = path.hasSuffix("/") ? path + entry : path + "/" + entry
            var entryIsDirectory: ObjCBool = false
            if FileManager.default.fileExists(atPath: full, isDirectory: &entryIsDirectory), !entryIsDirectory.boolValue
            {
                files.append(full)
            }
        }
        guard !files.isEmpty else {
            return .failure(
                LintPathError("no *.yaml or *.yml files in the folder" + (excludes.isEmpty ? "" : " (after --exclude)"))
            )
        }
        return .success(files.sorted())
    }
}

extension LintCommand {
    /// Whether a path found in a folder (`sub/dir/file.yaml`) is excluded: the glob matches the
    /// whole path, a folder on the way (`sub`, `sub/dir`) or the file's name.
    static func isExcluded(_ entry: String, by excludes: [Glob]) -> Bool {
        guard !excludes.isEmpty else { return false }
        let components = entry.split(separator: "/").map(String.init)
        var candidates = [entry]
        if let name = components.last { candidates.append(name) }
        for count in stride(from: 1, to: components.count, by: 1) {
            candidates.append(components.prefix(count).joined(separator: "/"))
        }
        return excludes.contains { glob in candidates.contains { glob.matches($0) } }
    }
}

struct LintPathError: Error, CustomStringConvertible {
    var reason: String
    init(_ reason: String) { self.reason = reason }
    var description: String { reason }
}
