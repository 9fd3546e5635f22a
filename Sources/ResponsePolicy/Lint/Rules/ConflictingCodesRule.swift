/// A business code listed in two rules that would act differently on it.
struct ConflictingCodesRule: LintRule {
    static let description = LintRuleDescription(
        id: "conflicting-codes",
        summary: "a business code appears in two rules with different actions",
        rationale: """
            First match wins, so the second rule never acts on that code; a code meaning both \
            "refresh" and "log out" is almost always a copy-and-paste mistake.
            """,
        severity: .error,
        triggering: [
            exampleHeader + """
                classify: { code: body.status }
                refresh: { use: oauth2, with: { token-url: "https://auth.example.com/token", client-id: app } }
                rules:
                  - { name: a, when: { code: [1401] }, then: refresh }
                  - { name: b, when: { code: [1401, 202] }, then: logout }
                """
        ],
        nonTriggering: [
            exampleHeader + """
                classify: { code: body.status }
                rules:
                  - { name: a, when: { code: [1401] }, then: logout }
                  - { name: b, when: { code: [202] }, then: logout }
                  - { name: c, when: { code: [202], path: "/admin/*" }, then: fail }
                """
        ])

    func check(_ context: LintContext) -> [Diagnostic] {
        var findings: [Diagnostic] = []
        for (rules, _) in context.ruleSets {
            var firstByCode: [String: Int] = [:]
            for (index, rule) in rules.enumerated() {
                for code in rule.when.codes ?? [] {
                    guard let earlierIndex = firstByCode[code] else {
                        firstByCode[code] = index
                        continue
                    }
                    let earlier = rules[earlierIndex]
                    guard earlier.action != rule.action, Self.sameFilters(earlier.when, rule.when) else { continue }
                    findings.append(
                        .error(
                            Self.description.id,
                            "code '\(code)' is in rule '\(earlier.name)' (\(earlier.action.rawValue)) and rule '\(rule.name)' (\(rule.action.rawValue)); the first match wins, so remove it from one of them",
                            at: rule.source.codes[code] ?? rule.range,
                            notes: [
                                .init(
                                    range: earlier.source.codes[code] ?? earlier.range,
                                    message: "'\(code)' first listed here")
                            ]))
                }
            }
        }
        return findings
    }

    /// Both rules constrain everything but the code alike, so they meet the same responses.
    static func sameFilters(_ a: Condition, _ b: Condition) -> Bool {
        a.statuses == b.statuses && a.headers == b.headers && a.methods == b.methods && a.path == b.path
    }
}
