/// A settings section that no rule can reach.
struct UnusedSectionRule: LintRule {
    static let description = LintRuleDescription(
        id: "unused-section",
        summary: "a section is set, but no rule uses it",
        rationale: "Settings nothing reaches are dead configuration; often a rule that should use them is missing.",
        severity: .warning,
        triggering: [
            exampleHeader + """
                retry: { max-retries: 5 }
                rules:
                  - { name: unauthorized, when: { status: [401] }, then: fail }
                """
        ],
        nonTriggering: [
            exampleHeader + """
                logout: { cooldown: 5s }
                retry: { backoff: constant, initial: 1s }
                rules:
                  - name: transient
                    when: { status: [503] }
                    then: { do: retry, max-retries: 2, on-exhausted: logout }
                """,
            exampleHeader + """
                logout: { cooldown: 5s }
                rules:
                  - { name: busy, when: { status: [503] }, then: sometimes }
                """,
            exampleHeader + """
                retry: { max-retries: 5 }
                rules:
                  - { name: busy, when: { status: [503] }, then: retry }
                """,
            exampleHeader + """
                refresh: { use: oauth2, with: { token-url: "https://auth.example.com/token", client-id: app } }
                """,
            exampleHeader + """
                retry: { attempt-timeout: 5s, deadline: 20s }
                rules:
                  - { name: unauthorized, when: { status: [401] }, then: fail }
                """,
        ])

    func check(_ context: LintContext) -> [Diagnostic] {
        // A rule dropped for an error (an unknown action) would make its section look unused.
        guard !context.decodeFailed else { return [] }
        // What the compiled flow reaches: rules' actions and every escalation edge's target (a
        // retry rule whose `then:` says `on-exhausted: logout` uses 'logout').
        var reached: Set<ActionKind> = []
        var usesCodes = false
        for scope in context.graph.scopes {
            reached.formUnion(scope.reachableActions)
            usesCodes = usesCodes || scope.rules.contains { $0.when.codes != nil }
        }
        var findings: [Diagnostic] = []
        // attempt-timeout, deadline and idempotency-key apply to every request, retried or not.
        let everyRequest = ["attempt-timeout", "deadline", "idempotency-key"]
        let retrySettingsUsed = everyRequest.contains { context.parts.locations["retry.\($0)"] != nil }
        // A refresh plugin with `ahead` refreshes tokens before they expire, rule or not.
        let refreshesAhead = context.graph.scopes.contains { $0.refresh.plugin != nil && $0.refresh.ahead != nil }
        let sections: [(String, Bool)] = [
            ("retry", reached.contains(.retry) || retrySettingsUsed),
            ("refresh", reached.contains(.refresh) || refreshesAhead),
            ("logout", reached.contains(.logout)), ("classify", usesCodes),
        ]
        for (section, used) in sections where !used {
            guard let range = context.parts.sections[section] else { continue }
            let what = section == "classify" ? "no rule matches a business code" : "no rule leads to \(section)"
            findings.append(
                .warning(
                    Self.description.id, "'\(section)' is set, but \(what); remove it or add a rule that uses it",
                    at: range))
        }
        return findings
    }
}
