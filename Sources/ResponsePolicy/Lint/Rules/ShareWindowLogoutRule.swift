/// A `share-window` together with `on-exhausted: logout`: a token that expires again soon after a
/// refresh logs the user out.
struct ShareWindowLogoutRule: LintRule {
    static let description = LintRuleDescription(
        id: "share-window-logout",
        summary: "'share-window' with 'on-exhausted: logout' can log users out after a good refresh",
        rationale: """
            Within the window a trigger on the current token is re-sent unchanged instead of \
            refreshing again. When the token really expired again, every such re-send uses up \
            'max-per-request', and the next trigger follows 'on-exhausted': a logout, where a \
            second refresh would have succeeded. Requests signed with an older token are already \
            re-sent with the new one (the token generation tells them apart), so the window is only \
            for servers whose new tokens take a moment to propagate: keep it at 0s, or end \
            exhaustion with 'fail'.
            """,
        severity: .warning,
        triggering: [
            exampleHeader + """
                refresh: { use: oauth2, with: { token-url: "https://auth.example.com/token", client-id: app }, share-window: 20s, max-per-request: 1, on-exhausted: logout }
                rules:
                  - { name: unauthorized, when: { status: [401] }, then: refresh }
                """
        ],
        nonTriggering: [
            exampleHeader + """
                refresh: { use: oauth2, with: { token-url: "https://auth.example.com/token", client-id: app }, max-per-request: 1, on-exhausted: logout }
                rules:
                  - { name: unauthorized, when: { status: [401] }, then: refresh }
                """,
            exampleHeader + """
                refresh: { use: oauth2, with: { token-url: "https://auth.example.com/token", client-id: app }, share-window: 2s, max-per-request: 2, on-exhausted: fail }
                rules:
                  - { name: unauthorized, when: { status: [401] }, then: refresh }
                """,
        ])

    func check(_ context: LintContext) -> [Diagnostic] {
        context.compiledRules("refresh", keys: ["share-window", "on-exhausted"]) { flow in
            flow.action == .refresh && flow.refresh.shareWindow > .zero && flow.onExhausted?.action == .logout
        }.map { flow, range in
            let r = flow.refresh
            return .warning(
                Self.description.id,
                "with 'share-window: \(r.shareWindow.policyText)' a token that expires again within \(r.shareWindow.policyText) of a refresh is re-sent unchanged, uses up 'max-per-request' (\(r.maxPerRequest)) and logs the user out; use 'share-window: 0s' (requests on an older token are re-sent with the new one anyway) or 'on-exhausted: fail'",
                at: range)
        }
    }
}
