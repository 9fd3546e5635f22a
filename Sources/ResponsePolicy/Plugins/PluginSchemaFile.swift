import Foundation

/// Host plugins' option schemas as a YAML file, so CI lints policies against the same schemas the
/// service checks at load: `policy lint --plugins plugins.yaml`.
///
/// Why a file: the `policy` tool cannot load the host's Swift code, and `--plugin refresh:my-sso`
/// only declares a name, so a typo in a host plugin's options would pass lint and fail at deploy.
/// The service writes the file from its registry (a test or a `--export-plugin-schemas` flag of
/// its own); the file is committed next to the policies and CI passes it to lint.
///
/// ```yaml
/// plugins: 1
/// refresh:
///   my-sso:
///     options:
///       realm: { type: string, required: true, summary: "the SSO realm" }
///       mode: { type: string, values: [fast, safe] }
/// observe:
///   metrics: any        # registered without a schema: takes any options
/// ```
///
/// Types: `string`, `url`, `duration`, `integer`, `boolean`, `string-map`, `string-list`,
/// `value-path`.
enum PluginSchemaFile {
    static let typeNames: [(PluginSchema.OptionType, String)] = [
        (.string, "string"), (.url, "url"), (.duration, "duration"), (.integer, "integer"), (.boolean, "boolean"),
        (.stringMap, "string-map"), (.stringList, "string-list"), (.valuePath, "value-path"),
    ]

    static func name(of type: PluginSchema.OptionType) -> String {
        typeNames.first { $0.0 == type }?.1 ?? "string"
    }

    /// The YAML for `catalog`'s host plugins (built-ins are left out: every `policy` knows them).
    static func export(_ catalog: PluginCatalog) -> String {
        var out = "# Host plugins and their options, for `policy lint` "
        out += "(found beside the policies, or --plugins FILE).\n"
        out += "# Written by PluginRegistry.exportSchemas(); regenerate it when a plugin changes.\n"
        out += "plugins: 1\n"
        for kind in PluginKind.allCases {
            let names = catalog.names(kind).filter { !catalog.isBuiltin(kind, $0) }
            guard !names.isEmpty else { continue }
            out += "\(kind.rawValue):\n"
            for name in names {
                guard case .some(.some(let schema)) = catalog.schema(kind, name) else {
                    out += "  \(PolicyEvent.quote(name)): any\n"
                    continue
                }
                if schema.options.isEmpty {
                    out += "  \(PolicyEvent.quote(name)): { options: {} }\n"
                    continue
                }
                out += "  \(PolicyEvent.quote(name)):\n    options:\n"
                for option in schema.options {
                    var fields = ["type: \(Self.name(of: option.type))"]
                    if option.required { fields.append("required: true") }
                    if !option.summary.isEmpty { fields.append("summary: \(PolicyEvent.quote(option.summary))") }
                    if !option.values.isEmpty {
                        fields.append("values: [\(option.values.map(PolicyEvent.quote).joined(separator: ", "))]")
                    }
                    out += "      \(PolicyEvent.quote(option.name)): { \(fields.joined(separator: ", ")) }\n"
                }
                if !schema.forbiddenSecrets.isEmpty {
                    out += "    secrets:\n"
                    for key in schema.forbiddenSecrets.keys.sorted() {
                        out +=
                            "      \(PolicyEvent.quote(key)): \(PolicyEvent.quote(schema.forbiddenSecrets[key] ?? ""))\n"
                    }
                }
            }
        }
        return out
    }

    /// Reads a schema file into declarations; every problem found, positioned.
    static func read(
        _ bytes: [UInt8], file: String?
    ) -> (declarations: [(PluginKind, String, PluginSchema?)], diagnostics: [Diagnostic]) {
        let parsed = Policy.parse(bytes: bytes, limits: .default)
        var diagnostics = parsed.diagnostics
        var declarations: [(PluginKind, String, PluginSchema?)] = []
        func report(_ message: String, _ range: SourceRange) {
            diagnostics.append(Diagnostic(.error, "invalid-plugin-schema", message, at: range, file: file))
        }
        guard let root = parsed.root else {
            if diagnostics.isEmpty { report("the plugin schema file is empty", .fileStart) }
            return (declarations, diagnostics)
        }
        guard let sections = root.pairs else {
            report("the plugin schema file must be a mapping with 'plugins: 1'", root.range)
            return (declarations, diagnostics)
        }
        if !sections.contains(where: { $0.key.scalar == "plugins" && $0.value.scalar == "1" }) {
            report("the plugin schema file must say 'plugins: 1'", root.range)
        }
        for section in sections {
            guard let key = section.key.scalar, key != "plugins" else { continue }
            guard let kind = PluginKind(rawValue: key) else {
                report(
                    "unknown plugin kind '\(key.truncatedForMessage)'"
                        + Suggestion.hint(for: key, in: PluginKind.allCases.map(\.rawValue)), section.key.range)
                continue
            }
            guard let plugins = section.value.pairs else {
                report("'\(key)' must map plugin names to their options", section.value.range)
                continue
            }
            for plugin in plugins {
                guard let name = plugin.key.scalar, !name.isEmpty else { continue }
                if plugin.value.scalar == "any" {
                    declarations.append((kind, name, nil))
                    continue
                }
                guard let fields = plugin.value.pairs else {
                    report(
                        "plugin '\(name.truncatedForMessage)' must be 'any' or a mapping with 'options'",
                        plugin.value.range)
                    continue
                }
                var options: [PluginSchema.Option] = []
                var secrets: [String: String] = [:]
                for field in fields {
                    switch field.key.scalar {
                    case "options":
                        for entry in field.value.pairs ?? [] {
                            if let option = readOption(entry, report) { options.append(option) }
                        }
                    case "secrets":
                        for entry in field.value.pairs ?? [] {
                            if let key = entry.key.scalar, let instead = entry.value.scalar { secrets[key] = instead }
                        }
                    default:
                        let key = field.key.scalar ?? ""
                        let hint = Suggestion.hint(for: key, in: ["options", "secrets"])
                        report(
                            "unknown key '\(key.truncatedForMessage)'"
                                + (hint.isEmpty ? "; a plugin has 'options' and 'secrets'" : hint),
                            field.key.range)
                    }
                }
                declarations.append((kind, name, PluginSchema(options, forbiddenSecrets: secrets)))
            }
        }
        return (declarations, diagnostics)
    }

    private static func readOption(
        _ entry: YAMLNode.Pair, _ report: (String, SourceRange) -> Void
    ) -> PluginSchema.Option? {
        guard let name = entry.key.scalar, let fields = entry.value.pairs else {
            report("an option must map its name to { type: …, required: …, summary: … }", entry.value.range)
            return nil
        }
        var type: PluginSchema.OptionType?
        var required = false
        var summary = ""
        var values: [String] = []
        for field in fields {
            let text = field.value.scalar
            switch field.key.scalar {
            case "type":
                type = typeNames.first { $0.1 == text }?.0
                if type == nil {
                    report(
                        "unknown option type '\((text ?? "").truncatedForMessage)'"
                            + Suggestion.hint(for: text ?? "", in: typeNames.map(\.1)), field.value.range)
                    return nil
                }
            case "required": required = text == "true"
            case "summary": summary = text ?? ""
            case "values": values = (field.value.items ?? []).compactMap(\.scalar)
            default:
                let key = field.key.scalar ?? ""
                let hint = Suggestion.hint(for: key, in: ["type", "required", "summary", "values"])
                report(
                    "unknown key '\(key.truncatedForMessage)'"
                        + (hint.isEmpty ? "; an option has 'type', 'required', 'summary' and 'values'" : hint),
                    field.key.range)
            }
        }
        guard let type else {
            report("option '\(name.truncatedForMessage)' needs a 'type'", entry.key.range)
            return nil
        }
        return PluginSchema.Option(name, type, required: required, summary, values: values)
    }
}

extension PluginRegistry {
    /// The option schemas of this registry's host plugins as YAML, for `policy lint --plugins FILE`.
    ///
    /// ```swift
    /// // In a test of the service, so CI always lints against the current schemas:
    /// try registry.exportSchemas().write(toFile: "policies/plugins.yaml", atomically: true, encoding: .utf8)
    /// ```
    public func exportSchemas() -> String { PluginSchemaFile.export(catalog) }
}

extension PluginCatalog {
    /// Whether a parsed file is a plugin schema file (top-level `plugins:` and no `policy:`), so
    /// `policy lint FOLDER` checks it as one rather than as a policy.
    package static func isSchemaFile(_ root: YAMLNode?) -> Bool {
        guard let pairs = root?.pairs else { return false }
        return pairs.contains { $0.key.scalar == "plugins" } && !pairs.contains { $0.key.scalar == "policy" }
    }

    /// The findings of a plugin schema file, positioned in `file`.
    package static func checkSchemaFile(_ bytes: [UInt8], file: String) -> [Diagnostic] {
        PluginSchemaFile.read(bytes, file: file).diagnostics.map { diagnostic in
            var positioned = diagnostic
            positioned.file = file
            return positioned
        }
    }

    /// Declares the host plugins of a schema file written by ``PluginRegistry/exportSchemas()``.
    ///
    /// - Throws: ``PolicyError/invalid(file:diagnostics:)`` with every problem in the file.
    public mutating func declare(schemasYAML text: String, file: String? = nil) throws(PolicyError) {
        let (declarations, found) = PluginSchemaFile.read(Array(text.utf8), file: file)
        let diagnostics = found.map { diagnostic in
            var positioned = diagnostic
            positioned.file = file
            return positioned
        }
        guard !diagnostics.hasErrors else { throw .invalid(file: file, diagnostics: diagnostics) }
        for (kind, name, schema) in declarations where !isBuiltin(kind, name) {
            declare(kind, name, schema: schema)
        }
    }
}
