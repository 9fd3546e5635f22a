import Foundation
import TestSupport
import Testing

@testable import PolicyCLI
@testable import ResponsePolicy

/// `policy diff` asks the decision table once per class of contexts that no rule tells apart
/// (``PolicyDiff/TriggerSpace/holds(_:)``); these compare it, on random policies, with asking
/// about every context one by one (``PolicyDiff/TriggerSpace/enumeratedHolds(_:)``), and bound
/// its work on the issue's 1,000-rule file structurally.
struct PolicyDiffTriggerTests {
    /// A random policy over a small alphabet, so rules meet: statuses and ranges, integer and
    /// text codes and code ranges, methods, path and header globs, error classes, every action.
    static func randomPolicy(_ random: inout SeededGenerator) -> String {
        var text = """
            policy: 1
            name: random
            classify: { code: body.status }
            refresh: { use: oauth2, with: { token-url: "https://auth.example.com/token", client-id: app } }
            rules:

            """
        let actions = ["deliver", "fail", "retry", "refresh", "logout"]
        let statuses = ["401", "429", "503", "\"500-504\"", "200", "\"400-499\""]
        let codes = ["1401", "202", "\"E1\"", "\"1400-1410\"", "7", "\"E2\""]
        let paths = ["/a/*", "/a/b", "/b/*", "*", "/?/x"]
        let headers = ["X-R: \"q-*\"", "X-R: \"q-1\"", "X-S: \"*\""]
        let methods = ["GET", "POST", "PUT"]
        let errors = ["timeout", "connection", "any"]
        func pick<T>(_ items: [T], _ random: inout SeededGenerator) -> T { items[random.int(0...(items.count - 1))] }
        for index in 0..<random.int(1...9) {
            var parts: [String] = []
            let shape = random.int(0...9)
            if shape < 4 { parts.append("status: [\(pick(statuses, &random))]") }
            if shape >= 3 && shape < 7 { parts.append("code: [\(pick(codes, &random)), \(pick(codes, &random))]") }
            if shape >= 8 { parts.append("error: [\(pick(errors, &random))]") }
            if random.int(0...2) == 0 { parts.append("method: [\(pick(methods, &random))]") }
            if random.int(0...2) == 0 { parts.append("path: \"\(pick(paths, &random))\"") }
            if random.int(0...3) == 0 && shape < 8 { parts.append("header: { \(pick(headers, &random)) }") }
            text +=
                "  - { name: r\(index), when: { \(parts.joined(separator: ", ")) }, then: \(pick(actions, &random)) }\n"
        }
        return text
    }

    static func scope(_ yaml: String) -> RuleGraph.Scope? {
        let analysis = Policy.analyze(
            bytes: Array(yaml.utf8), file: "t.yaml", catalog: PluginCatalog(), limits: .default)
        return analysis.policy?.graph.scopes.last
    }

    @Test func classQuestionsGiveWhatEveryContextsAnswerGives() throws {
        var random = SeededGenerator(seed: 23_06)
        var compared = 0
        var different: [String] = []
        for _ in 0..<300 {
            let oldText = Self.randomPolicy(&random)
            let newText = Self.randomPolicy(&random)
            guard let old = Self.scope(oldText), let new = Self.scope(newText) else { continue }
            let space = PolicyDiff.TriggerSpace(old, new)
            for scope in [old, new] where space.holds(scope) != space.enumeratedHolds(scope) {
                different.append(scope === old ? oldText : newText)
            }
            compared += 1
        }
        #expect(compared > 250)
        #expect(different.isEmpty, "\(different.first ?? "")")
    }

    /// A 200-rule file whose paths and header values make thousands of contexts: the answers
    /// hold where the rules say, and a policy compared with itself has no change.
    @Test func aLargeSpaceOfContextsKeepsItsAnswers() throws {
        var text = "policy: 1\nname: big\nclassify: { code: body.status }\nrules:\n"
        for i in 0..<200 {
            switch i % 5 {
            case 0: text += "  - { name: r\(i), when: { code: [\(100_000 + i)] }, then: fail }\n"
            case 1: text += "  - { name: r\(i), when: { status: [503], path: \"/svc-\(i)/*\" }, then: retry }\n"
            case 2: text += "  - { name: r\(i), when: { status: [429], header: { X-R: \"q-\(i)-*\" } }, then: retry }\n"
            case 3: text += "  - { name: r\(i), when: { code: [\(100_000 + i)], method: [GET] }, then: deliver }\n"
            default: text += "  - { name: r\(i), when: { error: [timeout], path: \"/svc-\(i)/*\" }, then: retry }\n"
            }
        }
        let scope = try #require(Self.scope(text))
        let space = PolicyDiff.TriggerSpace(scope, scope)
        #expect(space.contexts.count > 2_000)
        let holds = space.holds(scope)
        // Code r0 fails everywhere; r3's code is delivered on GET only, so it leads nowhere else.
        #expect(holds[.code(0, "")]?[.fail] == PolicyDiff.TriggerSpace.ContextSet(all: space.contexts.count))
        #expect(holds.keys.contains(.code(1, "")) == false)
        let diff = PolicyDiff(old: try Policy.load(yaml: text), new: try Policy.load(yaml: text))
        #expect(diff.changes.isEmpty)
    }
}
