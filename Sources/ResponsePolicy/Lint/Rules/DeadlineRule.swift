/// A worst case (every attempt timing out, every wait at its longest) above the deadline.
struct DeadlineRule: LintRule {
    static let description = LintRuleDescription(
        id: "worst-case-over-deadline",
        summary: "all retries, backoff waits and refreshes can take longer than 'deadline'",
        rationale: """
            The deadline ends the request first, so the last retries can never happen. Either the \
            deadline is too short for the retry settings or the retries are more than intended. \
            Waits a server asks for with Retry-After are not counted: the deadline is what bounds them.
            """,
        severity: .warning,
        triggering: [
            exampleHeader + """
                retry: { max-retries: 5, backoff: constant, initial: 10s, attempt-timeout: 10s, deadline: 30s, retry-after: ignore }
                rules:
                  - { name: busy, when: { status: [503] }, then: retry }
                """
        ],
        nonTriggering: [
            exampleHeader + """
                retry: { max-retries: 2, backoff: constant, initial: 1s, attempt-timeout: 5s, deadline: 30s, retry-after: ignore }
                rules:
                  - { name: busy, when: { status: [503] }, then: retry }
                """
        ])

    func check(_ context: LintContext) -> [Diagnostic] {
        var findings: [Diagnostic] = []
        for (_, scope) in context.ruleSets {
            guard let deadline = scope.retry.deadline else { continue }
            let worst = scope.worstCase
            guard let total = worst.total, total > deadline else { continue }
            let path = context.prefix(scope, "retry") + ".deadline"
            findings.append(
                .warning(Self.description.id, Self.message(worst, total, deadline), at: context.location(path)))
        }
        return findings
    }

    /// Names every term of the worst case with its share, largest first, so the hint points at
    /// the setting that matters (usually `attempt-timeout`, not the backoff).
    static func message(_ worst: WorstCase, _ total: Duration, _ deadline: Duration) -> String {
        let terms = worst.terms.filter { $0.duration > .zero }.map { term in
            let share = Int((term.duration.seconds / total.seconds * 100).rounded())
            return "\(term.name) = \(term.duration.policyText) (\(share)%)"
        }
        return
            "in the worst case a request takes \(total.policyText), longer than the deadline of \(deadline.policyText): "
            + terms.joined(separator: ", ")
            + "; lower 'attempt-timeout' or 'max-retries', or raise 'deadline'"
    }
}
