import Testing

@testable import ResponsePolicy

/// Runs every rule's documented examples: each triggering example must produce the rule, each
/// non-triggering one must not. The rule reference in docs/ is generated from the same text.
struct LintRuleExampleTests {
    static let descriptions = Linter.descriptions.map { LintRuleCase(description: $0) }

    @Test(arguments: descriptions)
    func triggeringExamplesReportTheRule(_ rule: LintRuleCase) {
        // plugin-unavailable depends on the environment, not the file: PluginProblemTests cover it;
        // coordination-store-forgets on the store's own settings: RedisStoreSettingsTests.
        #expect(
            !rule.description.triggering.isEmpty || rule.description.id == "file-too-large"
                || rule.description.id == "plugin-unavailable" || rule.description.id == "coordination-store-forgets")
        for example in rule.description.triggering {
            let found = findings(example)
            #expect(
                found.contains { $0.rule == rule.description.id && $0.severity == rule.description.severity },
                "\(rule.description.id) did not trigger on:\n\(example)\nfound: \(found.map(\.description))")
        }
    }

    @Test(arguments: descriptions)
    func nonTriggeringExamplesStaySilent(_ rule: LintRuleCase) {
        #expect(!rule.description.nonTriggering.isEmpty)
        for example in rule.description.nonTriggering {
            let found = findings(example)
            #expect(
                !found.contains { $0.rule == rule.description.id },
                "\(rule.description.id) triggered on:\n\(example)\nfound: \(found.map(\.description))")
        }
    }

    @Test func ruleIdsAreUniqueAndKebabCase() {
        let ids = Linter.descriptions.map(\.id)
        #expect(Set(ids).count == ids.count)
        for id in ids {
            #expect(id.allSatisfy { $0.isLowercase || $0 == "-" }, "\(id)")
        }
    }
}

struct LintRuleCase: CustomTestStringConvertible, Sendable {
    let description: LintRuleDescription
    var testDescription: String { description.id }
}
