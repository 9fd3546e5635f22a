/// A `refresh` rule that a 401 or 403 answering `WWW-Authenticate: Bearer error="insufficient_scope"`
/// reaches: the token is valid and lacks a scope (RFC 6750 §3.1), so a new token is refused again.
///
/// The check asks the compiled classifier, as the engine does: it classifies such an answer for
/// the request the rule is written for (its method and path, or its route's), and warns when the
/// answer lands on the rule. So a rule before it that catches the challenge, or a header match on
/// the rule itself, silences it, whatever its spelling.
struct InsufficientScopeRule: LintRule {
    static let description = LintRuleDescription(
        id: "refresh-on-insufficient-scope",
        summary: "a 401 refresh rule also refreshes on 'insufficient_scope', which a new token cannot fix",
        rationale: """
            RFC 6750 §3.1: a resource server answers 401 or 403 with 'WWW-Authenticate: Bearer \
            error="insufficient_scope"' when the token is valid but lacks a scope the request needs. \
            A refresh issues a token with the same scopes, which the server refuses again: the \
            request is re-sent for nothing, uses up 'max-per-request' and, with 'on-exhausted: \
            logout', ends a session the server never ended. Catch the challenge before the refresh \
            rule and deliver it to the caller (the shipped policies do): 'when: { status: [401, \
            403], header: { WWW-Authenticate: "*insufficient_scope*" } }, then: deliver'.
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
                refresh: { use: oauth2, with: { token-url: "https://auth.example.com/token", client-id: app } }
                rules:
                  - { name: missing-scope, when: { status: [401, 403], header: { WWW-Authenticate: "*insufficient_scope*" } }, then: deliver }
                  - { name: unauthorized, when: { status: [401] }, then: refresh }
                """,
            exampleHeader + """
                refresh: { use: oauth2, with: { token-url: "https://auth.example.com/token", client-id: app } }
                rules:
                  - { name: expired, when: { status: [401], header: { WWW-Authenticate: "*invalid_token*" } }, then: refresh }
                """,
            exampleHeader + """
                classify: { code: body.status }
                refresh: { use: oauth2, with: { token-url: "https://auth.example.com/token", client-id: app } }
                rules:
                  - { name: token-expired, when: { code: [1401] }, then: refresh }
                """,
        ])

    /// The challenge of a token that lacks a scope, as a resource server sends it.
    static let challenge: HTTPHeaders = [
        "WWW-Authenticate": #"Bearer realm="api", error="insufficient_scope", scope="admin""#
    ]

    func check(_ context: LintContext) -> [Diagnostic] {
        var found: [Diagnostic] = []
        // Each list of rules once, with the scope that runs it (a route that keeps the top-level
        // rules is not asked again).
        for (_, scope) in context.ruleSets {
            for flow in scope.compiled where flow.action == .refresh {
                let when = flow.rule.when
                let method = when.methods?.first ?? scope.route?.methods?.first ?? "GET"
                let path = Self.sample(when.path ?? scope.route?.path)
                let reached = [401, 403].filter { status in
                    scope.classifier.match(
                        status: status, code: nil, headers: Self.challenge, method: method, path: path)
                        == flow.index
                }
                guard !reached.isEmpty else { continue }
                let range =
                    flow.rule.source.when ?? flow.rule.source.name
                    ?? context.location(context.prefix(scope, "rules"))
                found.append(
                    .warning(
                        Self.description.id,
                        "rule '\(flow.rule.name)' refreshes a \(reached.map(String.init).joined(separator: " or ")) whose"
                            + " 'WWW-Authenticate' says error=\"insufficient_scope\": the token is valid and lacks a scope"
                            + " (RFC 6750 §3.1), so a new token is refused again; add a rule before it: '{ name:"
                            + " missing-scope, when: { status: [401, 403], header: { WWW-Authenticate:"
                            + " \"*insufficient_scope*\" } }, then: deliver }'",
                        at: range))
            }
        }
        return found
    }

    /// A path the glob matches (each `*` and `?` as one letter), `/` without a glob.
    static func sample(_ glob: Glob?) -> String {
        guard let glob else { return "/" }
        return String(glob.pattern.map { $0 == "*" || $0 == "?" ? "x" : $0 })
    }
}
