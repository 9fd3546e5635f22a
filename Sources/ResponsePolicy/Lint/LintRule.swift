/// What a lint rule is for, with examples that the test suite runs and the docs reference shows.
package struct LintRuleDescription: Sendable {
    package var id: String
    package var summary: String
    package var rationale: String
    package var severity: Severity
    /// Policies (YAML) on which the rule must report at least once.
    package var triggering: [String]
    /// Policies on which the rule must stay silent.
    package var nonTriggering: [String]
}

/// What a semantic rule sees: the decoded sections, the compiled graph, the plugin catalog.
package struct LintContext {
    let parts: PolicyParts
    package let graph: RuleGraph
    let catalog: PluginCatalog
    /// Whether decoding reported an error. Findings that would only follow from it (a rule
    /// dropped for an unknown action leaves its section "unused") are not shown then.
    var decodeFailed = false
    /// Where decoding reported errors. A rule with an error inside it was decoded without the
    /// broken part (an invalid code dropped), so it is wider than written: comparisons with it
    /// (shadowing) would be follow-ons of that error and are not reported.
    var errorPositions: [SourcePosition] = []

    /// Whether decoding reported an error inside `range`.
    func hasError(in range: SourceRange) -> Bool {
        errorPositions.contains { range.start <= $0 && $0 <= range.end }
    }
}

/// One semantic check run after the schema decode. One rule per file under `Lint/Rules/`.
package protocol LintRule: Sendable {
    static var description: LintRuleDescription { get }
    func check(_ context: LintContext) -> [Diagnostic]
}

/// Runs every semantic lint rule.
package enum Linter {
    package static let rules: [any LintRule] = [
        ConflictingCodesRule(), MissingRefreshPluginRule(), CodeWithoutClassifyRule(), LoopingEdgeRule(),
        ShadowedRule(), DuplicateRuleNameRule(), UnboundedBackoffRule(), RetriedPostRule(), DeadlineRule(),
        UnusedSectionRule(), NeverRetriedRule(), ShareWindowLogoutRule(), UnboundedRetryAfterRule(),
        LeadingZeroCodeRule(), RouteDropsRulesRule(), RoutePathRule(), ShadowedRouteRule(), InitialAboveMaxDelayRule(),
        HiddenLogoutRule(), InsufficientScopeRule(),
        CoordinationLeaseRule(),
    ]

    /// Every rule's description: the semantic rules, then the schema checks of the decoder.
    package static var descriptions: [LintRuleDescription] {
        rules.map { type(of: $0).description } + SchemaChecks.descriptions
    }

    static func check(_ context: LintContext) -> [Diagnostic] {
        rules.flatMap { $0.check(context) }
    }
}

/// A minimal valid policy header for rule examples.
package let exampleHeader = "policy: 1\nname: example\n"

extension LintContext {
    /// Each list of rules as written, once: the top level, and every route with its own `rules:`,
    /// with the scope that runs them. Routes that inherit the top-level rules are not repeated.
    var ruleSets: [(rules: [Rule], scope: RuleGraph.Scope)] {
        graph.scopes.compactMap { scope in
            if let route = scope.route { return route.rules == nil ? nil : (scope.rules, scope) }
            return (scope.rules, scope)
        }
    }

    /// Where a setting was written (`retry.on-exhausted`), or where its section was, or 1:1.
    func location(_ path: String) -> SourceRange {
        if let range = parts.locations[path] { return range }
        let section = path.split(separator: ".").first.map(String.init) ?? path
        return parts.sections[section] ?? parts.rootRange
    }

    /// Whether a scope's setting should be reported at this scope: always at the top level; at a
    /// route only when the route writes that key (otherwise it inherits the top level's, which is
    /// reported there, once).
    func owns(_ scope: RuleGraph.Scope, _ section: String, _ key: String) -> Bool {
        guard scope.route != nil else { return true }
        return parts.locations[prefix(scope, section) + "." + key] != nil
    }

    /// The compiled rules of every scope that `matches`, each with where to report it: the first
    /// of `keys` the rule's own `then:` writes, else the first key in its scope's `section`.
    /// Rules that share that place (they inherit one section's setting) are reported once, there.
    func compiledRules(
        _ section: String, keys: [String], where matches: (RuleGraph.CompiledRule) -> Bool
    ) -> [(flow: RuleGraph.CompiledRule, range: SourceRange)] {
        var found: [(flow: RuleGraph.CompiledRule, range: SourceRange)] = []
        var seen = Set<String>()
        for scope in graph.scopes {
            for flow in scope.compiled where matches(flow) {
                let range =
                    keys.lazy.compactMap { flow.rule.source.keys[$0] }.first
                    ?? location(prefix(scope, section) + "." + (keys.first ?? ""))
                guard seen.insert("\(range.start.line):\(range.start.column)").inserted else { continue }
                found.append((flow, range))
            }
        }
        return found
    }

    /// The dotted prefix of a scope's sections: `retry` or `routes.2.retry`.
    func prefix(_ scope: RuleGraph.Scope, _ section: String) -> String {
        guard scope.route != nil, let number = scope.id.split(separator: "-").last else { return section }
        return "routes.\(number).\(section)"
    }
}
