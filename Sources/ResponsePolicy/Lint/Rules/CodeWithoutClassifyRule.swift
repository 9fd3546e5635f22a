/// `when: code` with nowhere to read the code from.
struct CodeWithoutClassifyRule: LintRule {
    static let description = LintRuleDescription(
        id: "code-without-classify",
        summary: "a rule matches a business code, but 'classify.code' does not say where the code is",
        rationale: "Without 'classify' no response has a business code, so the rule can never match.",
        severity: .error,
        triggering: [
            exampleHeader + """
                rules:
                  - { name: gone, when: { code: [202] }, then: logout }
                """
        ],
        nonTriggering: [
            exampleHeader + """
                classify: { code: status }
                rules:
                  - { name: gone, when: { code: [202] }, then: logout }
                """,
            exampleHeader + """
                classify: { code: body.status }
                rules:
                  - { name: gone, when: { code: [202] }, then: logout }
                """,
        ])

    func check(_ context: LintContext) -> [Diagnostic] {
        var findings: [Diagnostic] = []
        for (rules, scope) in context.ruleSets where scope.classify == nil {
            // A 'classify' that was written but could not be read is reported where it is.
            if scope.route == nil, context.parts.sections["classify"] != nil { continue }
            for rule in rules where rule.when.codes != nil {
                let range = rule.when.codes?.first.flatMap { rule.source.codes[$0] } ?? rule.range
                findings.append(
                    .error(
                        Self.description.id,
                        "rule '\(rule.name)' matches a business code, but 'classify' does not say where it is; add 'classify: { code: body.status }'",
                        at: range))
            }
        }
        return findings
    }
}
