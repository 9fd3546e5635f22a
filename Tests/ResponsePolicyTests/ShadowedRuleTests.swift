import Testing

@testable import ResponsePolicy

/// `shadowed-rule` looks at every earlier rule that could cover a rule (those naming its first
/// code, and those naming none), however far back, not at a fixed window of neighbours.
@Suite struct ShadowedRuleTests {
    static let header = "policy: 1\nname: far\nclassify: { code: body.status }\nrules:\n"

    static func filler(_ count: Int, from start: Int = 0) -> String {
        (start..<(start + count)).map { "  - { name: f\($0), when: { code: [\(10_000 + $0)] }, then: fail }\n" }
            .joined()
    }

    @Test func aCoveringRuleFarBackIsFound() {
        let text =
            Self.header + "  - { name: expired, when: { code: [1401, 1402] }, then: fail }\n" + Self.filler(1_000)
            + "  - { name: late, when: { code: [1401] }, then: deliver }\n"
        let shadowed = findings(text).filter { $0.rule == "shadowed-rule" }
        #expect(
            shadowed.map(\.message) == [
                "rule 'late' never matches: rule 'expired' comes first and matches everything it does"
            ])
    }

    @Test func aBroadRuleWithoutCodesFarBackIsFound() {
        let text =
            Self.header + "  - { name: server, when: { status: [\"500-599\"] }, then: retry }\n" + Self.filler(1_000)
            + "  - { name: busy, when: { status: [503] }, then: fail }\n"
        let shadowed = findings(text).filter { $0.rule == "shadowed-rule" }
        #expect(
            shadowed.map(\.message) == [
                "rule 'busy' never matches: rule 'server' comes first and matches everything it does"
            ])
    }

    @Test func theFirstCoveringRuleIsNamed() {
        let text =
            Self.header + "  - { name: wide, when: { code: [7, 8, 9] }, then: fail }\n" + Self.filler(10)
            + "  - { name: narrower, when: { code: [7, 8] }, then: fail }\n"
            + "  - { name: narrowest, when: { code: [7] }, then: fail }\n"
        let shadowed = findings(text).filter { $0.rule == "shadowed-rule" }.map(\.message)
        #expect(
            shadowed == [
                "rule 'narrower' never matches: rule 'wide' comes first and matches everything it does",
                "rule 'narrowest' never matches: rule 'wide' comes first and matches everything it does",
            ])
    }

    @Test func rulesThatOnlyShareSomeCodesAreNotShadowed() {
        let text =
            Self.header + "  - { name: a, when: { code: [1, 2] }, then: fail }\n"
            + "  - { name: b, when: { code: [2, 3] }, then: fail }\n"
            + "  - { name: c, when: { code: [3], status: [200] }, then: fail }\n"
        #expect(
            findings(text).filter { $0.rule == "shadowed-rule" }.map(\.message) == [
                "rule 'c' never matches: rule 'b' comes first and matches everything it does"
            ])
    }

    /// No window at all: 2,000 earlier rules on the same status, none covering, then the one that
    /// does, far back, is still found (the old check stopped after the 500 nearest candidates).
    @Test func aCoveringRuleBehindThousandsOfCandidatesIsFound() {
        let sameStatus = (0..<2_000).map {
            "  - { name: h\($0), when: { status: [503], header: { X-Shard: \"s\($0)\" } }, then: fail }\n"
        }.joined()
        let text =
            Self.header + "  - { name: busy, when: { status: [503] }, then: retry }\n" + sameStatus
            + "  - { name: late, when: { status: [503], method: [GET] }, then: fail }\n"
        let shadowed = findings(text).filter { $0.rule == "shadowed-rule" }.map(\.message)
        #expect(shadowed.count == 2_001)
        #expect(shadowed.last == "rule 'late' never matches: rule 'busy' comes first and matches everything it does")
    }

    @Test func codeRangesCoverTheCodesInThem() {
        let text =
            Self.header + "  - { name: client, when: { code: [\"1400-1499\"] }, then: fail }\n"
            + "  - { name: expired, when: { code: [1401] }, then: refresh }\n"
            + "  - { name: other, when: { code: [1500] }, then: fail }\n"
        #expect(
            findings(text).filter { $0.rule == "shadowed-rule" }.map(\.message) == [
                "rule 'expired' never matches: rule 'client' comes first and matches everything it does"
            ])
    }
}
