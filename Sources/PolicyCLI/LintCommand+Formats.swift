import Foundation
import ResponsePolicy

extension LintCommand {
    /// The findings of one run, rendered for machines: JSON, SARIF 2.1.0 for code-scanning
    /// uploads, and GitHub workflow commands for inline annotations in a pull request.
    struct Report {
        var results: [FileResult]
        var unreadable: [(String, String)]
        var errors: Int
        var warnings: Int
        var suppressed: Int
        /// Where rules are documented: lint-rules.md (which `policy lint --list-rules` generates)
        /// where this binary finds it.
        var documentation: DocumentationLinks

        /// Where a rule is documented: its section of lint-rules.md.
        func documentation(_ rule: String) -> String { documentation.lintRule(rule) }

        // MARK: - JSON

        /// SPEC §4's object; each finding also carries, after SPEC's six keys, its end, its
        /// documentation anchor and its related locations (the notes). `suppressed` appears when
        /// something was.
        func json() -> String {
            let unreadableItems = unreadable.map { path, reason in
                JSONText.object([
                    ("file", JSONText.string(path)), ("line", "0"), ("column", "0"),
                    ("severity", JSONText.string("error")), ("rule", JSONText.string("unreadable-file")),
                    ("message", JSONText.string("cannot read the file: \(reason)")), ("endLine", "0"),
                    ("endColumn", "0"), ("doc", JSONText.string(documentation("unreadable-file"))),
                    ("related", "[]"),
                ])
            }
            let items = results.flatMap(\.diagnostics).map { d in
                let related = d.notes.map { note in
                    JSONText.object([
                        ("file", JSONText.string(d.file ?? "")), ("line", String(note.range.start.line)),
                        ("column", String(note.range.start.column)), ("message", JSONText.string(note.message)),
                    ])
                }
                return JSONText.object([
                    ("file", JSONText.string(d.file ?? "")), ("line", String(d.range.start.line)),
                    ("column", String(d.range.start.column)), ("severity", JSONText.string(d.severity.rawValue)),
                    ("rule", JSONText.string(d.rule)), ("message", JSONText.string(d.message)),
                    ("endLine", String(max(d.range.end, d.range.start).line)),
                    ("endColumn", String(max(d.range.end, d.range.start).column)),
                    ("doc", JSONText.string(documentation(d.rule))),
                    ("related", "[" + related.joined(separator: ",") + "]"),
                ])
            }
            var pairs = [("files", String(results.count)), ("errors", String(errors)), ("warnings", String(warnings))]
            if suppressed > 0 { pairs.append(("suppressed", String(suppressed))) }
            pairs.append(("diagnostics", "[" + (unreadableItems + items).joined(separator: ",") + "]"))
            return JSONText.object(pairs)
        }

        // MARK: - SARIF

        /// SARIF 2.1.0: one run, every rule lint knows in the driver, one result per finding
        /// (suppressed ones included, marked with their suppression, as code scanning expects).
        func sarif() -> String {
            let rules = (Linter.descriptions + FileChecks.descriptions).sorted { $0.id < $1.id }
            var ruleIndex: [String: Int] = [:]
            for (index, rule) in rules.enumerated() { ruleIndex[rule.id] = index }
            let ruleObjects = rules.map { rule in
                let link = documentation(rule.id)
                var pairs: [(String, String)] = [
                    ("id", JSONText.string(rule.id)),
                    ("shortDescription", JSONText.object([("text", JSONText.string(rule.summary))])),
                    ("fullDescription", JSONText.object([("text", JSONText.string(rule.rationale))])),
                    ("help", help(rule)),
                ]
                // helpUri must be an absolute URI a code-scanning page can open: a served copy of
                // the docs (POLICY_DOCS_URL) is; a file on this machine is given in properties alone.
                if documentation.isWebURL { pairs.append(("helpUri", JSONText.string(link))) }
                pairs += [
                    ("properties", JSONText.object([("documentation", JSONText.string(link))])),
                    ("defaultConfiguration", JSONText.object([("level", JSONText.string(rule.severity.rawValue))])),
                ]
                return JSONText.object(pairs)
            }
            var items: [String] = unreadable.map { path, reason in
                result(
                    rule: "unreadable-file", index: ruleIndex["unreadable-file"], level: "error",
                    message: "cannot read the file: \(reason)", file: path, range: nil, notes: [], suppression: nil)
            }
            for file in results {
                for d in file.diagnostics {
                    items.append(
                        result(
                            rule: d.rule, index: ruleIndex[d.rule], level: d.severity.rawValue, message: d.message,
                            file: d.file ?? file.path, range: d.range, notes: d.notes, suppression: nil))
                }
                for s in file.suppressed {
                    let d = s.diagnostic
                    let suppression = JSONText.object([
                        ("kind", JSONText.string(s.inSource ? "inSource" : "external")),
                        ("justification", JSONText.string(s.justification)),
                    ])
                    items.append(
                        result(
                            rule: d.rule, index: ruleIndex[d.rule], level: d.severity.rawValue, message: d.message,
                            file: d.file ?? file.path, range: d.range, notes: d.notes, suppression: suppression))
                }
            }
            let driver = JSONText.object([
                ("name", JSONText.string("policy lint")), ("version", JSONText.string(PolicyCommand.version)),
                ("rules", "[" + ruleObjects.joined(separator: ",") + "]"),
            ])
            let run = JSONText.object([
                ("tool", JSONText.object([("driver", driver)])),
                // Columns count Unicode scalars, not UTF-16 units (SARIF's default).
                ("columnKind", JSONText.string("unicodeCodePoints")),
                ("results", "[" + items.joined(separator: ",") + "]"),
            ])
            return JSONText.object([
                ("$schema", JSONText.string("https://json.schemastore.org/sarif-2.1.0.json")),
                ("version", JSONText.string("2.1.0")), ("runs", "[" + run + "]"),
            ]) + "\n"
        }

        /// A rule's help: its summary and rationale, and in Markdown a link to its documentation.
        func help(_ rule: LintRuleDescription) -> String {
            let link = "See [\(rule.id)](\(documentation(rule.id)))."
            return JSONText.object([
                ("text", JSONText.string(rule.summary + ". " + rule.rationale)),
                ("markdown", JSONText.string("**\(rule.summary)**. \(rule.rationale)\n\n\(link)")),
            ])
        }

        func result(
            rule: String, index: Int?, level: String, message: String, file: String, range: SourceRange?,
            notes: [Diagnostic.Note], suppression: String?
        ) -> String {
            func location(_ range: SourceRange?, message: String? = nil, id: Int? = nil) -> String {
                var physical: [(String, String)] = [
                    ("artifactLocation", JSONText.object([("uri", JSONText.string(Self.uri(file)))]))
                ]
                if let range { physical.append(("region", Self.region(range))) }
                var pairs: [(String, String)] = []
                if let id { pairs.append(("id", String(id))) }
                pairs.append(("physicalLocation", JSONText.object(physical)))
                if let message { pairs.append(("message", JSONText.object([("text", JSONText.string(message))]))) }
                return JSONText.object(pairs)
            }
            var pairs: [(String, String)] = [("ruleId", JSONText.string(rule))]
            if let index { pairs.append(("ruleIndex", String(index))) }
            pairs += [
                ("level", JSONText.string(level)), ("message", JSONText.object([("text", JSONText.string(message))])),
                ("locations", "[" + location(range) + "]"),
            ]
            if !notes.isEmpty {
                let related = notes.enumerated().map { location($1.range, message: $1.message, id: $0 + 1) }
                pairs.append(("relatedLocations", "[" + related.joined(separator: ",") + "]"))
            }
            if let suppression { pairs.append(("suppressions", "[" + suppression + "]")) }
            return JSONText.object(pairs)
        }

        /// A region, start and end (end exclusive, as SARIF reads it; a finding at a point is an
        /// empty region there).
        static func region(_ range: SourceRange) -> String {
            let end = max(range.end, range.start)
            return JSONText.object([
                ("startLine", String(range.start.line)), ("startColumn", String(range.start.column)),
                ("endLine", String(end.line)), ("endColumn", String(end.column)),
            ])
        }

        /// A relative URI reference for a path as the user wrote it (spaces and the like escaped).
        static func uri(_ path: String) -> String {
            var allowed = CharacterSet.urlPathAllowed
            allowed.remove(charactersIn: ":")
            let trimmed = path.hasPrefix("./") ? String(path.dropFirst(2)) : path
            return trimmed.addingPercentEncoding(withAllowedCharacters: allowed) ?? trimmed
        }

        // MARK: - GitHub

        /// One workflow command per finding: `::error file=F,line=L,col=C,…::message`. GitHub shows
        /// them inline on the pull request's diff.
        func github() -> String {
            var out = ""
            for (path, reason) in unreadable {
                out += "::error file=\(Self.property(path)),title=\(Self.property("policy lint [unreadable-file]"))::"
                out += Self.data("cannot read the file: \(reason)") + "\n"
            }
            for d in results.flatMap(\.diagnostics) {
                let end = max(d.range.end, d.range.start)
                var properties = [
                    "file=" + Self.property(d.file ?? ""), "line=\(d.range.start.line)", "col=\(d.range.start.column)",
                    "endLine=\(end.line)", "endColumn=\(end.column)",
                ]
                properties.append("title=" + Self.property("policy lint [\(d.rule)]"))
                var message = d.message
                for note in d.notes {
                    message +=
                        "\nnote: line \(note.range.start.line), column \(note.range.start.column): \(note.message)"
                }
                message += "\nsee \(documentation(d.rule))"
                out += "::\(d.severity == .error ? "error" : "warning") \(properties.joined(separator: ","))::"
                out += Self.data(message) + "\n"
            }
            return out
        }

        /// Escapes a workflow command's message.
        static func data(_ text: String) -> String {
            text.replacingOccurrences(of: "%", with: "%25").replacingOccurrences(of: "\r", with: "%0D")
                .replacingOccurrences(of: "\n", with: "%0A")
        }

        /// Escapes a workflow command's property value.
        static func property(_ text: String) -> String {
            data(text).replacingOccurrences(of: ":", with: "%3A").replacingOccurrences(of: ",", with: "%2C")
        }
    }
}
