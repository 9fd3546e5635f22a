/// One entry of `rules:`: a condition and what to do when it holds.
public struct Rule: Sendable, Hashable {
    public var name: String
    public var when: Condition
    public var action: ActionKind
    /// The settings this rule's `then:` mapping overrides, resolved over its section; `nil`
    /// when `then:` is a plain action.
    public var retry: RetrySettings?
    public var refresh: RefreshSettings?
    public var logout: LogoutSettings?
    public var range: SourceRange
    /// The `then:` mapping as written, re-applied over each route's sections.
    package var overrides: YAMLNode?
    /// Where the parts of the rule were written, for findings that point at them.
    package var source = RuleSource()

    public init(name: String, when: Condition, action: ActionKind, range: SourceRange = .fileStart) {
        self.name = name
        self.when = when
        self.action = action
        self.range = range
    }
}

/// Positions of a rule's parts.
package struct RuleSource: Sendable, Hashable {
    /// The `name:` value, when one was written.
    package var name: SourceRange?
    package var when: SourceRange?
    package var then: SourceRange?
    /// Each business code's position, by code text.
    package var codes: [String: SourceRange] = [:]
    /// Positions of `then:` override keys (`on-exhausted`, `methods`, …), by key.
    package var keys: [String: SourceRange] = [:]
}
