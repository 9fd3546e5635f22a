/// A business code listed in two rules that would act differently on it: the same code, a code
/// inside an earlier rule's range, or two ranges that overlap.
struct ConflictingCodesRule: LintRule {
    static let description = LintRuleDescription(
        id: "conflicting-codes",
        summary: "a business code (or a code range) appears in two rules with different actions",
        rationale: """
            First match wins, so the second rule never acts on that code; a code meaning both \
            "refresh" and "log out" is almost always a copy-and-paste mistake.
            """,
        severity: .error,
        triggering: [
            exampleHeader + """
                classify: { code: body.status }
                refresh: { use: oauth2, with: { token-url: "https://auth.example.com/token", client-id: app } }
                rules:
                  - { name: a, when: { code: [1401] }, then: refresh }
                  - { name: b, when: { code: [1401, 202] }, then: logout }
                """,
            exampleHeader + """
                classify: { code: body.status }
                refresh: { use: oauth2, with: { token-url: "https://auth.example.com/token", client-id: app } }
                rules:
                  - { name: a, when: { code: [1401] }, then: refresh }
                  - { name: b, when: { code: ["1400-1499"] }, then: logout }
                """,
            exampleHeader + """
                classify: { code: body.status }
                rules:
                  - { name: a, when: { code: ["1400-1499"] }, then: fail }
                  - { name: b, when: { code: ["1450-1550"] }, then: logout }
                """,
        ],
        nonTriggering: [
            exampleHeader + """
                classify: { code: body.status }
                rules:
                  - { name: a, when: { code: [1401] }, then: logout }
                  - { name: b, when: { code: [202] }, then: logout }
                  - { name: c, when: { code: [202], path: "/admin/*" }, then: fail }
                """,
            exampleHeader + """
                classify: { code: body.status }
                rules:
                  - { name: a, when: { code: ["1400-1499"] }, then: fail }
                  - { name: b, when: { code: ["1500-1599", 1600] }, then: logout }
                """,
        ])

    func check(_ context: LintContext) -> [Diagnostic] {
        var findings: [Diagnostic] = []
        for (rules, scope) in context.ruleSets {
            // The first rule of each code that more than one rule names: integer codes by value (a
            // canonical integer text and its value determine each other, so codes are not hashed as
            // text), others by text.
            var firstByValue: [Int64: Int] = [:]
            var firstByText: [String: Int] = [:]
            // Earlier rules' ranges, and integer codes, to check ranges and codes against.
            var ranges: [(range: CodeRange, text: String, rule: Int)] = []
            var integers: [(value: Int64, text: String, rule: Int)] = []
            func conflict(_ earlierIndex: Int, _ earlierText: String, _ index: Int, _ text: String) {
                let earlier = rules[earlierIndex]
                let rule = rules[index]
                let what =
                    earlierText == text ? "code '\(text)' is" : "code '\(text)' overlaps '\(earlierText)', which is"
                var fix = "remove it from one of them"
                if earlierText != text, let value = CodeTable.canonicalInteger(earlierText),
                    let range = rule.when.codeRanges?.first(where: { $0.description == text })
                {
                    // A code carved out of a later range: say how to split the range around it.
                    let pieces = [(range.lower, value - 1), (value + 1, range.upper)].filter { $0.0 <= $0.1 }
                        .map { $0.0 == $0.1 ? "\($0.0)" : "'\($0.0)-\($0.1)'" }
                    fix = "split the range around it: " + pieces.joined(separator: ", ")
                }
                findings.append(
                    .error(
                        Self.description.id,
                        "\(what) in rule '\(earlier.name)' (\(earlier.action.rawValue)) and rule '\(rule.name)' (\(rule.action.rawValue)); the first match wins, so \(fix)",
                        at: rule.source.codes[text] ?? rule.range,
                        notes: [
                            .init(
                                range: earlier.source.codes[earlierText] ?? earlier.range,
                                message: "'\(earlierText)' first listed here")
                        ]))
            }
            func conflicts(_ earlierIndex: Int, _ index: Int) -> Bool {
                rules[earlierIndex].action != rules[index].action
                    && Self.sameFilters(rules[earlierIndex].when, rules[index].when)
            }
            for (index, rule) in rules.enumerated() {
                let codes = rule.when.codes ?? []
                for code in codes {
                    let value = CodeTable.canonicalInteger(code)
                    // The code of a rule whose codes no other rule names (nearly every rule of a
                    // large policy) has no earlier rule naming it and no later one: it needs no
                    // entry. (A rule listing several codes may list one twice; those go through
                    // the tables, which see the repeat.)
                    if codes.count > 1 || scope.classifier.sharesCode[index] {
                        let earlier = if let value { firstByValue[value] } else { firstByText[code] }
                        if let earlierIndex = earlier {
                            if conflicts(earlierIndex, index) { conflict(earlierIndex, code, index, code) }
                            continue
                        }
                        if let value { firstByValue[value] = index } else { firstByText[code] = index }
                    }
                    guard let value else { continue }
                    if let earlier = ranges.first(where: { $0.range.contains(value) && conflicts($0.rule, index) }) {
                        conflict(earlier.rule, earlier.text, index, code)
                    }
                    integers.append((value, code, index))
                }
                for range in rule.when.codeRanges ?? [] {
                    let text = range.description
                    if let earlier = ranges.first(where: {
                        $0.rule < index && $0.range.lower <= range.upper && range.lower <= $0.range.upper
                            && conflicts($0.rule, index)
                    }) {
                        conflict(earlier.rule, earlier.text, index, text)
                    } else if let earlier = integers.first(where: {
                        $0.rule < index && range.contains($0.value) && conflicts($0.rule, index)
                    }) {
                        conflict(earlier.rule, earlier.text, index, text)
                    }
                }
                for range in rule.when.codeRanges ?? [] { ranges.append((range, range.description, index)) }
            }
        }
        return findings
    }

    /// Both rules constrain everything but the code alike, so they meet the same responses.
    static func sameFilters(_ a: Condition, _ b: Condition) -> Bool {
        a.statuses == b.statuses && a.headers == b.headers && a.methods == b.methods && a.path == b.path
    }
}
