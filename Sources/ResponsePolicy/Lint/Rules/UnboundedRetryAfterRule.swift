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
        context.compiledRules("retry", keys: ["max-delay", "retry-after"]) { flow in
            flow.canRetry && flow.retry.honorRetryAfter && flow.retry.maxDelay == nil
        }.map { _, range in
            .warning(
                Self.description.id,
                "'retry-after: honor' with 'max-delay: none' lets a server ask for any wait (an HTTP-date can be 31 years away); set 'max-delay' or 'retry-after: ignore'",
                at: range)
        }
    }
}
