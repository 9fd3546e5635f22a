/// A retry rule no request it matches can be retried by.
struct NeverRetriedRule: LintRule {
    static let description = LintRuleDescription(
        id: "never-retried",
        summary: "a retry rule matches only methods that are never retried",
        rationale: """
            Only methods in 'retry.methods' are sent again, or requests carrying the idempotency \
            key. A rule (or its route) limited to other methods, with 'idempotency-key: none', \
            never retries: it goes straight to 'on-exhausted', whatever 'max-retries' says.
            """,
        severity: .warning,
        triggering: [
            exampleHeader + """
                retry: { idempotency-key: none }
                rules:
                  - { name: busy, when: { status: [503], method: [POST] }, then: retry }
                """
        ],
        nonTriggering: [
            exampleHeader + """
                rules:
                  - { name: busy, when: { status: [503], method: [POST] }, then: retry }
                """,
            exampleHeader + """
                retry: { idempotency-key: none }
                rules:
                  - { name: busy, when: { status: [503], method: [GET, POST] }, then: retry }
                """,
        ])

    func check(_ context: LintContext) -> [Diagnostic] {
        var findings: [Diagnostic] = []
        for (_, scope) in context.ruleSets {
            for flow in scope.compiled where flow.action == .retry && flow.retry.maxRetries > 0 {
                guard let methods = flow.methods, !methods.isEmpty, flow.neverRetried.count == methods.count else {
                    continue
                }
                let listed = flow.neverRetried.joined(separator: ", ")
                findings.append(
                    .warning(
                        Self.description.id,
                        "rule '\(flow.rule.name)' never retries: \(listed) \(flow.neverRetried.count == 1 ? "is" : "are") not in retry.methods and 'idempotency-key' is none; list the method in 'methods' or set 'idempotency-key'",
                        at: flow.rule.source.then ?? flow.rule.range))
            }
        }
        return findings
    }
}
