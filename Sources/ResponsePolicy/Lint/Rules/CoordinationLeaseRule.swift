/// A coordination lease shorter than the refresh it covers.
///
/// The lease is how long the other processes wait for a holder that died. Shorter than
/// `refresh.timeout`, it can lapse while a live holder's refresh still runs: the next process is
/// granted a lease and presents the same refresh token (a reuse, which a rotating token server
/// punishes by revoking the session). The engine lengthens such a lease at run time; this says so.
struct CoordinationLeaseRule: LintRule {
    static let description = LintRuleDescription(
        id: "coordination-lease",
        summary: "a coordination 'lease' shorter than refresh.timeout",
        rationale: """
            A holder's refresh may run for refresh.timeout; a lease that ends sooner lets another \
            process take the turn and present the same refresh token while the first is still \
            refreshing. At run time a lease is never shorter than refresh.timeout (plus a tenth of \
            it, at most a second), so write that: the lease is also how long a dead holder delays \
            the others.
            """,
        severity: .warning,
        triggering: [
            exampleHeader + """
                refresh: { use: oauth2, with: { token-url: "https://auth.example.com/token", client-id: app }, timeout: 10s }
                coordination: { use: redis, with: { url: "redis://127.0.0.1:6379/0", key: api, lease: 5s } }
                rules:
                  - { name: unauthorized, when: { status: [401] }, then: refresh }
                """
        ],
        nonTriggering: [
            exampleHeader + """
                refresh: { use: oauth2, with: { token-url: "https://auth.example.com/token", client-id: app }, timeout: 10s }
                coordination: { use: redis, with: { url: "redis://127.0.0.1:6379/0", key: api, lease: 15s } }
                rules:
                  - { name: unauthorized, when: { status: [401] }, then: refresh }
                """
        ])

    func check(_ context: LintContext) -> [Diagnostic] {
        let coordination = context.parts.coordination
        guard let text = coordination.options["lease"]?.string, let lease = Duration.parsePolicy(text),
            lease > .zero
        else { return [] }
        var longest = context.parts.refresh.timeout
        for scope in context.graph.scopes { longest = max(longest, scope.refresh.timeout) }
        guard lease < longest else { return [] }
        return [
            .warning(
                Self.description.id,
                "'lease: \(lease.policyText)' is shorter than refresh.timeout (\(longest.policyText)): a lease that ends while its holder still refreshes lets another process present the same refresh token; the engine lengthens it to \(longest.policyText) and more at run time, write 'lease: \((longest + min(longest / 10, .seconds(1))).policyText)' or longer",
                at: coordination.range ?? context.parts.rootRange)
        ]
    }
}
