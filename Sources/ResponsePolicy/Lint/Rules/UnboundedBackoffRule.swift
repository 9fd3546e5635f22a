/// Exponential backoff with no cap.
struct UnboundedBackoffRule: LintRule {
    static let description = LintRuleDescription(
        id: "unbounded-backoff",
        summary: "exponential backoff without 'max-delay'",
        rationale: "Waits double each time; without a cap a few retries mean minutes or hours.",
        severity: .warning,
        triggering: [
            exampleHeader + """
                retry: { backoff: exponential, max-delay: none }
                rules:
                  - { name: busy, when: { status: [503] }, then: retry }
                """
        ],
        nonTriggering: [
            exampleHeader + """
                retry: { backoff: exponential, max-delay: 10s }
                rules:
                  - { name: busy, when: { status: [503] }, then: retry }
                """
        ])

    func check(_ context: LintContext) -> [Diagnostic] {
        var findings: [Diagnostic] = []
        var seen = Set<String>()
        for scope in context.graph.scopes
        where scope.retry.backoff == .exponential && scope.retry.maxDelay == nil
            && (context.owns(scope, "retry", "max-delay") || context.owns(scope, "retry", "backoff"))
        {
            let path = context.prefix(scope, "retry") + ".max-delay"
            guard seen.insert(path).inserted else { continue }
            findings.append(
                .warning(
                    Self.description.id,
                    "exponential backoff has no 'max-delay', so waits double without limit; add 'max-delay: 30s'",
                    at: context.location(path)))
        }
        for (rules, _) in context.ruleSets {
            for rule in rules {
                guard let retry = rule.retry, retry.backoff == .exponential, retry.maxDelay == nil,
                    rule.source.keys["max-delay"] != nil || rule.source.keys["backoff"] != nil
                else { continue }
                findings.append(
                    .warning(
                        Self.description.id,
                        "rule '\(rule.name)' uses exponential backoff with no 'max-delay'; add 'max-delay: 30s'",
                        at: rule.source.keys["max-delay"] ?? rule.source.keys["backoff"] ?? rule.range))
            }
        }
        return findings
    }
}
