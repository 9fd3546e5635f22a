import Foundation
import ResponsePolicy
import TestSupport
import Testing

@testable import PolicyCLI

/// `policy schema`: the printed schema validates every shipped policy and refuses unknown keys.
/// The checker below covers the subset of JSON Schema 2020-12 the command emits.
/// Serialized: each test runs the binary, and a burst of parallel processes on a 2-core CI machine
/// starves the real-time-sensitive scheduler suites.
@Suite(.serialized)
struct SchemaCommandTests {
    static func schema() async throws -> [String: Any] {
        let result = try await runPolicy(["schema"])
        #expect(result.status == 0)
        return try #require(try JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [String: Any])
    }

    static let shippedPolicies: [String] = (yamlFiles(under: "policies") + yamlFiles(under: "examples")).filter {
        path in
        guard let bytes = try? Data(contentsOf: repositoryRoot.appendingPathComponent(path)) else { return false }
        let parsed = Policy.parse(bytes: Array(bytes), limits: .default)
        return !SimulationScript.isScript(parsed.root) && !PluginCatalog.isSchemaFile(parsed.root)
            && parsed.root?.pairs != nil
    }

    @Test func shippedPoliciesValidate() async throws {
        let schema = try await Self.schema()
        #expect(Self.shippedPolicies.count >= 5)
        for path in Self.shippedPolicies {
            let bytes = try Data(contentsOf: repositoryRoot.appendingPathComponent(path))
            let root = try #require(Policy.parse(bytes: Array(bytes), limits: .default).root)
            let errors = SchemaChecker(root: schema).validate(Instance(root))
            #expect(errors.isEmpty, "\(path): \(errors)")
        }
    }

    struct Invalid: Sendable, CustomTestStringConvertible {
        var name: String
        var yaml: String
        var testDescription: String { name }
    }

    static let invalid: [Invalid] = [
        .init(name: "unknown top-level key", yaml: "policy: 1\nname: a\nretyr: {}\n"),
        .init(name: "unknown retry key", yaml: "policy: 1\nname: a\nretry: { max-retry: 3 }\n"),
        .init(
            name: "unknown when key", yaml: "policy: 1\nname: a\nrules: [{ when: { stauts: [401] }, then: refresh }]\n"),
        .init(name: "bare number duration", yaml: "policy: 1\nname: a\nlogout: { cooldown: 20 }\n"),
        .init(name: "wrong version", yaml: "policy: 2\nname: a\n"),
        .init(name: "missing name", yaml: "policy: 1\n"),
        .init(name: "bad action", yaml: "policy: 1\nname: a\nrules: [{ when: { status: [401] }, then: refrsh }]\n"),
        .init(
            name: "unknown oauth2 option",
            yaml:
                "policy: 1\nname: a\nrefresh: { use: oauth2, with: { token-url: \"https://a\", client-id: x, scop: y } }\n"
        ),
        .init(
            name: "override key of another section",
            yaml: "policy: 1\nname: a\nrules: [{ when: { status: [503] }, then: { do: retry, cooldown: 1s } }]\n"),
    ]

    @Test(arguments: invalid)
    func invalidFilesDoNotValidate(_ example: Invalid) async throws {
        let schema = try await Self.schema()
        let root = try #require(Policy.parse(bytes: Array(example.yaml.utf8), limits: .default).root)
        #expect(!SchemaChecker(root: schema).validate(Instance(root)).isEmpty)
        // lint agrees: the same file has errors.
        let analysis = Policy.analyze(
            bytes: Array(example.yaml.utf8), file: nil, catalog: PluginCatalog(), limits: .default)
        #expect(analysis.diagnostics.hasErrors)
    }

    /// The keys of `when:` and `match:` are typed in ``PolicySchema/valueSchemas``; the settings
    /// sections' keys by their tables (``SettingsSectionTableTests``).
    @Test func everyDecoderKeyHasAValueType() {
        for key in PolicyDecoder.whenKeys + PolicyDecoder.matchKeys {
            #expect(PolicySchema.valueSchemas[key] != nil, "'\(key)' has no type in the schema")
        }
        let structural: Set = [
            "policy", "name", "rules", "observe", "routes", "classify", "retry", "refresh", "logout", "authorize",
            "store", "coordination", "dispatch",
        ]
        for key in PolicyDecoder.topLevelKeys {
            #expect(
                structural.contains(key) || PolicySchema.valueSchemas[key] != nil, "'\(key)' has no type in the schema")
        }
    }

    /// docs/policy.schema.json is `policy schema`; editors point at it (docs/getting-started.md).
    @Test func theSchemaInDocsIsGenerated() async throws {
        let file = try String(
            contentsOf: repositoryRoot.appendingPathComponent("docs/policy.schema.json"), encoding: .utf8)
        #expect(file == PolicySchema.json(), "run: swift run policy schema > docs/policy.schema.json")
    }

    @Test func declaredHostPluginsAreOffered() async throws {
        let result = try await runPolicy(["schema", "--plugin", "refresh:my-sso"])
        #expect(result.stdout.contains("\"a refresh plugin: exec, http, my-sso, oauth2, or one the host registers\""))
        let usage = try await runPolicy(["schema", "extra"])
        #expect(usage.status == 64)
    }
}

/// A YAML value typed the way an editor's YAML-to-JSON step types it.
indirect enum Instance: CustomStringConvertible {
    case string(String)
    case integer(Int)
    case number(Double)
    case bool(Bool)
    case null
    case array([Instance])
    case object([(String, Instance)])

    init(_ node: YAMLNode) {
        switch node.value {
        case .sequence(let items): self = .array(items.map(Instance.init))
        case .mapping(let pairs): self = .object(pairs.map { ($0.key.scalar ?? "", Instance($0.value)) })
        case .scalar(let text, let style):
            guard style == .plain, node.tag == nil else {
                self = .string(text)
                return
            }
            if node.isNull {
                self = .null
            } else if text == "true" || text == "false" {
                self = .bool(text == "true")
            } else if let value = Int(text) {
                self = .integer(value)
            } else if let value = Double(text), text.contains(".") {
                self = .number(value)
            } else {
                self = .string(text)
            }
        }
    }

    var description: String {
        switch self {
        case .string(let s): return "'\(s)'"
        case .integer(let i): return String(i)
        case .number(let d): return String(d)
        case .bool(let b): return String(b)
        case .null: return "null"
        case .array: return "a list"
        case .object: return "a mapping"
        }
    }

    var typeName: String {
        switch self {
        case .string: return "string"
        case .integer: return "integer"
        case .number: return "number"
        case .bool: return "boolean"
        case .null: return "null"
        case .array: return "array"
        case .object: return "object"
        }
    }
}

/// Validates an ``Instance`` against the keywords `policy schema` uses: `$ref` (local),
/// `type`, `const`, `enum`, `pattern`, `minimum`, `maximum`, `required`, `properties`,
/// `patternProperties`, `additionalProperties`, `items`, `anyOf`, `oneOf`, `allOf`, `if`/`then`.
/// Annotations (`description`, `examples`, `default`, `format`, `title`) are ignored.
struct SchemaChecker {
    let root: [String: Any]

    static let known: Set = [
        "$schema", "$id", "$defs", "$ref", "title", "description", "examples", "default", "format", "type", "const",
        "enum",
        "pattern", "minimum", "maximum", "required", "properties", "patternProperties", "additionalProperties",
        "items", "anyOf", "oneOf", "allOf", "if", "then",
    ]

    func validate(_ instance: Instance) -> [String] {
        validate(instance, root, at: "")
    }

    func validate(_ instance: Instance, _ schema: [String: Any], at path: String) -> [String] {
        var errors: [String] = []
        for key in schema.keys where !Self.known.contains(key) {
            errors.append("\(path): the checker does not know the keyword '\(key)'")
        }
        if let ref = schema["$ref"] as? String {
            let name = String(ref.dropFirst("#/$defs/".count))
            guard let defs = root["$defs"] as? [String: Any], let target = defs[name] as? [String: Any] else {
                return ["\(path): unresolved $ref \(ref)"]
            }
            errors += validate(instance, target, at: path)
        }
        if let type = schema["type"] {
            let types = (type as? [String]) ?? [(type as? String) ?? ""]
            let name = instance.typeName
            if !types.contains(name) && !(name == "integer" && types.contains("number")) {
                errors.append("\(path): \(instance) is not \(types.joined(separator: " or "))")
            }
        }
        if let constant = schema["const"], !Self.equal(instance, constant) {
            errors.append("\(path): \(instance) is not \(constant)")
        }
        if let values = schema["enum"] as? [Any], !values.contains(where: { Self.equal(instance, $0) }) {
            errors.append("\(path): \(instance) is not one of \(values)")
        }
        if let pattern = schema["pattern"] as? String, case .string(let text) = instance,
            text.range(of: pattern, options: .regularExpression) == nil
        {
            errors.append("\(path): \(instance) does not match \(pattern)")
        }
        if let minimum = (schema["minimum"] as? NSNumber)?.doubleValue, let value = Self.number(instance),
            value < minimum
        {
            errors.append("\(path): \(instance) is below \(minimum)")
        }
        if let maximum = (schema["maximum"] as? NSNumber)?.doubleValue, let value = Self.number(instance),
            value > maximum
        {
            errors.append("\(path): \(instance) is above \(maximum)")
        }
        if case .object(let pairs) = instance {
            let keys = pairs.map(\.0)
            for required in (schema["required"] as? [String]) ?? [] where !keys.contains(required) {
                errors.append("\(path): '\(required)' is required")
            }
            let properties = schema["properties"] as? [String: Any] ?? [:]
            let patterns = schema["patternProperties"] as? [String: Any] ?? [:]
            for (key, value) in pairs {
                var matched = false
                if let property = properties[key] as? [String: Any] {
                    matched = true
                    errors += validate(value, property, at: path + "/" + key)
                }
                for (pattern, sub) in patterns where key.range(of: pattern, options: .regularExpression) != nil {
                    matched = true
                    errors += validate(value, sub as? [String: Any] ?? [:], at: path + "/" + key)
                }
                if !matched, let additional = schema["additionalProperties"] {
                    if let sub = additional as? [String: Any] {
                        errors += validate(value, sub, at: path + "/" + key)
                    } else if (additional as? Bool) == false {
                        errors.append("\(path): unknown key '\(key)'")
                    }
                }
            }
        }
        if case .array(let items) = instance, let itemSchema = schema["items"] as? [String: Any] {
            for (index, item) in items.enumerated() {
                errors += validate(item, itemSchema, at: path + "/\(index)")
            }
        }
        if let all = schema["allOf"] as? [[String: Any]] {
            for sub in all { errors += validate(instance, sub, at: path) }
        }
        if let any = schema["anyOf"] as? [[String: Any]],
            !any.contains(where: { validate(instance, $0, at: path).isEmpty })
        {
            errors.append("\(path): \(instance) matches none of anyOf")
        }
        if let one = schema["oneOf"] as? [[String: Any]] {
            let count = one.filter { validate(instance, $0, at: path).isEmpty }.count
            if count != 1 { errors.append("\(path): \(instance) matches \(count) of oneOf, not 1") }
        }
        if let condition = schema["if"] as? [String: Any], validate(instance, condition, at: path).isEmpty,
            let then = schema["then"] as? [String: Any]
        {
            errors += validate(instance, then, at: path)
        }
        return errors
    }

    static func number(_ instance: Instance) -> Double? {
        switch instance {
        case .integer(let value): return Double(value)
        case .number(let value): return value
        default: return nil
        }
    }

    static func equal(_ instance: Instance, _ value: Any) -> Bool {
        if let text = value as? String {
            if case .string(let own) = instance { return own == text }
            return false
        }
        if let number = value as? NSNumber, let own = Self.number(instance) { return number.doubleValue == own }
        return false
    }
}
