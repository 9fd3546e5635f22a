/// A settings section of the policy file (`retry:`, `refresh:`, `logout:`, `dispatch:`) or a
/// mapping inside one (`retry.budget`, `refresh.limit`, `refresh.transient`): a value whose keys
/// are listed once, in ``keys``.
///
/// Why a table: a key's name, type, range, default and description, each stated apart by the
/// decoder (a key list and a `switch`), the schema, the compiled flow's texts and the docs, drift
/// apart (a range enforced by one and not stated by the other, a key the compiled settings leave
/// out so that `policy diff` cannot see it change). Stated once here, they are read by the
/// decoder, ``PolicySchema``, the compiled flow (``RuleGraph/Node/settings``: `policy graph`,
/// `policy diff`) and the settings reference (`policy schema --list-settings`) alike.
///
/// ```swift
/// extension LogoutSettings: SettingsSection {
///     package static let defaults = LogoutSettings()
///     package static let keys: [SettingKey<LogoutSettings>] = [
///         .boolean("cancel-in-flight", \.cancelInFlight, doc: "attempts still on the wire are cancelled"),
///         .duration("cooldown", \.cooldown, doc: "how long new requests fail at once"),
///     ]
/// }
/// ```
package protocol SettingsSection: Sendable {
    /// The section with every key at its default: what a policy that does not write the
    /// section runs with, and what a mapping written over `none` starts from.
    static var defaults: Self { get }
    /// The section's keys, in the order the schema, the compiled settings and the docs list them.
    static var keys: [SettingKey<Self>] { get }
}

extension SettingsSection {
    /// The keys' names, in order: what the decoder allows in the section.
    package static var names: [String] { keys.map(\.name) }

    /// The keys without their way of reading and writing: what the schema and the docs need.
    package static var infos: [SettingInfo] { keys.map(\.info) }

    /// The key named `name`, if the section has one.
    package static func key(_ name: String) -> SettingKey<Self>? {
        keys.first { $0.name == name }
    }

    /// The keys a rule's `then:` may not override: they apply to the whole request.
    package static var requestWideNames: [String] { keys.filter { $0.reach == .request }.map(\.name) }

    /// The value's keys as the policy would write them, in the table's order, leaving out a key
    /// that means nothing here (`multiplier` unless the backoff is exponential).
    package func settingTexts() -> [(key: String, value: String)] {
        Self.keys.compactMap { key in key.applies(self) ? (key.name, key.value(self).policyText) : nil }
    }

    /// This value with its request-wide keys taken from `scope`: a rule runs with its scope's
    /// deadline, attempt timeout, refresh-ahead and holding, whatever its `then:` says.
    package func withRequestWide(of scope: Self) -> Self {
        var copy = self
        for key in Self.keys where key.reach == .request { key.adopt(&copy, scope) }
        return copy
    }
}

/// Whether a rule's `then:` may override a key.
package enum SettingReach: Sendable, Hashable {
    /// The rule's own value: `then: { do: retry, max-retries: 5 }`.
    case rule
    /// The whole request's, armed before any rule has matched (`deadline`, `attempt-timeout`,
    /// `ahead`, `hold-new-requests`): refused in `then:` (`request-wide-override`); a route's
    /// section sets it for the route's requests.
    case request
}

/// What a key takes: its type with its range or choices. The decoder reads the value by it (the
/// range in its messages too), and the schema types the key by it.
package indirect enum SettingKind: Sendable {
    /// A whole number in the range.
    case integer(ClosedRange<Int>)
    /// A number in the range.
    case number(ClosedRange<Double>)
    /// `true` or `false`.
    case boolean
    /// A duration with a unit (`250ms`, `20s`).
    case duration
    /// A duration, or `none`.
    case durationOrNone
    /// An action name (`deliver`, `fail`, `logout`; lint refuses those that loop).
    case action
    /// One of these words.
    case choice([String])
    /// `none`, or a mapping of these keys (`budget`, `limit`, `transient`).
    case noneOr([SettingInfo])
    /// Anything else, as this JSON schema says (read by the key's own reader), and `type` says
    /// in words for the settings reference (`header name or none`).
    case custom(SchemaJSON, type: String)
}

/// A key's statement without its way of reading and writing values: name, kind, reach, default
/// and its one line of documentation.
package struct SettingInfo: Sendable {
    package let name: String
    package let kind: SettingKind
    package let reach: SettingReach
    /// The default, as the policy writes it (`3`, `1s`, `{ ratio: 0.2, min: 100 }`): read from
    /// the section's ``SettingsSection/defaults``, so it is stated only there.
    package let defaultValue: PolicyValue
    /// One line, lower-case, no final period: the schema's description and the reference's.
    package let doc: String
}

/// Where a key's value was written, for reading it.
struct SettingInput {
    /// The value's node.
    let node: YAMLNode
    /// The key, as messages name it.
    let key: String
    /// The dotted path of the key (`routes.2.retry.budget`), for the locations of nested keys.
    let path: String
}

/// One key of a settings section, stated once: its name, what it takes (``SettingKind``), where
/// it may be overridden (``SettingReach``), a line of documentation, the field it sets and how
/// its value is written back as policy text. Its default is the field's in the section's
/// ``SettingsSection/defaults``.
///
/// The decoder applies a key with ``apply``; the compiled flow and `policy diff` print it with
/// ``value``; the schema and the settings reference read ``info``.
package struct SettingKey<Section: SettingsSection>: Sendable {
    package let info: SettingInfo
    /// Reads the key's value from its node into the section, reporting what cannot be read
    /// (the section keeps its value then).
    let apply: @Sendable (inout PolicyDecoder, SettingInput, inout Section) -> Void
    /// The key's value in a section, as the policy writes it.
    package let value: @Sendable (Section) -> PolicyValue
    /// Sets the key's field of the first section to the second's.
    let adopt: @Sendable (inout Section, Section) -> Void
    /// Whether the key means anything in a section (`multiplier` only with exponential backoff).
    package let applies: @Sendable (Section) -> Bool

    package var name: String { info.name }
    package var kind: SettingKind { info.kind }
    package var reach: SettingReach { info.reach }
    package var doc: String { info.doc }

    /// A key of `Section`'s field at `path`, read by `read` (`nil`: reported, keep the value
    /// the field has) and written as policy text by `text`.
    init<Value>(
        _ name: String, _ path: any WritableKeyPath<Section, Value> & Sendable, _ kind: SettingKind,
        reach: SettingReach, doc: String, applies: @escaping @Sendable (Section) -> Bool = { _ in true },
        read: @escaping @Sendable (inout PolicyDecoder, SettingInput, Value) -> Value?,
        text: @escaping @Sendable (Value) -> PolicyValue
    ) {
        info = SettingInfo(
            name: name, kind: kind, reach: reach, defaultValue: text(Section.defaults[keyPath: path]), doc: doc)
        apply = { decoder, input, section in
            if let value = read(&decoder, input, section[keyPath: path]) { section[keyPath: path] = value }
        }
        value = { text($0[keyPath: path]) }
        adopt = { $0[keyPath: path] = $1[keyPath: path] }
        self.applies = applies
    }

    // MARK: - The kinds of key

    /// A whole number in `range`.
    static func integer(
        _ name: String, _ path: any WritableKeyPath<Section, Int> & Sendable, _ range: ClosedRange<Int>,
        reach: SettingReach = .rule, doc: String
    ) -> Self {
        Self(
            name, path, .integer(range), reach: reach, doc: doc,
            read: { decoder, input, _ in decoder.integer(input.node, input.key, in: range) }, text: { .integer($0) })
    }

    /// A number in `range`.
    static func number(
        _ name: String, _ path: any WritableKeyPath<Section, Double> & Sendable, _ range: ClosedRange<Double>,
        reach: SettingReach = .rule, doc: String, applies: @escaping @Sendable (Section) -> Bool = { _ in true }
    ) -> Self {
        Self(
            name, path, .number(range), reach: reach, doc: doc, applies: applies,
            read: { decoder, input, _ in decoder.number(input.node, input.key, in: range) }, text: { .number($0) })
    }

    /// `true` or `false`.
    static func boolean(
        _ name: String, _ path: any WritableKeyPath<Section, Bool> & Sendable, reach: SettingReach = .rule, doc: String
    ) -> Self {
        Self(
            name, path, .boolean, reach: reach, doc: doc,
            read: { decoder, input, _ in decoder.boolean(input.node, input.key) }, text: { .boolean($0) })
    }

    /// A duration.
    static func duration(
        _ name: String, _ path: any WritableKeyPath<Section, Duration> & Sendable, reach: SettingReach = .rule,
        doc: String
    ) -> Self {
        Self(
            name, path, .duration, reach: reach, doc: doc,
            read: { decoder, input, _ in decoder.duration(input.node, input.key).flatMap { $0 } },
            text: { .text($0.policyText) })
    }

    /// A duration, or `none` (`nil`).
    static func durationOrNone(
        _ name: String, _ path: any WritableKeyPath<Section, Duration?> & Sendable, reach: SettingReach = .rule,
        doc: String
    ) -> Self {
        Self(
            name, path, .durationOrNone, reach: reach, doc: doc,
            read: { decoder, input, _ in decoder.duration(input.node, input.key, allowNone: true) },
            text: { .text($0?.policyText ?? "none") })
    }

    /// An action (`on-exhausted`, `on-failure`).
    static func action(
        _ name: String, _ path: any WritableKeyPath<Section, ActionKind> & Sendable, reach: SettingReach = .rule,
        doc: String
    ) -> Self {
        Self(
            name, path, .action, reach: reach, doc: doc,
            read: { decoder, input, _ in decoder.action(input.node, input.key) }, text: { .text($0.rawValue) })
    }

    /// One of an enum's raw values (`backoff`).
    static func choice<Choice: RawRepresentable & CaseIterable & Sendable>(
        _ name: String, _ path: any WritableKeyPath<Section, Choice> & Sendable, reach: SettingReach = .rule,
        doc: String
    ) -> Self where Choice.RawValue == String {
        Self(
            name, path, .choice(Choice.allCases.map(\.rawValue)), reach: reach, doc: doc,
            read: { decoder, input, _ in decoder.choice(input.node, input.key, Choice.self) },
            text: { .text($0.rawValue) })
    }

    /// `honor` or `ignore` (`retry-after`): whether a `Retry-After` answer sets the wait.
    static func retryAfter(
        _ name: String, _ path: any WritableKeyPath<Section, Bool> & Sendable, reach: SettingReach = .rule, doc: String
    ) -> Self {
        Self(
            name, path, .choice(["honor", "ignore"]), reach: reach, doc: doc,
            read: { decoder, input, _ in decoder.honorOrIgnore(input.node, input.key) },
            text: { .text($0 ? "honor" : "ignore") })
    }

    /// `none` (`nil`), or a mapping of `Nested`'s keys written over the value the field has
    /// (over `Nested`'s defaults when that is `none`).
    static func noneOr<Nested: SettingsSection>(
        _ name: String, _ path: any WritableKeyPath<Section, Nested?> & Sendable, reach: SettingReach = .rule,
        doc: String
    ) -> Self {
        Self(
            name, path, .noneOr(Nested.infos), reach: reach, doc: doc,
            read: { decoder, input, current in decoder.noneOrMapping(input, over: current) },
            text: { nested in
                nested.map { value in .mapping(Nested.keys.map { .init(key: $0.name, value: $0.value(value)) }) }
                    ?? .text("none")
            })
    }

    /// Anything else: typed by `schema` (`type` in words), read by `read`.
    static func custom<Value>(
        _ name: String, _ path: any WritableKeyPath<Section, Value> & Sendable, schema: SchemaJSON, type: String,
        reach: SettingReach = .rule, doc: String,
        read: @escaping @Sendable (inout PolicyDecoder, SettingInput) -> Value?,
        text: @escaping @Sendable (Value) -> PolicyValue
    ) -> Self {
        Self(
            name, path, .custom(schema, type: type), reach: reach, doc: doc,
            read: { decoder, input, _ in read(&decoder, input) },
            text: text)
    }
}

/// A setting's value as a policy file writes it, for the compiled flow's texts (`3`, `1s`,
/// `[GET, HEAD]`, `{ ratio: 0.2, min: 100 }`) and as JSON for the schema's defaults.
package indirect enum PolicyValue: Sendable, Hashable {
    case integer(Int)
    case number(Double)
    case boolean(Bool)
    /// A word, a duration, a header name, `none`.
    case text(String)
    case list([PolicyValue])
    case mapping([Entry])

    /// One key and value of a ``mapping``.
    package struct Entry: Sendable, Hashable {
        package let key: String
        package let value: PolicyValue
    }

    /// As YAML flow text: `3`, `0.2`, `true`, `1s`, `[GET, HEAD]`, `{ ratio: 0.2, min: 100 }`.
    package var policyText: String {
        switch self {
        case .integer(let value): return String(value)
        case .number(let value): return formatNumber(value)
        case .boolean(let value): return value ? "true" : "false"
        case .text(let text): return text
        case .list(let items): return "[" + items.map(\.policyText).joined(separator: ", ") + "]"
        case .mapping(let entries):
            return "{ " + entries.map { "\($0.key): \($0.value.policyText)" }.joined(separator: ", ") + " }"
        }
    }

    /// As JSON.
    package var json: SchemaJSON {
        switch self {
        case .integer(let value): return .integer(value)
        case .number(let value): return .number(value)
        case .boolean(let value): return .bool(value)
        case .text(let text): return .string(text)
        case .list(let items): return .array(items.map(\.json))
        case .mapping(let entries): return .object(entries.map { ($0.key, $0.value.json) })
        }
    }
}

extension PolicyDecoder {
    /// Applies the keys of `Section` among `fields` over `settings`, noting where each field was
    /// written (`path.key`); fields of other keys (`use`, `with`, `do`) are only noted.
    mutating func apply<Section: SettingsSection>(
        _ fields: [(key: String, keyNode: YAMLNode, value: YAMLNode)], to settings: inout Section, path: String
    ) {
        for (key, _, value) in fields {
            let keyPath = path + "." + key
            locations[keyPath] = value.range
            Section.key(key)?.apply(&self, SettingInput(node: value, key: key, path: keyPath), &settings)
        }
    }

    /// `none`, or a mapping of `Nested`'s keys over `current` (over its defaults when `current`
    /// is `none`): `.some(nil)` for `none`, `nil` when the value could not be read (reported).
    mutating func noneOrMapping<Nested: SettingsSection>(_ input: SettingInput, over current: Nested?) -> Nested?? {
        if input.node.scalar == "none" { return .some(nil) }
        guard let fields = mappingFields(input.node, "'\(input.key)'", allowed: Nested.names) else { return nil }
        var nested = current ?? Nested.defaults
        apply(fields, to: &nested, path: input.path)
        return .some(nested)
    }

    /// `honor` (`true`) or `ignore` (`false`); `honour` gets a hint.
    mutating func honorOrIgnore(_ node: YAMLNode, _ key: String) -> Bool? {
        if let text = node.scalar, node.isPlainScalar, text == "honor" || text == "ignore" { return text == "honor" }
        if node.scalar == "honour" {
            report(.error("invalid-value", "'\(key)' cannot be 'honour'; did you mean 'honor'?", at: node.range))
        } else {
            report(
                .error("invalid-value", "'\(key)' must be honor or ignore, not \(node.kindDescription)", at: node.range)
            )
        }
        return nil
    }
}
