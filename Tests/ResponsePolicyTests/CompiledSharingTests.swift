import Foundation
import Testing

@testable import ResponsePolicy

/// The compiled flow holds shared settings by reference (issue 22 item 5: lint memory). These
/// tests check that sharing never changes what a rule runs with: random policies (seeded) where
/// some rules override their section and most do not, against the sections themselves.
struct CompiledSharingTests {
    /// A seeded policy of `count` rules: plain actions, and `then:` mappings that override.
    static func policy(seed: UInt64, count: Int) -> String {
        var state = seed
        func next(_ bound: Int) -> Int {
            state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
            return Int((state >> 33) % UInt64(bound))
        }
        var text = """
            policy: 1
            name: sharing
            classify: { code: body.status }
            retry: { max-retries: 2, on-exhausted: fail }
            logout: { cooldown: 7s }
            refresh:
              use: oauth2
              with: { token-url: "https://auth.example.com/token", client-id: app }
            rules:

            """
        for index in 0..<count {
            let code = 5_000 + index
            switch next(6) {
            case 0: text += "  - { name: r\(index), when: { code: [\(code)] }, then: retry }\n"
            case 1:
                text += "  - { name: r\(index), when: { code: [\(code)] }, "
                text += "then: { do: retry, max-retries: \(1 + next(5)) } }\n"
            case 2: text += "  - { name: r\(index), when: { code: [\(code)] }, then: refresh }\n"
            case 3:
                text += "  - { name: r\(index), when: { code: [\(code)] }, "
                text += "then: { do: logout, cooldown: \(1 + next(9))s } }\n"
            case 4: text += "  - { name: r\(index), when: { code: [\(code)] }, then: logout }\n"
            default: text += "  - { name: r\(index), when: { code: [\(code)] }, then: fail }\n"
            }
        }
        return text
    }

    static func overridesNothing(_ flow: RuleGraph.CompiledRule) -> Bool {
        flow.rule.retry == nil && flow.rule.refresh == nil && flow.rule.logout == nil
    }

    @Test(arguments: [1, 2, 3, 4, 5] as [UInt64])
    func sharedSettingsAreTheSectionsAndOverridesAreTheirOwn(seed: UInt64) throws {
        let policy = try Policy.load(yaml: Self.policy(seed: seed, count: 60))
        let scope = try #require(policy.graph.scopes.last)
        // Both kinds of rule are there, and the shared box is known before any rule is compared
        // with it (compared with nil, every identity check below would pass whatever the boxes).
        #expect(scope.compiled.filter { Self.overridesNothing($0) }.count >= 2)
        #expect(scope.compiled.contains { !Self.overridesNothing($0) })
        let shared = try #require(scope.compiled.first { Self.overridesNothing($0) }?.settings)
        for flow in scope.compiled {
            if Self.overridesNothing(flow) {
                // Every rule that overrides nothing runs with exactly the scope's sections, from one box.
                #expect(flow.retry == scope.retry)
                #expect(flow.refresh == scope.refresh)
                #expect(flow.logout == scope.logout)
                #expect(flow.settings === shared)
            } else {
                // An override is the rule's own, and reaches no other rule.
                #expect(flow.settings !== shared)
                if let retry = flow.rule.retry { #expect(flow.retry.maxRetries == retry.maxRetries) }
                if let logout = flow.rule.logout { #expect(flow.logout.cooldown == logout.cooldown) }
            }
            // Escalations exist exactly for the actions that have them, and carry the section's logout.
            let escalates = flow.action == .retry || flow.action == .refresh
            #expect((flow.escalations != nil) == escalates)
            #expect(flow.onExhausted?.logout == (escalates ? scope.logout : nil))
        }
    }

    @Test func aRuleCopyKeepsItsOwnOverrides() throws {
        let policy = try Policy.load(yaml: Self.policy(seed: 9, count: 40))
        let original = try #require(policy.graph.scopes.last?.rules.first { $0.retry != nil })
        var copy = original
        copy.retry?.maxRetries = 99
        #expect(original.retry?.maxRetries != 99)
        #expect(copy.retry?.maxRetries == 99)
        #expect(copy != original)
        copy.retry = original.retry
        #expect(copy == original)
        #expect(copy.hashValue == original.hashValue)
    }

    /// Code positions switch from a short list to a table past 8 codes: a finding about the
    /// last of 20 codes still points at it.
    @Test(arguments: [1, 8, 9, 20])
    func codePositionsHoldPastTheShortList(count: Int) throws {
        let codes = (0..<(count - 1)).map { String(7_000 + $0) } + ["\"0202\""]
        let yaml =
            "policy: 1\nname: codes\nclassify: { code: body.status }\nrules:\n"
            + "  - { name: many, when: { code: [\(codes.joined(separator: ", "))] }, then: fail }\n"
        let analysis = Policy.analyze(
            bytes: Array(yaml.utf8), file: nil, catalog: PluginCatalog(), limits: .default)
        let finding = try #require(analysis.diagnostics.first { $0.rule == "code-leading-zero" })
        let line = String(yaml.split(separator: "\n")[4])
        let column = try #require(line.utf8.indices.firstIndex { line.utf8[$0...].starts(with: "\"0202\"".utf8) })
        let expected = line.utf8.distance(from: line.utf8.startIndex, to: column) + 1
        #expect(finding.range.start == SourcePosition(line: 5, column: expected))
    }

    @Test func positionsKeepTheirValuesInThirtyTwoBits() {
        var position = SourcePosition(line: 1_000_000, column: 4_000)
        #expect(position.line == 1_000_000 && position.column == 4_000)
        position.line += 1
        #expect(position.description == "1000001:4000")
        #expect(SourcePosition(line: 2, column: 1) < SourcePosition(line: 2, column: 3))
        #expect(SourcePosition(line: 1, column: 900) < SourcePosition(line: 2, column: 1))
    }
}
