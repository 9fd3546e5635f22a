/// How serious a finding is. Errors make `policy lint` exit 1 and `Policy.load` throw.
public enum Severity: String, Sendable, Hashable, Codable, Comparable {
    /// Reported; the policy still loads.
    case warning
    /// The policy does not load; `policy lint` exits 1.
    case error

    /// A warning is less serious than an error.
    public static func < (a: Severity, b: Severity) -> Bool { a == .warning && b == .error }
}

/// One finding about a policy or script file.
///
/// Every finding has a stable snake-free, kebab-case rule id (`unknown-key`, `shadowed-rule`,
/// …) that scripts may match on, a 1-based range pointing at the offending key or value, and a
/// message written for the person fixing the file: lower-case, no trailing period, user values in
/// single quotes. Notes point at related places (the earlier rule that shadows this one).
public struct Diagnostic: Sendable, Hashable, CustomStringConvertible {
    /// A related place, with what it says about the finding.
    public struct Note: Sendable, Hashable {
        /// Where the related place is.
        public var range: SourceRange
        /// What the place has to do with the finding.
        public var message: String
        package init(range: SourceRange, message: String) {
            self.range = range
            self.message = message
        }
    }

    /// Whether it is an error or a warning.
    public var severity: Severity
    /// Where the offending key or value is.
    public var range: SourceRange
    /// The stable rule id (`unknown-key`), for scripts and suppressions.
    public var rule: String
    /// What is wrong, for the person fixing the file.
    public var message: String
    /// Related places; empty for most findings.
    public var notes: [Note]
    /// The file the finding is in, as the user named it; `nil` for in-memory sources.
    public var file: String?

    package init(
        _ severity: Severity, _ rule: String, _ message: String, at range: SourceRange, notes: [Note] = [],
        file: String? = nil
    ) {
        self.severity = severity
        self.rule = rule
        self.message = message
        self.range = range
        self.notes = notes
        self.file = file
    }

    package static func error(_ rule: String, _ message: String, at range: SourceRange, notes: [Note] = []) -> Self {
        Diagnostic(.error, rule, message, at: range, notes: notes)
    }

    package static func warning(_ rule: String, _ message: String, at range: SourceRange, notes: [Note] = []) -> Self {
        Diagnostic(.warning, rule, message, at: range, notes: notes)
    }

    /// `FILE:LINE:COL: error: MESSAGE [rule-id]`, the first line of the rendered form.
    public var description: String {
        "\(file ?? "<input>"):\(range.start.line):\(range.start.column): \(severity.rawValue): \(message) [\(rule)]"
    }
}

extension Array where Element == Diagnostic {
    package var hasErrors: Bool { contains { $0.severity == .error } }

    /// Sorted by position, errors before warnings at the same place, in a stable order.
    package func sortedByPosition() -> [Diagnostic] {
        enumerated().sorted { a, b in
            if a.element.range.start != b.element.range.start { return a.element.range.start < b.element.range.start }
            if a.element.severity != b.element.severity { return a.element.severity > b.element.severity }
            return a.offset < b.offset
        }.map(\.element)
    }
}
