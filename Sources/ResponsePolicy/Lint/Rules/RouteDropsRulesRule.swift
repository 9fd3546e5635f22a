/// A route whose own `rules:` leave out a top-level `logout` or `refresh` rule.
struct RouteDropsRulesRule: LintRule {
    static let description = LintRuleDescription(
        id: "route-drops-rules",
        summary: "a route's own rules leave out a top-level logout or refresh rule",
        rationale: """
            A route's 'rules:' replace the top-level rules for its requests; they do not add to \
            them. A route that lists a retry rule and forgets the forced-logout rule keeps \
            requests going after the server ended the session. Write 'rules: []' when the route \
            is meant to have no rules at all.
            """,
        severity: .warning,
        triggering: [
            exampleHeader + """
                classify: { code: body.status }
                rules:
                  - { name: forced-logout, when: { code: [202] }, then: logout }
                routes:
                  - match: { path: "/upload/*" }
                    rules:
                      - { name: busy, when: { status: [503] }, then: retry }
                """
        ],
        nonTriggering: [
            exampleHeader + """
                classify: { code: body.status }
                rules:
                  - { name: forced-logout, when: { code: [202] }, then: logout }
                routes:
                  - match: { path: "/oauth/*" }
                    rules: []
                  - match: { path: "/upload/*" }
                    rules:
                      - { name: forced-logout, when: { code: [202] }, then: logout }
                      - { name: busy, when: { status: [503] }, then: retry }
                """
        ])

    func check(_ context: LintContext) -> [Diagnostic] {
        let important = context.parts.rules.filter { $0.action == .logout || $0.action == .refresh }
        guard !important.isEmpty else { return [] }
        var findings: [Diagnostic] = []
        for route in context.parts.routes {
            guard let own = route.rules, !own.isEmpty else { continue }
            let ownNames = Set(own.map(\.name))
            let kept = Set(own.map { Kept(action: $0.action, when: $0.when) })
            let dropped = important.filter { rule in
                !ownNames.contains(rule.name) && !kept.contains(Kept(action: rule.action, when: rule.when))
            }
            guard !dropped.isEmpty else { continue }
            let names = dropped.map { "'\($0.name)' (\($0.action.rawValue))" }.joined(separator: ", ")
            findings.append(
                .warning(
                    Self.description.id,
                    "this route's rules replace the top-level rules and leave out \(names); add \(dropped.count == 1 ? "it" : "them") to the route's rules, or write 'rules: []' if the route should have none",
                    at: route.range))
        }
        return findings
    }

    private struct Kept: Hashable {
        let action: ActionKind
        let when: Condition
    }
}
