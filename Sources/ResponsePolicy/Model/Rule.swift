/// One entry of `rules:`: a condition and what to do when it holds.
///
/// A value type whose parts are held in one copy-on-write box: the decoded rules, every
/// scope's rules and every compiled rule hold the same box, so handing a rule on costs one
/// retain instead of copying a dozen fields (copies of `Rule` were a fifth of linting a
/// 20,000-rule file, and each compiled rule held a copy).
package struct Rule: Sendable, Hashable {
    package var name: String {
        _read { yield storage.name }
        _modify {
            makeUnique()
            yield &storage.name
        }
    }
    package var when: Condition {
        _read { yield storage.when }
        _modify {
            makeUnique()
            yield &storage.when
        }
    }
    package var action: ActionKind {
        get { storage.action }
        set {
            makeUnique()
            storage.action = newValue
        }
    }
    /// The settings this rule's `then:` mapping overrides, resolved over its section; `nil`
    /// when `then:` is a plain action.
    package var retry: RetrySettings? {
        get { storage.overridden?.retry }
        set { overridden = Overridden.make(retry: newValue, refresh: refresh, logout: logout) }
    }
    package var refresh: RefreshSettings? {
        get { storage.overridden?.refresh }
        set { overridden = Overridden.make(retry: retry, refresh: newValue, logout: logout) }
    }
    package var logout: LogoutSettings? {
        get { storage.overridden?.logout }
        set { overridden = Overridden.make(retry: retry, refresh: refresh, logout: newValue) }
    }
    /// Whether `then:` overrides any setting (one of the three above is set), read without
    /// copying a section out to compare it with `nil`.
    package var overridesSettings: Bool { storage.overridden != nil }
    /// The three above, boxed and `nil` when there are none: inline, three optional sections
    /// made every rule of a 20,000-rule file half a kilobyte larger, and most rules override
    /// nothing.
    private var overridden: Overridden? {
        get { storage.overridden }
        set {
            makeUnique()
            storage.overridden = newValue
        }
    }
    package var range: SourceRange {
        get { storage.range }
        set {
            makeUnique()
            storage.range = newValue
        }
    }
    /// The `then:` mapping as written, re-applied over each route's sections.
    package var overrides: YAMLNode? {
        _read { yield storage.overrides }
        _modify {
            makeUnique()
            yield &storage.overrides
        }
    }
    /// Where the parts of the rule were written, for findings that point at them.
    package var source: RuleSource {
        _read { yield storage.source }
        _modify {
            makeUnique()
            yield &storage.source
        }
    }

    private var storage: Storage

    package init(name: String, when: Condition, action: ActionKind, range: SourceRange = .fileStart) {
        storage = Storage(name: name, when: when, action: action, range: range)
    }

    /// Copies the box before a change when another rule shares it.
    private mutating func makeUnique() {
        if !isKnownUniquelyReferenced(&storage) { storage = storage.copy() }
    }

    package static func == (a: Rule, b: Rule) -> Bool {
        a.storage === b.storage || a.storage.hasSameParts(as: b.storage)
    }

    package func hash(into hasher: inout Hasher) {
        storage.hashParts(into: &hasher)
    }
}

extension Rule {
    /// A rule's parts. Mutable, but only through ``Rule``, which copies it first unless the
    /// rule holds the only reference (`isKnownUniquelyReferenced`): a box other rules can see
    /// is never written, so sharing one across threads is safe.
    ///
    /// Its fields skip the run-time exclusivity check (`@exclusivity(unchecked)`): every access
    /// goes through a ``Rule``, whose own accesses the compiler checks, and two rules share a box
    /// only while neither writes it, so two accesses to one box can never overlap. The check
    /// cost about 75 instructions per read, and the compile and lint passes read each of a large
    /// policy's rules a dozen times (27M instructions for a 20,000-rule file).
    private final class Storage: @unchecked Sendable {
        @exclusivity(unchecked) var name: String
        @exclusivity(unchecked) var when: Condition
        @exclusivity(unchecked) var action: ActionKind
        @exclusivity(unchecked) var overridden: Overridden?
        @exclusivity(unchecked) var range: SourceRange
        @exclusivity(unchecked) var overrides: YAMLNode?
        @exclusivity(unchecked) var source = RuleSource()

        init(name: String, when: Condition, action: ActionKind, range: SourceRange) {
            self.name = name
            self.when = when
            self.action = action
            self.range = range
        }

        func copy() -> Storage {
            let copy = Storage(name: name, when: when, action: action, range: range)
            copy.overridden = overridden
            copy.overrides = overrides
            copy.source = source
            return copy
        }

        func hasSameParts(as other: Storage) -> Bool {
            name == other.name && when == other.when && action == other.action && overridden == other.overridden
                && range == other.range && overrides == other.overrides && source == other.source
        }

        func hashParts(into hasher: inout Hasher) {
            hasher.combine(name)
            hasher.combine(when)
            hasher.combine(action)
            hasher.combine(overridden)
            hasher.combine(range)
            hasher.combine(overrides)
            hasher.combine(source)
        }
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

/// Business codes' positions by code text: the first inline, a short list after it, and a
/// dictionary only for a rule that names more than a few codes. A dictionary per rule cost a
/// 20,000-rule file 2.7 MB where nearly every rule names one code, and a one-entry list per
/// rule 1.3 MB more at lint's memory peak (the end of decoding).
package struct CodePositions: Sendable, Hashable {
    private struct Entry: Sendable, Hashable {
        var code: String
        var range: SourceRange
    }

    private static let listLimit = 8
    private var first: Entry?
    private var rest: [Entry] = []
    private var table: [String: SourceRange]?

    package init() {}

    package subscript(code: String) -> SourceRange? {
        get {
            if let table { return table[code] }
            if let first, first.code == code { return first.range }
            return rest.first { $0.code == code }?.range
        }
        set {
            if table != nil {
                table?[code] = newValue
                return
            }
            if first?.code == code {
                if let newValue {
                    first?.range = newValue
                } else {
                    first = rest.isEmpty ? nil : rest.removeFirst()
                }
            } else if let index = rest.firstIndex(where: { $0.code == code }) {
                if let newValue { rest[index].range = newValue } else { rest.remove(at: index) }
            } else if let newValue {
                let entry = Entry(code: code, range: newValue)
                guard let first else {
                    first = entry
                    return
                }
                rest.append(entry)
                if 1 + rest.count > Self.listLimit {
                    table = Dictionary(
                        ([first] + rest).map { ($0.code, $0.range) }, uniquingKeysWith: { earlier, _ in earlier })
                    self.first = nil
                    rest = []
                }
            }
        }
    }
}
