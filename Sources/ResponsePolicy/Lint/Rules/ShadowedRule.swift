/// A rule that can never match because an earlier rule matches everything it would.
struct ShadowedRule: LintRule {
    static let description = LintRuleDescription(
        id: "shadowed-rule",
        summary: "a rule is shadowed by an earlier rule that matches everything it matches",
        rationale: "First match wins, so the later rule is dead: either it is misplaced or it can go.",
        severity: .warning,
        triggering: [
            exampleHeader + """
                rules:
                  - { name: server-errors, when: { status: ["500-599"] }, then: retry }
                  - { name: busy, when: { status: [503] }, then: fail }
                """
        ],
        nonTriggering: [
            exampleHeader + """
                rules:
                  - { name: busy, when: { status: [503] }, then: fail }
                  - { name: server-errors, when: { status: ["500-599"] }, then: retry }
                """
        ])

    func check(_ context: LintContext) -> [Diagnostic] {
        var findings: [Diagnostic] = []
        for (rules, _) in context.ruleSets {
            // Quadratic in the worst case; bounded so a 20,000-rule file stays fast.
            let window = 200
            for index in rules.indices {
                let rule = rules[index]
                for earlierIndex in max(0, index - window)..<index
                where Self.covers(rules[earlierIndex].when, rule.when) {
                    let earlier = rules[earlierIndex]
                    findings.append(
                        .warning(
                            Self.description.id,
                            "rule '\(rule.name)' never matches: rule '\(earlier.name)' comes first and matches everything it does",
                            at: rule.source.when ?? rule.range,
                            notes: [.init(range: earlier.range, message: "'\(earlier.name)' is here")]))
                    break
                }
            }
        }
        return findings
    }

    static func isCovered(_ range: StatusRange, by ranges: [StatusRange]) -> Bool {
        ranges.contains { $0.lower <= range.lower && range.upper <= $0.upper }
    }

    /// Whether every response or error `b` matches, `a` matches too.
    static func covers(_ a: Condition, _ b: Condition) -> Bool {
        if let methods = a.methods {
            guard let other = b.methods, other.allSatisfy(methods.contains) else { return false }
        }
        if let path = a.path {
            guard let other = b.path, other.isCovered(by: path) else { return false }
        }
        if b.matchesResponses {
            guard a.matchesResponses, a.statuses != nil || a.codes != nil || a.headers != nil || a.errors == nil else {
                return false
            }
            if let statuses = a.statuses {
                guard let other = b.statuses, other.allSatisfy({ Self.isCovered($0, by: statuses) }) else {
                    return false
                }
            }
            if let codes = a.codes {
                // Quick reject before the subset test: most rule pairs share no code at all.
                guard let other = b.codes, let first = other.first, codes.contains(first),
                    other.allSatisfy(codes.contains)
                else { return false }
            }
            if let headers = a.headers {
                guard let other = b.headers, headers.allSatisfy(other.contains) else { return false }
            }
        }
        if let errors = b.errors, !errors.isEmpty {
            guard let covering = a.errors else { return false }
            if !covering.contains(.any) {
                guard !errors.contains(.any), Set(errors).isSubset(of: covering) else { return false }
            }
        }
        return true
    }
}
