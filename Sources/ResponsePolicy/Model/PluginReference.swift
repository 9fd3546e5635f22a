/// The kinds of plugin a policy can name with `use:`.
public enum PluginKind: String, Sendable, Hashable, CaseIterable, Codable {
    case refresh, authorize, logout, extract, observe, store, coordination
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
    case string(String)
    /// A plain YAML number, as written (`007` stays `007`, `1e20` stays `1e20`).
    case number(String)
    case bool(Bool)
    case list([PluginOption])
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
