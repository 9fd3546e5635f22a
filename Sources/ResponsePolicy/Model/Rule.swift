/// One entry of `rules:`: a condition and what to do when it holds.
package struct Rule: Sendable, Hashable {
    package var name: String
    package var when: Condition
    package var action: ActionKind
    /// The settings this rule's `then:` mapping overrides, resolved over its section; `nil`
    /// when `then:` is a plain action.
    package var retry: RetrySettings?
    package var refresh: RefreshSettings?
    package var logout: LogoutSettings?
    package var range: SourceRange
    /// The `then:` mapping as written, re-applied over each route's sections.
    package var overrides: YAMLNode?
    /// Where the parts of the rule were written, for findings that point at them.
    package var source = RuleSource()

    package init(name: String, when: Condition, action: ActionKind, range: SourceRange = .fileStart) {
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
