import Foundation
import ResponsePolicy

/// `# policy-lint: disable=RULE[,RULE…] reason…` comments: accepting a warning on purpose, so
/// `--strict` stays usable.
///
/// A comment after a value applies to its own line; a comment alone on a line applies to the
/// next line that is not blank or a comment. Errors cannot be suppressed. A suppression that
/// suppresses nothing is itself reported (`unused-suppression`), so it cannot outlive its reason
/// and hide the next real problem.
///
/// ```yaml
/// retry:
///   max-delay: none  # policy-lint: disable=unbounded-backoff the deadline bounds every wait
/// ```
struct LintSuppressions {
    struct Entry {
        var rule: String
        /// Where the rule's name is written, for findings about the suppression itself.
        var range: SourceRange
        /// The line whose findings it suppresses.
        var target: Int
        var reason: String
    }

    /// A finding that was suppressed, and why.
    struct Suppressed {
        var diagnostic: Diagnostic
        /// The comment's reason, or `--disable` for the command-line option.
        var justification: String
        var inSource: Bool
    }

    var entries: [Entry] = []
    /// Problems with the comments themselves (an unknown directive).
    var problems: [Diagnostic] = []

    static let marker = "policy-lint:"

    /// Finds the suppression comments in a file's text.
    init(source: String) {
        // Most files have no such comment: a byte search decides that without splitting the
        // text into lines of Characters (a tenth of lint's time on a 20,000-rule file).
        guard Self.mentionsMarker(source) else { return }
        let lines = source.split(separator: "\n", omittingEmptySubsequences: false)
        for (index, line) in lines.enumerated() {
            guard let comment = Self.comment(in: line) else { continue }
            let before = line[..<comment.hash]
            var target = index + 1
            if before.allSatisfy({ $0 == " " || $0 == "\t" }) {
                // Alone on its line: applies to the next line holding something other than a comment.
                var next = index + 1
                while next < lines.count {
                    let trimmed = lines[next].drop { $0 == " " || $0 == "\t" }
                    if !trimmed.isEmpty, !trimmed.hasPrefix("#"), trimmed != "\r" { break }
                    next += 1
                }
                target = next + 1
            }
            let text = line[comment.directive...]
            let column = line[..<comment.directive].unicodeScalars.count + 1
            guard text.hasPrefix("disable=") else {
                problems.append(
                    .warning(
                        "unused-suppression",
                        "unknown lint directive; write '# policy-lint: disable=RULE reason'",
                        at: SourceRange(line: index + 1, column: column)))
                continue
            }
            let body = text.dropFirst("disable=".count)
            let names = body.prefix { $0 != " " && $0 != "\t" && $0 != "\r" }
            let reason = body.dropFirst(names.count).trimmingCharacters(in: [" ", "\t", "\r"])
            var offset = column + "disable=".count
            for name in names.split(separator: ",", omittingEmptySubsequences: false) {
                entries.append(
                    Entry(
                        rule: String(name), range: SourceRange(line: index + 1, column: offset), target: target,
                        reason: reason))
                offset += name.unicodeScalars.count + 1
            }
        }
    }

    /// Whether `policy-lint:` occurs anywhere in `source`, by its UTF-8 bytes.
    static func mentionsMarker(_ source: String) -> Bool {
        let needle = Array(marker.utf8)
        return source.utf8.withContiguousStorageIfAvailable { bytes -> Bool in
            guard bytes.count >= needle.count else { return false }
            var index = 0
            let last = bytes.count - needle.count
            while index <= last {
                if bytes[index] == needle[0] {
                    var matched = 1
                    while matched < needle.count, bytes[index + matched] == needle[matched] { matched += 1 }
                    if matched == needle.count { return true }
                }
                index += 1
            }
            return false
        } ?? source.contains(marker)
    }

    /// The `#` of a `# policy-lint:` comment on `line` and where its directive starts; `nil`
    /// when the line has none. A `#` counts only at the start or after a space, as in YAML.
    static func comment(in line: Substring) -> (hash: Substring.Index, directive: Substring.Index)? {
        var index = line.startIndex
        while let hash = line[index...].firstIndex(of: "#") {
            let atStart = hash == line.startIndex
            if atStart || line[line.index(before: hash)] == " " || line[line.index(before: hash)] == "\t" {
                var start = line.index(after: hash)
                while start < line.endIndex, line[start] == " " { start = line.index(after: start) }
                if line[start...].hasPrefix(marker) {
                    var directive = line.index(start, offsetBy: marker.count)
                    while directive < line.endIndex, line[directive] == " " {
                        directive = line.index(after: directive)
                    }
                    return (hash, directive)
                }
            }
            index = line.index(after: hash)
        }
        return nil
    }

    /// Splits `diagnostics` into those kept and those suppressed by these comments or by
    /// `--disable`; adds a warning for each suppression that suppressed nothing.
    func apply(
        to diagnostics: [Diagnostic], disabled: Set<String>, known: [String: Severity], file: String?
    ) -> (kept: [Diagnostic], suppressed: [Suppressed]) {
        var kept: [Diagnostic] = []
        var suppressed: [Suppressed] = []
        var used = Set<Int>()
        var blockedErrors: [Int: String] = [:]
        // By target line, so a file with many findings and many comments is not scanned per finding.
        var byLine: [Int: [Int]] = [:]
        for (index, entry) in entries.enumerated() { byLine[entry.target, default: []].append(index) }
        for diagnostic in diagnostics {
            let matching = (byLine[diagnostic.range.start.line] ?? []).filter { entries[$0].rule == diagnostic.rule }
            if diagnostic.severity == .error {
                for index in matching { blockedErrors[index] = diagnostic.rule }
                kept.append(diagnostic)
            } else if let index = matching.first {
                used.formUnion(matching)
                suppressed.append(
                    Suppressed(diagnostic: diagnostic, justification: entries[index].reason, inSource: true))
            } else if disabled.contains(diagnostic.rule) {
                suppressed.append(Suppressed(diagnostic: diagnostic, justification: "--disable", inSource: false))
            } else {
                kept.append(diagnostic)
            }
        }
        var notes = problems
        for (index, entry) in entries.enumerated() where !used.contains(index) {
            let message: String
            if entry.rule.isEmpty {
                message = "the suppression names no rule; write '# policy-lint: disable=RULE reason'"
            } else if known[entry.rule] == nil {
                let hint = Suggestion.closest(to: entry.rule, in: known.keys.sorted()).map { "; did you mean '\($0)'?" }
                message = "the suppression names an unknown rule '\(entry.rule)'" + (hint ?? "")
            } else if blockedErrors[index] != nil || known[entry.rule] == .error {
                message = "'\(entry.rule)' is an error and cannot be suppressed; fix the policy instead"
            } else {
                message = "the suppression of '\(entry.rule)' is unused: line \(entry.target) has no such finding"
            }
            notes.append(.warning("unused-suppression", message, at: entry.range))
        }
        let extra = notes.map { note -> Diagnostic in
            var copy = note
            copy.file = file
            return copy
        }
        return ((kept + extra).sortedByPosition(), suppressed)
    }
}
