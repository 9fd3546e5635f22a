/// Reads a YAML node tree as a schema-1 policy, collecting every problem as a diagnostic.
///
/// Why a hand-written decoder and not `Decodable`: the contract is positioned, friendly errors
/// for every problem in the file (not the first), "did you mean" hints, and scalar typing that
/// YAML 1.1 gets wrong for configuration (`no` is not `false`, `1401` and `"1401"` are the same
/// business code). Each `read…` helper reports what it could not read and returns `nil`, and the
/// caller keeps its default, so one mistake does not hide the next.
package struct PolicyDecoder {
    package var diagnostics: [Diagnostic] = []
    let catalog: PluginCatalog
    /// Set while re-applying a rule's `then:` over a route's sections, so problems are reported
    /// once, at the top level.
    var quiet = false
    /// Where keys of the sections were written, by dotted path (`retry.on-exhausted`,
    /// `routes.2.retry.methods`), for lint findings that point at a setting.
    package var locations: [String: SourceRange] = [:]

    package init(catalog: PluginCatalog) {
        self.catalog = catalog
    }

    mutating func report(_ diagnostic: Diagnostic) {
        if !quiet { diagnostics.append(diagnostic) }
    }

    // MARK: - Structure

    /// The pairs of a mapping whose keys are all in `allowed`; reports other keys with a hint.
    /// `what` names the mapping in messages (`'retry'`, `a rule`).
    mutating func mappingFields(
        _ node: YAMLNode, _ what: String, allowed: [String], ignorePrefix: String? = nil
    ) -> [(key: String, keyNode: YAMLNode, value: YAMLNode)]? {
        guard let pairs = mappingPairs(node, what) else { return nil }
        var result: [(key: String, keyNode: YAMLNode, value: YAMLNode)] = []
        result.reserveCapacity(pairs.count)
        for pair in pairs {
            // Ignored keys are skipped before they are checked, so they are never reported.
            if let ignorePrefix, let key = pair.key.scalar, key.hasPrefix(ignorePrefix) { continue }
            guard let key = fieldKey(pair, what, allowed: allowed) else { continue }
            result.append((key, pair.key, pair.value))
        }
        return result
    }

    /// The pairs of a mapping, for reading key by key with ``fieldKey(_:_:allowed:)``: what
    /// ``mappingFields(_:_:allowed:ignorePrefix:)`` reads, without making the list of fields
    /// (each a tuple of two copied nodes), for the mappings read once per rule. Empty for null;
    /// `nil`, reported, for anything but a mapping.
    mutating func mappingPairs(_ node: YAMLNode, _ what: String) -> YAMLNode.Pairs? {
        guard let pairs = node.pairs else {
            if node.isNull { return [] }
            report(.error("invalid-type", "\(what) must be a mapping, not \(node.kindDescription)", at: node.range))
            return nil
        }
        return pairs
    }

    /// A pair's key when it is one of `allowed`; reported as ``mappingFields(_:_:allowed:ignorePrefix:)``
    /// reports it otherwise.
    mutating func fieldKey(_ pair: YAMLNode.Pair, _ what: String, allowed: [String]) -> String? {
        guard let key = pair.key.scalar else {
            report(
                .error("invalid-key", "keys must be plain names, not \(pair.key.kindDescription)", at: pair.key.range))
            return nil
        }
        guard allowed.contains(key) else {
            report(Self.unknownKey(key, in: what, allowed: allowed, at: pair.key.range))
            return nil
        }
        return key
    }

    /// The sections a key may have been meant for, to point at when it is written in another
    /// one (`cooldown:` under `retry:`). Read from the decoder's own key lists.
    static var sectionsByKey: [(section: String, keys: [String])] {
        [
            ("retry", retryKeys), ("refresh", refreshTuningKeys), ("logout", logoutTuningKeys),
            ("dispatch", dispatchKeys), ("when", whenKeys), ("classify", classifyKeys),
        ]
    }

    /// An unknown key, with the likeliest fix: a typo (`retyr` → `retry`), a shortened name
    /// (`retries` → `max-retries`), a key of another section (`cooldown` in `retry` belongs in
    /// `logout`), a section indented into another, or else every key allowed here.
    static func unknownKey(_ key: String, in what: String, allowed: [String], at range: SourceRange) -> Diagnostic {
        let shown = key.truncatedForMessage
        if let suggestion = Suggestion.closest(to: key, in: allowed) {
            return .error("unknown-key", "unknown key '\(shown)'; did you mean '\(suggestion)'?", at: range)
        }
        // A word of a longer key: `retries` for `max-retries`, `timeout` for `attempt-timeout`.
        let containing = allowed.filter { $0.split(separator: "-").contains(Substring(key)) }
        if key.count >= 4, containing.count == 1, let suggestion = containing.first {
            return .error("unknown-key", "unknown key '\(shown)'; did you mean '\(suggestion)'?", at: range)
        }
        if what == "a policy", key == "requests" {
            return .error(
                "unknown-key",
                "unknown key 'requests' in a policy; a simulation script has 'requests:' and names the policy file "
                    + "to run with 'policy: PATH' (a number after 'policy:' makes this file a policy)",
                at: range)
        }
        if what != "a policy", topLevelKeys.contains(key) {
            return .error(
                "unknown-key",
                "unknown key '\(shown)' in \(what); '\(key)' is a top-level section: move it out (check its indentation)",
                at: range)
        }
        if let home = sectionsByKey.first(where: { $0.keys.contains(key) && "'\($0.section)'" != what }) {
            let fix =
                home.section == "when"
                ? "write it under 'when:', as in when: { \(key): … }" : "move it to the '\(home.section)' section"
            return .error(
                "unknown-key", "unknown key '\(shown)' in \(what); '\(key)' is a key of '\(home.section)': \(fix)",
                at: range)
        }
        return .error(
            "unknown-key",
            "unknown key '\(key.truncatedForMessage)' in \(what); expected one of \(allowed.map { "'\($0)'" }.joined(separator: ", "))",
            at: range)
    }

    /// A list, or a single scalar read as a one-item list (`status: 401` means `status: [401]`).
    mutating func list(_ node: YAMLNode, _ key: String) -> YAMLNode.Items? {
        switch node.value {
        case .sequence(let items): return items
        case .scalar where !node.isNull: return YAMLNode.Items(single: node)
        default:
            report(.error("invalid-type", "'\(key)' must be a list, not \(node.kindDescription)", at: node.range))
            return nil
        }
    }

    // MARK: - Scalars

    mutating func string(_ node: YAMLNode, _ key: String) -> String? {
        guard case .scalar(let text, _) = node.value, !node.isNull else {
            report(.error("invalid-type", "'\(key)' must be a text, not \(node.kindDescription)", at: node.range))
            return nil
        }
        return text
    }

    /// A whole number in `range`. Quoted numbers are texts and refused.
    mutating func integer(_ node: YAMLNode, _ key: String, in range: ClosedRange<Int>) -> Int? {
        guard node.isPlainScalar, let text = node.scalar, Self.isInteger(text) else {
            if !node.isPlainScalar, let text = node.scalar, Self.isInteger(text) {
                report(
                    .error(
                        "invalid-type",
                        "'\(key)' must be a whole number, not the text '\(text.truncatedForMessage)'; remove the quotes",
                        at: node.range))
                return nil
            }
            report(
                .error("invalid-type", "'\(key)' must be a whole number, not \(node.kindDescription)", at: node.range))
            return nil
        }
        guard let value = Int(text) else {
            // Past Int's range: say which range is allowed, as for any other value outside it.
            report(
                .error(
                    "invalid-value",
                    "'\(key)' must be between \(range.lowerBound) and \(range.upperBound), not \(text.truncatedForMessage)",
                    at: node.range))
            return nil
        }
        guard range.contains(value) else {
            report(
                .error(
                    "invalid-value",
                    "'\(key)' must be between \(range.lowerBound) and \(range.upperBound), not \(value)",
                    at: node.range))
            return nil
        }
        return value
    }

    static func isInteger(_ text: String) -> Bool {
        let digits = text.hasPrefix("-") || text.hasPrefix("+") ? text.dropFirst() : Substring(text)
        return !digits.isEmpty && digits.allSatisfy { $0.isASCII && $0.isNumber }
    }

    mutating func number(_ node: YAMLNode, _ key: String, in range: ClosedRange<Double>) -> Double? {
        guard node.isPlainScalar, let text = node.scalar, let value = Double(text), value.isFinite else {
            if !node.isPlainScalar, let text = node.scalar, Double(text) != nil {
                report(
                    .error(
                        "invalid-type",
                        "'\(key)' must be a number, not the text '\(text.truncatedForMessage)'; remove the quotes",
                        at: node.range))
                return nil
            }
            report(.error("invalid-type", "'\(key)' must be a number, not \(node.kindDescription)", at: node.range))
            return nil
        }
        guard range.contains(value) else {
            report(
                .error(
                    "invalid-value",
                    "'\(key)' must be between \(formatNumber(range.lowerBound)) and \(formatNumber(range.upperBound)), not \(text)",
                    at: node.range))
            return nil
        }
        return value
    }

    /// `true` or `false` only: YAML 1.1's `yes`/`no`/`on`/`off` are refused with a hint.
    mutating func boolean(_ node: YAMLNode, _ key: String) -> Bool? {
        if node.isPlainScalar, let text = node.scalar {
            switch text {
            case "true", "True", "TRUE": return true
            case "false", "False", "FALSE": return false
            case "yes", "Yes", "YES", "on", "On", "ON", "y", "Y":
                report(
                    .error(
                        "invalid-type", "'\(key)' must be true or false; write true instead of '\(text)'",
                        at: node.range))
                return nil
            case "no", "No", "NO", "off", "Off", "OFF", "n", "N":
                report(
                    .error(
                        "invalid-type", "'\(key)' must be true or false; write false instead of '\(text)'",
                        at: node.range))
                return nil
            default: break
            }
        }
        if !node.isPlainScalar, let text = node.scalar, text == "true" || text == "false" {
            report(
                .error(
                    "invalid-type", "'\(key)' must be true or false, not the text '\(text)'; remove the quotes",
                    at: node.range))
            return nil
        }
        report(.error("invalid-type", "'\(key)' must be true or false, not \(node.kindDescription)", at: node.range))
        return nil
    }

    /// `'cooldown' cannot be negative: '-5s'; a duration is 0s or more, like 5s`.
    static func negativeDuration(_ key: String, _ text: String, suggest: String, at range: SourceRange) -> Diagnostic {
        .error(
            "invalid-duration",
            "'\(key)' cannot be negative: '\(text.truncatedForMessage)'; a duration is 0s or more, like "
                + suggest.truncatedForMessage,
            at: range)
    }

    /// A duration with a unit. `allowNone` accepts `none` (returned as `.some(nil)`).
    mutating func duration(_ node: YAMLNode, _ key: String, allowNone: Bool = false) -> Duration?? {
        guard case .scalar(let text, _) = node.value, !node.isNull else {
            report(
                .error(
                    "invalid-type", "'\(key)' must be a duration like 20s, not \(node.kindDescription)", at: node.range)
            )
            return nil
        }
        if allowNone, text == "none" { return .some(nil) }
        if let duration = Duration.parsePolicy(text) { return .some(duration) }
        if Double(text) != nil {
            if text.hasPrefix("-") {
                report(Self.negativeDuration(key, text, suggest: "\(text.dropFirst())s", at: node.range))
            } else {
                report(
                    .error(
                        "invalid-duration",
                        "'\(key)' needs a unit; a bare number could be seconds or milliseconds: write \(text)s or \(text)ms",
                        at: node.range))
            }
        } else if text.hasPrefix("-"), Duration.parsePolicy(String(text.dropFirst())) != nil {
            report(Self.negativeDuration(key, text, suggest: String(text.dropFirst()), at: node.range))
        } else if let unit = ["ms", "s", "m", "h"].first(where: { text.hasSuffix($0) }),
            let value = Double(text.dropLast(unit.count)), value >= 0
        {
            report(
                .error(
                    "invalid-duration",
                    "'\(key)' is out of range: '\(text.truncatedForMessage)'; a duration can be at most 100 years (876000h)",
                    at: node.range))
        } else {
            report(
                .error(
                    "invalid-duration",
                    "'\(key)' is not a duration: '\(text.truncatedForMessage)'; write a number and a unit, like 250ms, 20s, 2m or 1h"
                        + (allowNone ? ", or none" : ""),
                    at: node.range))
        }
        return nil
    }

    /// One of an enum's raw values, with a hint for a near miss.
    mutating func choice<T: RawRepresentable & CaseIterable>(_ node: YAMLNode, _ key: String, _: T.Type) -> T?
    where T.RawValue == String {
        guard case .scalar(let text, _) = node.value, !node.isNull else {
            let names = T.allCases.map(\.rawValue)
            report(
                .error(
                    "invalid-type",
                    "'\(key)' must be one of \(names.joined(separator: ", ")), not \(node.kindDescription)",
                    at: node.range))
            return nil
        }
        if let value = T(rawValue: text) { return value }
        // The names only for a message: made for every value read, they cost each rule of a
        // large file an array of texts.
        let names = T.allCases.map(\.rawValue)
        report(
            .error(
                "invalid-value",
                "'\(key)' cannot be '\(text.truncatedForMessage)'\(Suggestion.hint(for: text, in: names).isEmpty ? "; use one of \(names.joined(separator: ", "))" : Suggestion.hint(for: text, in: names))",
                at: node.range))
        return nil
    }

    /// An action name for `on-exhausted`/`on-failure`; lint decides which values loop.
    mutating func action(_ node: YAMLNode, _ key: String) -> ActionKind? {
        choice(node, key, ActionKind.self)
    }
}
