/// A first wait longer than the cap on every wait.
struct InitialAboveMaxDelayRule: LintRule {
    static let description = LintRuleDescription(
        id: "initial-above-max-delay",
        summary: "'initial' is longer than 'max-delay'",
        rationale: "Every wait is capped at 'max-delay', so 'initial' never applies as written; one of them is a typo.",
        severity: .warning,
        triggering: [
            exampleHeader + """
                retry: { initial: 10s, max-delay: 5s }
                rules:
                  - { name: busy, when: { status: [503] }, then: retry }
                """
        ],
        nonTriggering: [
            exampleHeader + """
                retry: { initial: 1s, max-delay: 5s }
                rules:
                  - { name: busy, when: { status: [503] }, then: retry }
                """
        ])

    func check(_ context: LintContext) -> [Diagnostic] {
        var findings: [Diagnostic] = []
        var seen = Set<String>()
        for scope in context.graph.scopes {
            for flow in scope.compiled where flow.action == .retry {
                guard let cap = flow.retry.maxDelay, flow.retry.initial > cap else { continue }
                let range =
                    flow.rule.source.keys["initial"] ?? flow.rule.source.keys["max-delay"]
                    ?? context.location(context.prefix(scope, "retry") + ".initial")
                guard seen.insert("\(range.start.line):\(range.start.column)").inserted else { continue }
                findings.append(
                    .warning(
                        Self.description.id,
                        "'initial: \(flow.retry.initial.policyText)' is longer than 'max-delay: \(cap.policyText)', so every wait is \(cap.policyText); lower 'initial' or raise 'max-delay'",
                        at: range))
            }
        }
        return findings
    }
}
