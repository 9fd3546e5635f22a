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
        var budget = Glob.coverBudget  // bounds the glob-against-glob work of the whole run
        for (rules, scope) in context.ruleSets {
            var index = CoverIndex(classifier: scope.classifier)
            for position in rules.indices {
                let rule = rules[position]
                // Read out of the rule once: each read copied the condition's lists.
                let when = rule.when
                let candidates = index.candidates(for: when, at: position)
                if !context.hasError(in: rule.range),
                    let earlier = candidates.first(where: {
                        !context.hasError(in: rules[$0].range)
                            && Self.covers(rules[$0].when, when, budget: &budget)
                    }).map({ rules[$0] })
                {
                    findings.append(
                        .warning(
                            Self.description.id,
                            "rule '\(rule.name)' never matches: rule '\(earlier.name)' comes first and matches everything it does",
                            at: rule.source.when ?? rule.range,
                            notes: [.init(range: earlier.range, message: "'\(earlier.name)' is here")]))
                }
                index.add(when, at: position)
            }
        }
        return findings
    }

    /// The earlier rules of a list, indexed by what a covering rule must have: a rule `a` can
    /// cover `b` only if (for a `b` that matches responses) `a` names `b`'s first code or no code,
    /// and names `b`'s first status or no status; and (for a `b` that only matches failed
    /// attempts) `a` names errors. Within each list rules are kept by their `path` too, since a
    /// path only covers a pattern equal to it (or `*`, or a literal path it matches), and by their
    /// first `header:` condition, since a covering rule's header conditions are all among the
    /// covered rule's: so a file with thousands of rules on one status, each for its own path or
    /// header value, checks a handful of candidates per rule, not every earlier one (that was
    /// quadratic: 100,000 rules took 104 s). Lists hold positions in ascending order.
    struct CoverIndex {
        /// Positions by the covering rule's first header condition (`""`: none).
        ///
        /// The rules with no header condition (nearly all) are a plain list: a dictionary per
        /// bucket, for one key, made a file whose 2,000 rules on `520-599` each name a path
        /// hold 160,000 dictionaries.
        struct HeaderBucket {
            var none: [Int] = []
            var byHeader: [String: [Int]] = [:]

            mutating func add(_ position: Int, header: String) {
                if header.isEmpty {
                    none.append(position)
                } else {
                    byHeader[header, default: []].append(position)
                }
            }

            /// The positions whose header conditions can all be among `headers`.
            func candidates(for headers: [Condition.HeaderMatch]?, into lists: inout [[Int]]) {
                if !none.isEmpty { lists.append(none) }
                guard let headers, !byHeader.isEmpty else { return }
                var seen = Set<String>()
                for header in headers {
                    let key = CoverIndex.key(header)
                    if seen.insert(key).inserted, let list = byHeader[key] { lists.append(list) }
                }
            }
        }

        /// Positions by the covering rule's `path` pattern (`""`: no path), and all of them.
        ///
        /// A bucket of a few rules (one per business code, in a file of 20,000 codes) keeps them
        /// in a list and filters it; the dictionaries are built when it grows past
        /// ``Bucket/listLimit``, so a bucket costs one small array, not three dictionaries (the
        /// dictionaries were a fifth of a 20,000-rule lint's memory).
        struct Bucket {
            struct Entry {
                var position: Int
                var path: String
                var header: String
            }

            static let listLimit = 8
            var few: [Entry] = []
            var all = HeaderBucket()
            var byPath: [String: HeaderBucket] = [:]
            var indexed = false

            mutating func add(_ position: Int, path: String, header: String) {
                guard indexed else {
                    few.append(Entry(position: position, path: path, header: header))
                    if few.count > Self.listLimit {
                        indexed = true
                        for entry in few { index(entry.position, path: entry.path, header: entry.header) }
                        few = []
                    }
                    return
                }
                index(position, path: path, header: header)
            }

            private mutating func index(_ position: Int, path: String, header: String) {
                all.add(position, header: header)
                byPath[path, default: HeaderBucket()].add(position, header: header)
            }

            /// The positions whose path can cover `path` and whose headers can be among `headers`.
            func candidates(for path: Glob?, headers: [Condition.HeaderMatch]?, into lists: inout [[Int]]) {
                guard indexed else {
                    // Most buckets asked are empty (`ranged` and `open`, for a file of code rules).
                    if few.isEmpty { return }
                    // The same choice as the dictionaries below make, entry by entry.
                    let pattern = path?.pattern
                    let literal = pattern.map { !Self.isPattern($0) } ?? false
                    let keys = headers.map { Set($0.map(CoverIndex.key)) }
                    let found = few.filter { entry in
                        let pathFits: Bool
                        if let pattern {
                            pathFits = literal || entry.path.isEmpty || entry.path == "*" || entry.path == pattern
                        } else {
                            pathFits = entry.path.isEmpty
                        }
                        return pathFits && (entry.header.isEmpty || keys?.contains(entry.header) == true)
                    }
                    if !found.isEmpty { lists.append(found.map(\.position)) }
                    return
                }
                guard let path else {
                    byPath[""]?.candidates(for: headers, into: &lists)
                    return
                }
                let pattern = path.pattern
                if !Self.isPattern(pattern) {
                    // A literal path may be matched by any pattern: every candidate.
                    all.candidates(for: headers, into: &lists)
                    return
                }
                for key in ["", "*", pattern] where key != "*" || pattern != "*" {
                    byPath[key]?.candidates(for: headers, into: &lists)
                }
            }

            /// Whether a path pattern has a wildcard (bytes, not Foundation's `contains`).
            static func isPattern(_ pattern: String) -> Bool {
                pattern.utf8.contains { $0 == UInt8(ascii: "*") || $0 == UInt8(ascii: "?") }
            }
        }

        /// The key of a header condition: its name and pattern, as ``Condition/HeaderMatch`` compares.
        static func key(_ header: Condition.HeaderMatch) -> String {
            header.name + "\u{0}" + header.value.pattern
        }

        /// The scope's decision table, built over the same rules: which rules share a code.
        let classifier: Classifier

        /// Rules naming business codes, by each code, for rules whose codes another rule names
        /// too (a bucket holding a code's only rule would never be asked for: nearly every code
        /// of a large policy): integer codes by value (a canonical integer text and its value
        /// determine each other, and hashing 20,000 codes as text cost more), other codes by text.
        var byValue: [Int64: Bucket] = [:]
        var byCode: [String: Bucket] = [:]
        /// Rules naming code ranges.
        var ranged = Bucket()
        /// Rules naming no code, by each status they name (ranges wider than 100 go to `wide`).
        var byStatus: [Int: Bucket] = [:]
        var wide = Bucket()
        /// Rules matching responses that name neither a code nor a status.
        var open = Bucket()
        var erroring = Bucket()
        var every: [Int] = []

        init(classifier: Classifier) {
            self.classifier = classifier
        }

        mutating func add(_ when: Condition, at position: Int) {
            every.append(position)
            let path = when.path?.pattern ?? ""
            // Only a rule matching responses is covered by header conditions (an `error:` rule's
            // headers are never read), so error rules are kept with their headers as none.
            let header = when.headers?.first.map(Self.key) ?? ""
            if when.errors != nil { erroring.add(position, path: path, header: "") }
            guard when.matchesResponses else { return }
            if let codes = when.codes {
                // A rule whose codes no other rule names is never asked for by code: no buckets.
                if classifier.sharesCode[position] {
                    if codes.count == 1 {
                        // One code (nearly every rule): no set to make to skip repeats.
                        addCode(codes[0], position, path: path, header: header)
                    } else {
                        for code in Set(codes) { addCode(code, position, path: path, header: header) }
                    }
                }
                if when.codeRanges != nil { ranged.add(position, path: path, header: header) }
            } else if let statuses = when.statuses {
                if statuses.reduce(0, { $0 + $1.upper - $1.lower + 1 }) > 100 {
                    wide.add(position, path: path, header: header)
                } else {
                    // One range (nearly every rule) repeats no status: no set to fill.
                    let single = statuses.count == 1
                    var seen = Set<Int>()
                    for range in statuses {
                        for status in range.lower...range.upper where single || seen.insert(status).inserted {
                            byStatus[status, default: Bucket()].add(position, path: path, header: header)
                        }
                    }
                }
            } else {
                open.add(position, path: path, header: header)
            }
        }

        private mutating func addCode(_ code: String, _ position: Int, path: String, header: String) {
            if let value = CodeTable.canonicalInteger(code) {
                byValue[value, default: Bucket()].add(position, path: path, header: header)
            } else {
                byCode[code, default: Bucket()].add(position, path: path, header: header)
            }
        }

        /// Earlier positions that may cover `when`, the condition of the rule at `position`,
        /// ascending: every one, however far back.
        func candidates(for when: Condition, at position: Int) -> [Int] {
            var lists: [[Int]] = []
            if when.matchesResponses {
                let headers = when.headers
                if when.codes != nil {
                    if let code = when.codes?.first, classifier.sharesCode[position] {
                        let bucket =
                            if let value = CodeTable.canonicalInteger(code) { byValue[value] } else { byCode[code] }
                        bucket?.candidates(for: when.path, headers: headers, into: &lists)
                    }
                    ranged.candidates(for: when.path, headers: headers, into: &lists)
                }
                open.candidates(for: when.path, headers: headers, into: &lists)
                if let status = when.statuses?.first?.lower {
                    byStatus[status]?.candidates(for: when.path, headers: headers, into: &lists)
                    wide.candidates(for: when.path, headers: headers, into: &lists)
                }
            } else if when.errors?.isEmpty == false {
                erroring.candidates(for: when.path, headers: nil, into: &lists)
            } else {
                // `error: []` matches nothing; anything may "cover" it.
                lists.append(every)
            }
            if lists.count <= 1 { return lists.first ?? [] }
            return lists.flatMap { $0 }.sorted()
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
            if a.codes != nil {
                // Codes by the reference matcher (``Condition/codeMatches(_:)``), ranges by containment.
                guard let other = b.codes else { return false }
                if let first = other.first, !a.codeMatches(first) { return false }  // quick reject
                guard other.allSatisfy(a.codeMatches) else { return false }
                let covering = a.codeRanges ?? []
                guard
                    (b.codeRanges ?? []).allSatisfy({ r in
                        covering.contains { $0.lower <= r.lower && r.upper <= $0.upper }
                    })
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
