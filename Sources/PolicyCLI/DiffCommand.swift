import Foundation
import ResponsePolicy

/// `policy diff [--format text|json] [--plugin KIND:NAME]... OLD NEW`: what a policy change does
/// to behaviour, for review. Exit 0 when behaviour is the same, 1 when it differs.
enum DiffCommand {
    enum Format: String, CaseIterable, Sendable { case text, json }

    static let format = Option.choice(["--format"], "format", default: Format.text, help: "text (default) or json.")
    static let plugin = Option.plugin()

    static let spec = CommandSpec(
        name: "diff",
        summary: "Show what changes in behaviour (not in text) between two policies.",
        arguments: [
            .init(name: "OLD", help: "The policy before the change."),
            .init(name: "NEW", help: "The policy after the change."),
        ],
        options: [format.declaration, plugin.declaration],
        exitCodes: [
            (0, "the two policies behave the same"), (1, "behaviour differs"), (64, "usage error"),
            (65, "a policy has errors (run 'policy lint')"), (66, "a policy cannot be read"),
        ])

    static func run(_ arguments: ParsedArguments, output: CommandOutput) throws(UsageError) -> Int32 {
        let format = arguments[Self.format]
        guard arguments.positional.count == 2 else {
            throw UsageError(
                message: arguments.positional.count < 2
                    ? "Missing expected argument '\(arguments.positional.isEmpty ? "OLD" : "NEW")'"
                    : "Unexpected argument '\(arguments.positional[2])'")
        }
        let catalog = try catalog(from: arguments[plugin])
        var policies: [Policy] = []
        for path in arguments.positional {
            let (policy, code) = loadPolicy(path, catalog: catalog, output: output)
            guard let policy else { return code == ExitCode.failure ? ExitCode.dataError : code }
            policies.append(policy)
        }
        let diff = PolicyDiff(old: policies[0], new: policies[1])
        for note in diff.notes { output.stderr("note: \(note)\n") }
        if format == .json {
            output.stdout(json(diff) + "\n")
        } else {
            output.stdout(text(diff, old: arguments.positional[0], new: arguments.positional[1]))
        }
        return diff.changes.isEmpty ? ExitCode.success : ExitCode.failure
    }

    /// Changes grouped by scope, then by rule:
    ///
    ///     default (all other requests):
    ///       retry.max-retries: 3 -> 5
    ///       rule 'transient': when: status 503 -> status 502, 503
    ///       rule 'transient': on-exhausted, budget leads to: deliver -> logout
    ///       refresh on: code 1401 -> code 1401, status 401
    ///       worst case: 4 attempts, … -> 6 attempts, …
    static func text(_ diff: PolicyDiff, old: String, new: String) -> String {
        guard !diff.changes.isEmpty else { return "no change in behaviour between '\(old)' and '\(new)'\n" }
        var out = ""
        var scopes: [String] = []
        for change in diff.changes where !scopes.contains(change.scope) { scopes.append(change.scope) }
        for scope in scopes {
            out += (scope == "default" ? "all other requests (top level)" : scope) + ":\n"
            var lines: [String] = []
            var previous: PolicyDiff.Change?
            for change in diff.changes where change.scope == scope {
                // Escalation edges of one rule that change alike (on-exhausted, and the budget
                // and not-retryable edges that follow it) share a line.
                if change.kind == .escalation, var merged = previous, merged.kind == .escalation,
                    merged.rule == change.rule, merged.old == change.old, merged.new == change.new
                {
                    merged.key += ", " + change.key
                    lines[lines.count - 1] = line(merged)
                    previous = merged
                    continue
                }
                lines.append(line(change))
                previous = change
            }
            for text in lines { out += "  " + text + "\n" }
        }
        let count = diff.changes.count
        out += "\(count) change\(count == 1 ? "" : "s") in behaviour\n"
        return out
    }

    static func line(_ change: PolicyDiff.Change) -> String {
        let from = change.old ?? "none"
        let to = change.new ?? "none"
        let rule = change.rule.map { "rule '\($0)': " } ?? ""
        switch change.kind {
        case .routeAdded: return "route added"
        case .routeRemoved: return "route removed"
        case .ruleAdded: return "rule '\(change.rule ?? "?")' added: \(to)"
        case .ruleRemoved: return "rule '\(change.rule ?? "?")' removed: \(from)"
        case .rule, .setting: return "\(rule)\(change.key): \(from) -> \(to)"
        case .escalation: return "\(rule)\(change.key) leads to: \(from) -> \(to)"
        case .trigger:
            let verb = ["refresh": "refreshes on", "logout": "logs out on", "retry": "retries on", "fail": "fails on"]
            let label = verb[change.key] ?? change.key
            let before = items(change.old)
            let after = items(change.new)
            // Long lists (a policy with thousands of codes) are written as what they gain and lose.
            guard before.count + after.count > longList else { return "\(label): \(from) -> \(to)" }
            let had = Set(before)
            let has = Set(after)
            let added = after.filter { !had.contains($0) }
            let removed = before.filter { !has.contains($0) }
            var parts: [String] = []
            if !added.isEmpty { parts.append("+ " + added.joined(separator: ", ")) }
            if !removed.isEmpty { parts.append("- " + removed.joined(separator: ", ")) }
            return "\(label): \(parts.joined(separator: "; ")) (\(before.count) -> \(after.count) items)"
        case .worstCase: return "worst case: \(from) -> \(to)"
        }
    }

    /// Trigger lists longer than this together are shown as their difference.
    static let longList = 16

    /// A trigger list's items: `status 500-502`, `code 1401 on POST, PUT`, `error timeout`.
    static func items(_ list: String?) -> [String] {
        guard let list else { return [] }
        var out: [String] = []
        var start = list.startIndex
        var search = list.startIndex
        while let comma = list.range(of: ", ", range: search..<list.endIndex) {
            let next = list[comma.upperBound...]
            if next.hasPrefix("status ") || next.hasPrefix("code ") || next.hasPrefix("error ") {
                out.append(String(list[start..<comma.lowerBound]))
                start = comma.upperBound
            }
            search = comma.upperBound
        }
        out.append(String(list[start...]))
        return out
    }

    static func json(_ diff: PolicyDiff) -> String {
        let items = diff.changes.map { change in
            JSONText.object([
                ("kind", JSONText.string(change.kind.rawValue)), ("scope", JSONText.string(change.scope)),
                ("rule", change.rule.map(JSONText.string) ?? "null"), ("key", JSONText.string(change.key)),
                ("old", change.old.map(JSONText.string) ?? "null"), ("new", change.new.map(JSONText.string) ?? "null"),
            ])
        }
        return JSONText.object([
            ("same", diff.changes.isEmpty ? "true" : "false"), ("changes", "[" + items.joined(separator: ",") + "]"),
        ])
    }
}
