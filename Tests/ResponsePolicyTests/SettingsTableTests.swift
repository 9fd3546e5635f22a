import Foundation
import Testing

@testable import ResponsePolicy

/// Each key of the settings sections is stated once, in its section's table
/// (``SettingsSection/keys``), and the decoder, the schema and the compiled flow all read that
/// statement: the keys the decoder accepts are the table's, the schema's properties are the
/// table's with its ranges and defaults, a range changed in a table changes what the decoder
/// refuses and what the schema says alike, and the compiled flow prints the table's keys.
struct SettingsTableTests {
    /// A section as the tests read it: its name in the file, where its keys are written, its
    /// table's statements and the keys the decoder accepts there (besides the plugin's).
    struct Section: Sendable, CustomTestStringConvertible {
        var name: String
        /// `KEY: VALUE` stands for the key and its value.
        var template: String
        var infos: [SettingInfo]
        var decoderKeys: [String]
        /// Where the section's properties are in the schema (`$defs.retry`).
        var schemaPath: [String]
        var testDescription: String { name }
    }

    static let sections: [Section] = [
        Section(
            name: "retry", template: "retry:\n  KEY: VALUE\n", infos: RetrySettings.infos,
            decoderKeys: PolicyDecoder.retryKeys, schemaPath: ["$defs", "retry"]),
        Section(
            name: "refresh", template: "refresh:\n  KEY: VALUE\n", infos: RefreshSettings.infos,
            decoderKeys: PolicyDecoder.refreshTuningKeys, schemaPath: ["$defs", "refresh"]),
        Section(
            name: "logout", template: "logout:\n  KEY: VALUE\n", infos: LogoutSettings.infos,
            decoderKeys: PolicyDecoder.logoutTuningKeys, schemaPath: ["$defs", "logout"]),
        Section(
            name: "dispatch", template: "dispatch:\n  KEY: VALUE\n", infos: DispatchSettings.infos,
            decoderKeys: PolicyDecoder.dispatchKeys, schemaPath: ["properties", "dispatch"]),
        Section(
            name: "retry.budget", template: "retry:\n  budget:\n    KEY: VALUE\n", infos: RetrySettings.Budget.infos,
            decoderKeys: PolicyDecoder.budgetKeys,
            schemaPath: ["$defs", "retry", "properties", "budget", "anyOf", "1"]),
        Section(
            name: "refresh.limit", template: "refresh:\n  limit:\n    KEY: VALUE\n",
            infos: RefreshSettings.Limit.infos, decoderKeys: PolicyDecoder.limitKeys,
            schemaPath: ["$defs", "refresh", "properties", "limit", "anyOf", "1"]),
        Section(
            name: "refresh.transient", template: "refresh:\n  transient:\n    KEY: VALUE\n",
            infos: RefreshSettings.Transient.infos, decoderKeys: PolicyDecoder.transientKeys,
            schemaPath: ["$defs", "refresh", "properties", "transient", "anyOf", "1"]),
    ]

    /// What the decoder reports of a policy with these sections (lint's findings aside).
    static func decode(_ yaml: String) -> [Diagnostic] {
        guard let root = Policy.parse(bytes: Array(("policy: 1\nname: t\n" + yaml).utf8), limits: .default).root
        else { return [.error("yaml-syntax", "no document", at: .fileStart)] }
        var decoder = PolicyDecoder(catalog: PluginCatalog())
        _ = decoder.policy(root)
        return decoder.diagnostics
    }

    static func schema() throws -> [String: Any] {
        try #require(
            try JSONSerialization.jsonObject(with: Data(PolicySchema.json().utf8)) as? [String: Any])
    }

    /// The JSON object at `path` (array items by index).
    static func object(_ root: Any, _ path: [String]) -> [String: Any]? {
        var node: Any? = root
        for step in path {
            if let array = node as? [Any], let index = Int(step), array.indices.contains(index) {
                node = array[index]
            } else {
                node = (node as? [String: Any])?[step]
            }
        }
        return node as? [String: Any]
    }

    // MARK: - One statement per key

    @Test(arguments: sections)
    func theDecoderAcceptsExactlyTheTablesKeysEachStatedOnce(_ section: Section) {
        let names = section.infos.map(\.name)
        #expect(Set(names).count == names.count, "a key of \(section.name) is stated twice: \(names)")
        #expect(section.decoderKeys == names)
        // Each key's default, written as the policy writes it, is read back without a finding.
        for info in section.infos {
            let yaml = section.template.replacingOccurrences(of: "KEY", with: info.name)
                .replacingOccurrences(of: "VALUE", with: info.defaultValue.policyText)
            #expect(Self.decode(yaml).isEmpty, "\(section.name).\(info.name): \(Self.decode(yaml))")
        }
        // A key of another section is refused here.
        let others = Set(Self.sections.flatMap { $0.infos.map(\.name) }).subtracting(names)
        for other in others.sorted() {
            let yaml = section.template.replacingOccurrences(of: "KEY", with: other)
                .replacingOccurrences(of: "VALUE", with: "1")
            #expect(
                Self.decode(yaml).contains { $0.rule == "unknown-key" && $0.message.contains("'\(other)'") },
                "\(section.name) accepted '\(other)'")
        }
    }

    @Test(arguments: sections)
    func theSchemasPropertiesAreTheTablesWithItsRangesAndDefaults(_ section: Section) throws {
        let schema = try Self.schema()
        let mapping = try #require(Self.object(schema, section.schemaPath), "\(section.schemaPath)")
        let properties = try #require(mapping["properties"] as? [String: Any])
        let tuning = Set(properties.keys).subtracting(["use", "with"])
        #expect(tuning == Set(section.infos.map(\.name)))
        for info in section.infos {
            let property = try #require(properties[info.name] as? [String: Any])
            #expect(property["description"] as? String == info.doc)
            switch info.kind {
            case .integer(let range):
                #expect(property["minimum"] as? Int == range.lowerBound, "\(info.name)")
                #expect(property["maximum"] as? Int == range.upperBound, "\(info.name)")
            case .number(let range):
                #expect((property["minimum"] as? NSNumber)?.doubleValue == range.lowerBound, "\(info.name)")
                #expect((property["maximum"] as? NSNumber)?.doubleValue == range.upperBound, "\(info.name)")
            case .choice(let values):
                #expect(property["enum"] as? [String] == values)
            default: break
            }
            let expected = try JSONSerialization.jsonObject(
                with: Data(info.defaultValue.json.pretty().utf8), options: .fragmentsAllowed)
            #expect(
                (property["default"] as? NSObject)?.isEqual(expected) == true,
                "\(section.name).\(info.name): \(property["default"] ?? "none") is not \(expected)")
        }
    }

    /// Every bounded number of every table: its bounds are accepted, one past each is refused with
    /// the range in the message, and the schema states the same bounds.
    @Test(arguments: sections)
    func everyRangeIsTheDecodersAndTheSchemas(_ section: Section) throws {
        for info in section.infos {
            let bounds: (low: String, high: String, below: String, above: String)
            let stated: String
            switch info.kind {
            case .integer(let range):
                bounds = (
                    "\(range.lowerBound)", "\(range.upperBound)", "\(range.lowerBound - 1)", "\(range.upperBound + 1)"
                )
                stated = "between \(range.lowerBound) and \(range.upperBound)"
            case .number(let range):
                bounds = (
                    formatNumber(range.lowerBound), formatNumber(range.upperBound),
                    formatNumber(range.lowerBound - 0.5), formatNumber(range.upperBound + 0.5)
                )
                stated = "between \(formatNumber(range.lowerBound)) and \(formatNumber(range.upperBound))"
            default: continue
            }
            func yaml(_ value: String) -> String {
                section.template.replacingOccurrences(of: "KEY", with: info.name)
                    .replacingOccurrences(of: "VALUE", with: value)
            }
            #expect(Self.decode(yaml(bounds.low)).isEmpty, "\(info.name): \(bounds.low)")
            #expect(Self.decode(yaml(bounds.high)).isEmpty, "\(info.name): \(bounds.high)")
            for outside in [bounds.below, bounds.above] {
                #expect(
                    Self.decode(yaml(outside)).map(\.message) == ["'\(info.name)' must be \(stated), not \(outside)"],
                    "\(section.name).\(info.name)")
            }
        }
    }

    // MARK: - A planted range change

    /// Two sections alike but for one key's range: what the decoder refuses and what the schema
    /// says both follow the table.
    struct Planted: SettingsSection {
        var count = 3
        var cooldown: Duration = .seconds(1)
        static let defaults = Planted()
        static let keys: [SettingKey<Planted>] = [
            .integer("count", \.count, 0...7, doc: "a count"), .duration("cooldown", \.cooldown, doc: "a wait"),
        ]
    }

    struct Replanted: SettingsSection {
        var count = 3
        var cooldown: Duration = .seconds(1)
        static let defaults = Replanted()
        static let keys: [SettingKey<Replanted>] = [
            .integer("count", \.count, 0...9, doc: "a count"), .duration("cooldown", \.cooldown, doc: "a wait"),
        ]
    }

    /// Decodes `yaml` as a section of `Section` the way the decoder reads `retry:`.
    static func decodePlanted<Section: SettingsSection>(_ yaml: String, as _: Section.Type) throws -> (
        Section, [String]
    ) {
        let root = try #require(Policy.parse(bytes: Array(yaml.utf8), limits: .default).root)
        var decoder = PolicyDecoder(catalog: PluginCatalog())
        var section = Section.defaults
        let read = decoder.mappingFields(root, "'planted'", allowed: Section.names)
        let fields = try #require(read)
        decoder.apply(fields, to: &section, path: "planted")
        return (section, decoder.diagnostics.map(\.message))
    }

    @Test func aRangeChangedInTheTableChangesTheDecoderAndTheSchemaAlike() throws {
        let (seven, sevenMessages) = try Self.decodePlanted("count: 8\ncooldown: 2s\n", as: Planted.self)
        #expect(seven.count == 3 && seven.cooldown == .seconds(2))
        #expect(sevenMessages == ["'count' must be between 0 and 7, not 8"])
        let (nine, nineMessages) = try Self.decodePlanted("count: 8\ncooldown: 2s\n", as: Replanted.self)
        #expect(nine.count == 8 && nineMessages.isEmpty)

        let schema = PolicySchema.section(Planted.infos).pretty()
        let replanted = PolicySchema.section(Replanted.infos).pretty()
        #expect(schema.contains("\"maximum\": 7") && !schema.contains("\"maximum\": 9"))
        #expect(replanted.contains("\"maximum\": 9") && !replanted.contains("\"maximum\": 7"))
        #expect(schema.replacingOccurrences(of: "\"maximum\": 7", with: "\"maximum\": 9") == replanted)
        // The default is the section's, in both.
        #expect(schema.contains("\"default\": 3") && schema.contains("\"default\": \"1s\""))
        #expect(Planted.defaults.settingTexts().map(\.value) == ["3", "1s"])
    }

    // MARK: - The compiled flow

    /// The settings the compiled flow prints for an action (`policy graph --format json`,
    /// `policy diff`) are the table's keys, in its order, with the values the rule runs with.
    @Test func theCompiledFlowPrintsTheTablesKeys() throws {
        let policy = try Policy.load(
            yaml: """
                policy: 1
                name: t
                refresh: { use: oauth2, with: { token-url: "https://a.example.com/t", client-id: x }, hold-new-requests: false }
                logout: { cooldown: 5s }
                retry: { backoff: constant, budget: { min: 7 } }
                rules:
                  - { name: r, when: { status: [503] }, then: { do: retry, max-retries: 2, budget: none } }
                  - { name: s, when: { status: [419] }, then: { do: refresh, limit: { count: 2 } } }
                  - { name: l, when: { status: [403] }, then: { do: logout, cooldown: 1s } }
                """)
        let nodes = policy.graph.nodes
        func settings(_ id: String) throws -> [String: String] {
            let node = try #require(nodes.first { $0.id == id }, "\(id)")
            return Dictionary(uniqueKeysWithValues: node.settings.map { ($0.key, $0.value) })
        }
        let retry = try #require(nodes.first { $0.id == "default.rule.1.retry" }).settings.map(\.key)
        // `multiplier` means nothing with constant backoff: left out.
        #expect(retry == RetrySettings.names.filter { $0 != "multiplier" })
        #expect(try settings("default.rule.1.retry")["max-retries"] == "2")
        #expect(try settings("default.rule.1.retry")["budget"] == "none")
        let refresh = try #require(nodes.first { $0.id == "default.rule.2.refresh" }).settings.map(\.key)
        #expect(refresh == ["use"] + RefreshSettings.names)
        #expect(try settings("default.rule.2.refresh")["limit"] == "{ count: 2, per: 30s }")
        // Request-wide: the section's, whatever the rule.
        #expect(try settings("default.rule.2.refresh")["hold-new-requests"] == "false")
        #expect(try settings("default.rule.3.logout") == ["use": "none", "cancel-in-flight": "true", "cooldown": "1s"])
    }

    /// A route's mapping is written over the top level's key by key, for `budget` as for
    /// `limit` and `transient` (`budget` used to start again from the default).
    @Test func aRoutesNestedMappingIsWrittenOverTheTopLevels() throws {
        let policy = try Policy.load(
            yaml: """
                policy: 1
                name: t
                rules: [{ when: { status: [503] }, then: retry }]
                retry: { budget: { ratio: 0.5 } }
                refresh: { limit: { count: 3 }, transient: { initial: 1s } }
                routes:
                  - match: { path: "/x" }
                    retry: { budget: { min: 5 } }
                    refresh: { limit: { per: 1m }, transient: { max-delay: 9s } }
                """)
        let route = try #require(policy.routes.first)
        #expect(route.retry.budget == RetrySettings.Budget(ratio: 0.5, min: 5))
        #expect(route.refresh.limit == RefreshSettings.Limit(count: 3, per: .seconds(60)))
        #expect(route.refresh.transient?.initial == .seconds(1) && route.refresh.transient?.maxDelay == .seconds(9))
    }
}
