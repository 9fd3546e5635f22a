/// Two rules of one `rules:` list with the same name.
struct DuplicateRuleNameRule: LintRule {
    static let description = LintRuleDescription(
        id: "duplicate-rule-name",
        summary: "two rules in one list share a name",
        rationale: """
            Events, errors (`failed: rule 'x'`), `policy explain` and `policy graph` name rules; with \
            two of the same name nobody can tell which one matched. (A route may reuse a top-level name.)
            """,
        severity: .warning,
        triggering: [
            exampleHeader + """
                rules:
                  - { name: busy, when: { status: [503] }, then: retry }
                  - { name: busy, when: { status: [502] }, then: retry }
                """
        ],
        nonTriggering: [
            exampleHeader + """
                rules:
                  - { name: busy, when: { status: [503] }, then: retry }
                  - { name: bad-gateway, when: { status: [502] }, then: retry }
                routes:
                  - match: { path: "/upload/*" }
                    rules:
                      - { name: busy, when: { status: [503] }, then: fail }
                """
        ])

    func check(_ context: LintContext) -> [Diagnostic] {
        var findings: [Diagnostic] = []
        for (rules, _) in context.ruleSets {
            // Positions, not rules: a dictionary of 20,000 copied rules was a fifth of lint's memory.
            var first: [String: Int] = [:]
            first.reserveCapacity(rules.count)
            for (position, rule) in rules.enumerated() {
                // One hash of the name per rule: a lookup, then an insert, hashed every name twice.
                // A repeated name puts the first rule's position back.
                guard let earlierPosition = first.updateValue(position, forKey: rule.name) else { continue }
                first[rule.name] = earlierPosition
                let earlier = rules[earlierPosition]
                // The same written name twice is one rule repeated through a YAML alias: a
                // shadowed rule, which `shadowed-rule` reports.
                guard rule.source.name == nil || rule.source.name != earlier.source.name else { continue }
                let line = (earlier.source.name ?? earlier.range).start.line
                findings.append(
                    .warning(
                        Self.description.id,
                        "rule name '\(rule.name)' is already used by the rule on line \(line); give each rule its own name",
                        at: rule.source.name ?? rule.range))
            }
        }
        return findings
    }
}
