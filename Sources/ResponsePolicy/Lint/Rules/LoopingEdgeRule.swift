/// An `on-exhausted` or `on-failure` that leads back into retrying or refreshing.
struct LoopingEdgeRule: LintRule {
    static let description = LintRuleDescription(
        id: "looping-edge",
        summary: "'on-exhausted' or 'on-failure' leads back to retry or refresh",
        rationale: """
            These edges are where a request goes when retrying or refreshing has run out or broken. \
            Sending it back to retry or refresh would start the loop again; a request must end: \
            deliver, fail or logout.
            """,
        severity: .error,
        triggering: [
            exampleHeader + """
                retry: { on-exhausted: retry }
                rules:
                  - { name: busy, when: { status: [503] }, then: retry }
                """,
            exampleHeader + """
                refresh: { use: oauth2, with: { token-url: "https://auth.example.com/token", client-id: app }, on-failure: refresh }
                rules:
                  - { name: unauthorized, when: { status: [401] }, then: refresh }
                """,
        ],
        nonTriggering: [
            exampleHeader + """
                retry: { on-exhausted: fail }
                rules:
                  - { name: busy, when: { status: [503] }, then: retry }
                """
        ])

    func check(_ context: LintContext) -> [Diagnostic] {
        var findings: [Diagnostic] = []
        var reported = Set<String>()
        func check(_ value: ActionKind, _ path: String, _ allowed: String) {
            guard value == .retry || value == .refresh, reported.insert(path).inserted else { return }
            let key = String(path.split(separator: ".").last ?? "")
            findings.append(
                .error(
                    Self.description.id,
                    "'\(key): \(value.rawValue)' would loop back into \(value == .retry ? "retrying" : "refreshing"); a request must end here: use \(allowed)",
                    at: context.location(path)))
        }
        for scope in context.graph.scopes {
            if context.owns(scope, "retry", "on-exhausted") {
                check(
                    scope.retry.onExhausted, context.prefix(scope, "retry") + ".on-exhausted", "deliver, fail or logout"
                )
            }
            if context.owns(scope, "refresh", "on-exhausted") {
                let path = context.prefix(scope, "refresh") + ".on-exhausted"
                check(scope.refresh.onExhausted, path, "deliver, fail or logout")
            }
            if context.owns(scope, "refresh", "on-failure") {
                check(
                    scope.refresh.onFailure, context.prefix(scope, "refresh") + ".on-failure", "fail, deliver or logout"
                )
            }
        }
        // A rule's own `then:` override, read off its compiled flow: the effective value its
        // escalation edge was compiled from.
        for (_, scope) in context.ruleSets {
            for flow in scope.compiled {
                let rule = flow.rule
                var values: [(ActionKind, String)] = []
                if rule.source.keys["on-exhausted"] != nil {
                    if flow.action == .retry { values.append((flow.retry.onExhausted, "on-exhausted")) }
                    if flow.action == .refresh { values.append((flow.refresh.onExhausted, "on-exhausted")) }
                }
                if rule.source.keys["on-failure"] != nil, flow.action == .refresh {
                    values.append((flow.refresh.onFailure, "on-failure"))
                }
                for (value, key) in values where value == .retry || value == .refresh {
                    findings.append(
                        .error(
                            Self.description.id,
                            "'\(key): \(value.rawValue)' in rule '\(rule.name)' would loop back into \(value == .retry ? "retrying" : "refreshing"); use deliver, fail or logout",
                            at: rule.source.keys[key] ?? rule.range))
                }
            }
        }
        return findings
    }
}
