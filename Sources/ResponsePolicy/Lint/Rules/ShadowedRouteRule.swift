/// A route no request reaches because an earlier route always catches its requests.
struct ShadowedRouteRule: LintRule {
    static let description = LintRuleDescription(
        id: "shadowed-route",
        summary: "a route is shadowed by an earlier route that matches every request it matches",
        rationale: "The first matching route wins, so the later route's settings and rules never apply.",
        severity: .warning,
        triggering: [
            exampleHeader + """
                routes:
                  - match: { path: "/api/*" }
                    retry: { max-retries: 1 }
                  - match: { path: "/api/upload", method: [POST] }
                    retry: { max-retries: 0 }
                """
        ],
        nonTriggering: [
            exampleHeader + """
                routes:
                  - match: { path: "/api/upload", method: [POST] }
                    retry: { max-retries: 0 }
                  - match: { path: "/api/*" }
                    retry: { max-retries: 1 }
                """
        ])

    func check(_ context: LintContext) -> [Diagnostic] {
        var findings: [Diagnostic] = []
        let routes = context.parts.routes
        for (index, route) in routes.enumerated() {
            guard
                let earlier = routes[..<index].firstIndex(where: { Self.covers($0, route) })
            else { continue }
            findings.append(
                .warning(
                    Self.description.id,
                    "route \(index + 1) never applies: route \(earlier + 1) comes first and matches every request it does",
                    at: route.range,
                    notes: [.init(range: routes[earlier].range, message: "route \(earlier + 1) is here")]))
        }
        return findings
    }

    /// Whether every request `b` matches, `a` matches too.
    static func covers(_ a: Route, _ b: Route) -> Bool {
        if let methods = a.methods {
            guard let other = b.methods, other.allSatisfy(methods.contains) else { return false }
        }
        if let path = a.path {
            guard let other = b.path, other.isCovered(by: path) else { return false }
        }
        return true
    }
}
