/// A `refresh` rule that can end in a logout the policy never mentions: `refresh.on-exhausted`
/// and `refresh.on-failure` default to `logout`, so a policy without any logout rule or
/// `logout:` section still logs users out (with the default 20s cooldown).
struct HiddenLogoutRule: LintRule {
    static let description = LintRuleDescription(
        id: "hidden-logout",
        summary: "a refresh rule can log the user out though the policy never mentions a logout",
        rationale: """
            Logout is the most destructive thing the engine does. 'refresh.on-exhausted' and \
            'refresh.on-failure' default to 'logout', so a policy written with no logout rule and \
            no 'logout:' section still ends the session (with a 20s cooldown) when a refresh fails \
            or a request keeps meeting refresh triggers. Say what you mean: write 'on-exhausted:' \
            and 'on-failure:' (logout, or fail), or add a 'logout:' section.
            """,
        severity: .warning,
        triggering: [
            exampleHeader + """
                refresh: { use: oauth2, with: { token-url: "https://auth.example.com/token", client-id: app } }
                rules:
                  - { name: unauthorized, when: { status: [401] }, then: refresh }
                """
        ],
        nonTriggering: [
            exampleHeader + """
                refresh: { use: oauth2, with: { token-url: "https://auth.example.com/token", client-id: app }, on-exhausted: logout, on-failure: fail }
                rules:
                  - { name: unauthorized, when: { status: [401] }, then: refresh }
                """,
            exampleHeader + """
                refresh: { use: oauth2, with: { token-url: "https://auth.example.com/token", client-id: app } }
                logout: { cooldown: 20s }
                rules:
                  - { name: unauthorized, when: { status: [401] }, then: refresh }
                """,
            exampleHeader + """
                classify: { code: body.status }
                refresh: { use: oauth2, with: { token-url: "https://auth.example.com/token", client-id: app } }
                rules:
                  - { name: unauthorized, when: { status: [401] }, then: refresh }
                  - { name: revoked, when: { code: [202] }, then: logout }
                """,
        ])

    func check(_ context: LintContext) -> [Diagnostic] {
        // A logout section (top level or a route's) or a logout rule anywhere: the policy speaks
        // of logging out, and explain says where each edge leads.
        if context.parts.sections["logout"] != nil { return [] }
        if context.parts.locations.keys.contains(where: { $0.hasPrefix("routes.") && $0.contains(".logout.") }) {
            return []
        }
        if context.graph.scopes.contains(where: { $0.rules.contains { $0.action == .logout } }) { return [] }
        var findings: [Diagnostic] = []
        var seen = Set<String>()
        for scope in context.graph.scopes {
            for flow in scope.compiled where flow.action == .refresh {
                let hidden = [("on-exhausted", flow.onExhausted), ("on-failure", flow.onFailure)].filter { key, edge in
                    edge?.action == .logout && !Self.written(key, flow, scope, context)
                }.map(\.0)
                guard !hidden.isEmpty else { continue }
                let range = flow.rule.source.then ?? flow.rule.range
                guard seen.insert("\(range.start.line):\(range.start.column)").inserted else { continue }
                let keys = hidden.map { "'refresh.\($0)'" }.joined(separator: " and ")
                findings.append(
                    .warning(
                        Self.description.id,
                        "rule '\(flow.rule.name)' can log the user out (\(keys) default\(hidden.count == 1 ? "s" : "") to logout, cooldown \(flow.logout.cooldown.policyText)) though the policy has no logout rule and no 'logout:' section; write \(hidden.map { "'\($0):'" }.joined(separator: " and ")) (logout or fail) to say what you mean",
                        at: range))
            }
        }
        return findings
    }

    /// Whether `key` was written for this rule: in its `then:`, its route's section or the
    /// top-level section.
    static func written(
        _ key: String, _ flow: RuleGraph.CompiledRule, _ scope: RuleGraph.Scope, _ context: LintContext
    ) -> Bool {
        if flow.rule.source.keys[key] != nil { return true }
        if context.parts.locations["refresh.\(key)"] != nil { return true }
        return context.parts.locations[context.prefix(scope, "refresh") + ".\(key)"] != nil
    }
}
