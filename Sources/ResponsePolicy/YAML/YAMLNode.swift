/// A YAML node with the source range it came from.
///
/// The loader resolves aliases and merge keys while building the tree, so a consumer sees plain
/// scalars, mappings and sequences. Scalars stay untyped text plus their style: the schema decides
/// what a scalar means, so YAML 1.1's `yes`/`no`/`on`/`off` never silently become booleans and a
/// quoted scalar is always a string.
package struct YAMLNode: Sendable, Hashable {
    package enum Style: Sendable, Hashable {
        case plain, singleQuoted, doubleQuoted, literal, folded
    }

    package struct Pair: Sendable, Hashable {
        package var key: YAMLNode
        package var value: YAMLNode
    }

    package enum Value: Sendable, Hashable {
        case scalar(String, Style)
        case mapping([Pair])
        case sequence([YAMLNode])
    }

    package var value: Value
    package var range: SourceRange
    /// The explicit tag, e.g. `!!str`, when one was written.
    package var tag: String?

    package init(_ value: Value, range: SourceRange, tag: String? = nil) {
        self.value = value
        self.range = range
        self.tag = tag
    }

    /// The scalar's text when this is a scalar.
    package var scalar: String? {
        if case .scalar(let text, _) = value { return text }
        return nil
    }

    package var isPlainScalar: Bool {
        if case .scalar(_, .plain) = value, tag == nil { return true }
        return false
    }

    /// A plain scalar that YAML reads as null: empty, `~` or `null`.
    package var isNull: Bool {
        if case .scalar(let text, .plain) = value, tag == nil {
            // By length first: asked of nearly every scalar the decoder reads, and four text
            // comparisons each time showed in profiles. (Only ASCII texts equal these.)
            switch text.utf8.count {
            case 0: return true
            case 1: return text == "~"
            case 4: return text == "null" || text == "Null" || text == "NULL"
            default: return false
            }
        }
        return false
    }

    package var pairs: [Pair]? {
        if case .mapping(let pairs) = value { return pairs }
        return nil
    }

    package var items: [YAMLNode]? {
        if case .sequence(let items) = value { return items }
        return nil
    }

    /// What the node is, for messages: `a mapping`, `a list`, `the number 3`, `the text 'x'`.
    package var kindDescription: String {
        switch value {
        case .mapping: return "a mapping"
        case .sequence: return "a list"
        case .scalar(let text, let style):
            if isNull { return "nothing (null)" }
            if style == .plain, Int(text) != nil || Double(text) != nil { return "the number \(text)" }
            return "'\(text.truncatedForMessage)'"
        }
    }
}

extension String {
    /// The text cut to 40 characters for quoting in a message, control characters made visible.
    package var truncatedForMessage: String {
        var out = ""
        for scalar in unicodeScalars.prefix(40) {
            out += scalar.value < 0x20 || scalar.value == 0x7F ? "?" : String(scalar)
        }
        return unicodeScalars.count > 40 ? out + "…" : out
    }
}
