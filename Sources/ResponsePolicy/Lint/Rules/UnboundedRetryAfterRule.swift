/// `retry-after: honor` with no `max-delay`: the server sets the wait, without limit.
struct UnboundedRetryAfterRule: LintRule {
    static let description = LintRuleDescription(
        id: "unbounded-retry-after",
        summary: "'retry-after: honor' with 'max-delay: none'",
        rationale: """
            Retry-After is honoured up to 'max-delay'; without one a server (or a proxy in front of \
            it) can ask for any wait, up to the 31 years an HTTP-date allows, whatever the backoff.
            """,
        severity: .warning,
        triggering: [
            exampleHeader + """
                retry: { backoff: constant, max-delay: none, retry-after: honor }
                rules:
                  - { name: busy, when: { status: [503] }, then: retry }
                """
        ],
        nonTriggering: [
            exampleHeader + """
                retry: { backoff: constant, max-delay: none, retry-after: ignore }
                rules:
                  - { name: busy, when: { status: [503] }, then: retry }
                """
        ])

    func check(_ context: LintContext) -> [Diagnostic] {
        var findings: [Diagnostic] = []
        var seen = Set<String>()
        for scope in context.graph.scopes {
            for flow in scope.compiled where flow.canRetry && flow.retry.honorRetryAfter && flow.retry.maxDelay == nil {
                let range =
                    flow.rule.source.keys["max-delay"] ?? flow.rule.source.keys["retry-after"]
                    ?? context.location(context.prefix(scope, "retry") + ".max-delay")
                guard seen.insert("\(range.start.line):\(range.start.column)").inserted else { continue }
                findings.append(
                    .warning(
                        Self.description.id,
                        "'retry-after: honor' with 'max-delay: none' lets a server ask for any wait (an HTTP-date can be 31 years away); set 'max-delay' or 'retry-after: ignore'",
                        at: range))
            }
        }
        return findings
    }
}
