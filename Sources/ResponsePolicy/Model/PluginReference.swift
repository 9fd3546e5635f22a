/// The kinds of plugin a policy can name with `use:`.
public enum PluginKind: String, Sendable, Hashable, CaseIterable, Codable {
    /// Gets fresh credentials (`refresh:`); a ``RefreshPlugin``.
    case refresh
    /// Signs requests (`authorize:`); an ``AuthorizePlugin``.
    case authorize
    /// Tells the outside world the session ended (`logout:`); a ``LogoutPlugin``.
    case logout
    /// Finds a response's business code (`classify: { use: }`); a ``CodeExtractor``.
    case extract
    /// Receives every event (`observe:`); a ``PolicyObserver``.
    case observe
    /// Keeps credentials between runs (`store:`); a ``CredentialStore``.
    case store
    /// Shares the session with other processes (`coordination:`); a ``SessionCoordinator``.
    case coordination
}

/// A `use:` with its `with:` options, as written in the policy.
package struct PluginReference: Sendable, Hashable {
    package var kind: PluginKind
    package var name: String
    package var options: [String: PluginOption]
    /// Where `use:` was written; `nil` for defaults.
    package var range: SourceRange?

    package init(kind: PluginKind, name: String, options: [String: PluginOption] = [:], range: SourceRange? = nil) {
        self.kind = kind
        self.name = name
        self.options = options
        self.range = range
    }

    package static func == (a: Self, b: Self) -> Bool {
        a.kind == b.kind && a.name == b.name && a.options == b.options
    }

    package func hash(into hasher: inout Hasher) {
        hasher.combine(kind)
        hasher.combine(name)
    }
}

/// One `with:` option value, kept close to the YAML so any plugin can read it.
public enum PluginOption: Sendable, Hashable, CustomStringConvertible {
    /// A text (a quoted scalar, or a plain one that is not a number or a boolean).
    case string(String)
    /// A plain YAML number, as written (`007` stays `007`, `1e20` stays `1e20`).
    case number(String)
    /// `true` or `false`.
    case bool(Bool)
    /// A YAML sequence.
    case list([PluginOption])
    /// A YAML mapping, by key.
    case map([String: PluginOption])

    /// The value as text, when it is a scalar (a text, a number as written, `true`/`false`).
    public var string: String? {
        switch self {
        case .string(let text): return text
        case .number(let text): return text
        case .bool(let flag): return String(flag)
        default: return nil
        }
    }

    /// The value as a number, when it is one.
    public var double: Double? {
        switch self {
        case .number(let text), .string(let text): return Double(text)
        default: return nil
        }
    }

    /// The value as YAML-like text, texts quoted.
    public var description: String {
        switch self {
        case .string(let text): return "'\(text)'"
        case .number, .bool: return string ?? ""
        case .list(let items): return "[" + items.map(\.description).joined(separator: ", ") + "]"
        case .map(let map): return "{" + map.keys.sorted().joined(separator: ", ") + "}"
        }
    }
}
