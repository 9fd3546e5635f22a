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

    /// How many earlier rules that could cover a rule are checked per index list, nearest first.
    /// Only rules that pass the necessary tests in ``CoverIndex`` are candidates, so this bounds
    /// the rare file where hundreds of rules share one code or status (the generated 20,000-rule
    /// file of `scripts/lint-speed.sh` has 2,000 rules on one status: 2,000 here made its lint
    /// 850 ms, 500 makes it 600 ms), not the usual large file.
    static let candidateLimit = 500

    func check(_ context: LintContext) -> [Diagnostic] {
        var findings: [Diagnostic] = []
        var budget = Glob.coverBudget  // bounds the glob-against-glob work of the whole run
        for (rules, _) in context.ruleSets {
            var index = CoverIndex()
            for position in rules.indices {
                let rule = rules[position]
                let candidates = index.candidates(for: rule.when, limit: Self.candidateLimit)
                if let earlier = candidates.first(where: { Self.covers(rules[$0].when, rule.when, budget: &budget) })
                    .map({ rules[$0] })
                {
                    findings.append(
                        .warning(
                            Self.description.id,
                            "rule '\(rule.name)' never matches: rule '\(earlier.name)' comes first and matches everything it does",
                            at: rule.source.when ?? rule.range,
                            notes: [.init(range: earlier.range, message: "'\(earlier.name)' is here")]))
                }
                index.add(rule.when, at: position)
            }
        }
        return findings
    }

    /// The earlier rules of a list, indexed by what a covering rule must have: a rule `a` can
    /// cover `b` only if (for a `b` that matches responses) `a` names `b`'s first code or no code,
    /// and names `b`'s first status or no status; and (for a `b` that only matches failed
    /// attempts) `a` names errors. Lists hold positions in ascending order.
    struct CoverIndex {
        var byCode: [String: [Int]] = [:]
        /// Rules naming no code, by each status they name (ranges wider than 100 go to `wide`).
        var byStatus: [Int: [Int]] = [:]
        var wide: [Int] = []
        /// Rules matching responses that name neither a code nor a status.
        var open: [Int] = []
        var erroring: [Int] = []
        var every: [Int] = []

        mutating func add(_ when: Condition, at position: Int) {
            every.append(position)
            if when.errors != nil { erroring.append(position) }
            guard when.matchesResponses else { return }
            if let codes = when.codes {
                for code in Set(codes) { byCode[code, default: []].append(position) }
            } else if let statuses = when.statuses {
                if statuses.reduce(0, { $0 + $1.upper - $1.lower + 1 }) > 100 {
                    wide.append(position)
                } else {
                    var seen = Set<Int>()
                    for range in statuses {
                        for status in range.lower...range.upper where seen.insert(status).inserted {
                            byStatus[status, default: []].append(position)
                        }
                    }
                }
            } else {
                open.append(position)
            }
        }

        /// Earlier positions that may cover `when`, ascending, each list cut to its `limit` nearest.
        func candidates(for when: Condition, limit: Int) -> [Int] {
            var lists: [ArraySlice<Int>] = []
            if when.matchesResponses {
                if let code = when.codes?.first { lists.append(byCode[code]?.suffix(limit) ?? []) }
                lists.append(open.suffix(limit))
                if let status = when.statuses?.first?.lower {
                    lists.append(byStatus[status]?.suffix(limit) ?? [])
                    lists.append(wide.suffix(limit))
                }
            } else if when.errors?.isEmpty == false {
                lists.append(erroring.suffix(limit))
            } else {
                // `error: []` matches nothing; anything may "cover" it.
                lists.append(every.suffix(limit))
            }
            let all = lists.flatMap { $0 }
            return lists.count == 1 ? all : all.sorted()
        }
    }

    static func isCovered(_ range: StatusRange, by ranges: [StatusRange]) -> Bool {
        ranges.contains { $0.lower <= range.lower && range.upper <= $0.upper }
    }

    /// Whether every response or error `b` matches, `a` matches too.
    static func covers(_ a: Condition, _ b: Condition, budget: inout Int) -> Bool {
        if let methods = a.methods {
            guard let other = b.methods, other.allSatisfy(methods.contains) else { return false }
        }
        if let path = a.path {
            guard let other = b.path, other.isCovered(by: path, budget: &budget) else { return false }
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
