import Foundation

/// A request path pattern that can never match a request's path.
struct RoutePathRule: LintRule {
    static let description = LintRuleDescription(
        id: "invalid-path",
        summary: "a 'path' pattern without a leading '/' or with a scheme and host",
        rationale: """
            Paths are matched against the request's path alone ('/v1/items'), which always starts \
            with '/'; a pattern like 'v1/*' or 'https://api.example.com/v1/*' matches nothing.
            """,
        severity: .error,
        triggering: [
            exampleHeader + """
                routes:
                  - match: { path: "upload/*" }
                    rules: []
                """,
            exampleHeader + """
                rules:
                  - { name: busy, when: { status: [503], path: "https://api.example.com/v1/*" }, then: retry }
                """,
        ],
        nonTriggering: [
            exampleHeader + """
                routes:
                  - match: { path: "/upload/*" }
                    rules: []
                  - match: { path: "*/token" }
                    rules: []
                """
        ])

    func check(_ context: LintContext) -> [Diagnostic] {
        var findings: [Diagnostic] = []
        func check(_ glob: Glob?, at range: SourceRange, _ what: String) {
            guard let pattern = glob?.pattern, let problem = Self.problem(pattern) else { return }
            findings.append(
                .error(Self.description.id, "\(what) '\(pattern.truncatedForMessage)' \(problem)", at: range))
        }
        func check(_ rule: Rule) {
            // Where the rule's `when:` is, read only for a rule with a path.
            if let path = rule.when.path { check(path, at: rule.source.when ?? rule.range, "path") }
        }
        for route in context.parts.routes {
            check(route.path, at: route.range, "route path")
            for rule in route.rules ?? [] { check(rule) }
        }
        for rule in context.parts.rules { check(rule) }
        return findings
    }

    static func problem(_ pattern: String) -> String? {
        // The byte check first: Foundation's `range(of:)` is slow, and a path rarely has a ':'.
        if pattern.utf8.contains(UInt8(ascii: ":")), let scheme = pattern.range(of: "://") {
            let rest = pattern[scheme.upperBound...]
            let path = rest.firstIndex(of: "/").map { String(rest[$0...]) } ?? "/"
            return "has a scheme and host, but only the request's path is matched; write '\(path)'"
        }
        if pattern.hasPrefix("/") || pattern.hasPrefix("*") { return nil }
        return "does not start with '/', so it never matches a request's path; write '/\(pattern)'"
    }
}
