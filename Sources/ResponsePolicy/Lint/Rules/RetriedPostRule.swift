/// POST (or PATCH) listed among the methods that may be retried.
struct RetriedPostRule: LintRule {
    static let description = LintRuleDescription(
        id: "post-retried",
        summary: "POST or PATCH is listed in 'retry.methods'",
        rationale: """
            A POST that timed out may have been applied; sending it again can charge a card twice. \
            Prefer sending an idempotency key (the request then is retried safely) over listing POST.
            """,
        severity: .warning,
        triggering: [
            exampleHeader + """
                retry: { methods: [GET, POST] }
                rules:
                  - { name: busy, when: { status: [503] }, then: retry }
                """
        ],
        nonTriggering: [
            exampleHeader + """
                retry: { methods: [GET, PUT] }
                rules:
                  - { name: busy, when: { status: [503] }, then: retry }
                """
        ])

    func check(_ context: LintContext) -> [Diagnostic] {
        var findings: [Diagnostic] = []
        var seen = Set<String>()
        for scope in context.graph.scopes where context.owns(scope, "retry", "methods") {
            let unsafe = scope.retry.methods.filter { $0 == "POST" || $0 == "PATCH" }
            let path = context.prefix(scope, "retry") + ".methods"
            guard let method = unsafe.first, seen.insert(path).inserted else { continue }
            findings.append(
                .warning(
                    Self.description.id,
                    "'\(method)' in 'methods' retries requests that may already have been applied; rely on an idempotency key instead",
                    at: context.location(path)))
        }
        for (rules, _) in context.ruleSets {
            for rule in rules {
                guard let range = rule.source.keys["methods"], let retry = rule.retry,
                    let method = retry.methods.first(where: { $0 == "POST" || $0 == "PATCH" })
                else { continue }
                findings.append(
                    .warning(
                        Self.description.id,
                        "rule '\(rule.name)' retries '\(method)' requests, which may already have been applied; rely on an idempotency key instead",
                        at: range))
            }
        }
        return findings
    }
}
