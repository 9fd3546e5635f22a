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
        context.compiledRules("retry", keys: ["initial", "max-delay"]) { flow in
            guard flow.action == .retry, let cap = flow.retry.maxDelay else { return false }
            return flow.retry.initial > cap
        }.map { flow, range in
            let cap = flow.retry.maxDelay?.policyText ?? "none"
            return .warning(
                Self.description.id,
                "'initial: \(flow.retry.initial.policyText)' is longer than 'max-delay: \(cap)', so every wait is \(cap); lower 'initial' or raise 'max-delay'",
                at: range)
        }
    }
}
