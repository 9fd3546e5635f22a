/// A `refresh` action with no plugin to perform it.
struct MissingRefreshPluginRule: LintRule {
    static let description = LintRuleDescription(
        id: "missing-refresh-plugin",
        summary: "a rule refreshes, but 'refresh.use' names no plugin",
        rationale: "Without a refresh plugin the engine has no way to get a new token, so every trigger would fail.",
        severity: .error,
        triggering: [
            exampleHeader + """
                rules:
                  - { name: unauthorized, when: { status: [401] }, then: refresh }
                """
        ],
        nonTriggering: [
            exampleHeader + """
                refresh: { use: oauth2, with: { token-url: "https://auth.example.com/token", client-id: app } }
                rules:
                  - { name: unauthorized, when: { status: [401] }, then: refresh }
                """
        ])

    func check(_ context: LintContext) -> [Diagnostic] {
        var findings: [Diagnostic] = []
        for (rules, scope) in context.ruleSets where scope.refresh.plugin == nil {
            for rule in rules where rule.action == .refresh {
                findings.append(
                    .error(
                        Self.description.id,
                        "rule '\(rule.name)' refreshes the token, but no refresh plugin is set; add 'refresh: { use: oauth2, with: {...} }' or a host plugin",
                        at: rule.source.then ?? rule.range))
            }
        }
        return findings
    }
}
