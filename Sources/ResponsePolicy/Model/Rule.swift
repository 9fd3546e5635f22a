/// One entry of `rules:`: a condition and what to do when it holds.
package struct Rule: Sendable, Hashable {
    package var name: String
    package var when: Condition
    package var action: ActionKind
    /// The settings this rule's `then:` mapping overrides, resolved over its section; `nil`
    /// when `then:` is a plain action.
    package var retry: RetrySettings? {
        get { overridden?.retry }
        set { overridden = Overridden.make(retry: newValue, refresh: refresh, logout: logout) }
    }
    package var refresh: RefreshSettings? {
        get { overridden?.refresh }
        set { overridden = Overridden.make(retry: retry, refresh: newValue, logout: logout) }
    }
    package var logout: LogoutSettings? {
        get { overridden?.logout }
        set { overridden = Overridden.make(retry: retry, refresh: refresh, logout: newValue) }
    }
    /// The three above, boxed and `nil` when there are none: inline, three optional sections
    /// made every rule of a 20,000-rule file half a kilobyte larger, and most rules override
    /// nothing.
    private var overridden: Overridden?
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

extension Rule {
    /// A rule's overridden settings by reference, compared and hashed by value. Immutable: a
    /// change makes a new box, so `Rule` keeps value semantics.
    final class Overridden: Sendable, Hashable {
        let retry: RetrySettings?
        let refresh: RefreshSettings?
        let logout: LogoutSettings?

        private init(retry: RetrySettings?, refresh: RefreshSettings?, logout: LogoutSettings?) {
            self.retry = retry
            self.refresh = refresh
            self.logout = logout
        }

        static func make(retry: RetrySettings?, refresh: RefreshSettings?, logout: LogoutSettings?) -> Overridden? {
            retry == nil && refresh == nil && logout == nil
                ? nil : Overridden(retry: retry, refresh: refresh, logout: logout)
        }

        static func == (a: Overridden, b: Overridden) -> Bool {
            a === b || (a.retry == b.retry && a.refresh == b.refresh && a.logout == b.logout)
        }

        func hash(into hasher: inout Hasher) {
            hasher.combine(retry)
            hasher.combine(refresh)
            hasher.combine(logout)
        }
    }
}

/// Positions of a rule's parts.
package struct RuleSource: Sendable, Hashable {
    /// The `name:` value, when one was written.
    package var name: SourceRange?
    package var when: SourceRange?
    package var then: SourceRange?
    /// Each business code's position, by code text.
    package var codes = CodePositions()
    /// Positions of `then:` override keys (`on-exhausted`, `methods`, …), by key.
    package var keys: [String: SourceRange] = [:]
}

/// Business codes' positions by code text: a short list, and a dictionary only for a rule that
/// names more than a few codes. A dictionary per rule cost a 20,000-rule file 2.7 MB where
/// nearly every rule names one code.
package struct CodePositions: Sendable, Hashable {
    private struct Entry: Sendable, Hashable {
        var code: String
        var range: SourceRange
    }

    private static let listLimit = 8
    private var list: [Entry] = []
    private var table: [String: SourceRange]?

    package init() {}

    package subscript(code: String) -> SourceRange? {
        get {
            if let table { return table[code] }
            return list.first { $0.code == code }?.range
        }
        set {
            if table != nil {
                table?[code] = newValue
                return
            }
            if let index = list.firstIndex(where: { $0.code == code }) {
                if let newValue { list[index].range = newValue } else { list.remove(at: index) }
            } else if let newValue {
                list.append(Entry(code: code, range: newValue))
                if list.count > Self.listLimit {
                    table = Dictionary(list.map { ($0.code, $0.range) }, uniquingKeysWith: { first, _ in first })
                    list = []
                }
            }
        }
    }
}
