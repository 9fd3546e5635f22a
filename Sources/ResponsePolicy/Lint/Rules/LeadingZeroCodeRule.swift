/// A business code written with a leading zero.
struct LeadingZeroCodeRule: LintRule {
    static let description = LintRuleDescription(
        id: "code-leading-zero",
        summary: "a business code has a leading zero",
        rationale: """
            Codes compare by their text, so '0202' matches a body with "0202" but not the number \
            202 (which a JSON body sends as 202). Write the code as the server sends it. A code read \
            from a header (classify: { code: header.<Name> }) is always text, so a leading zero there \
            is what the server sends and is not reported.
            """,
        severity: .warning,
        triggering: [
            exampleHeader + """
                classify: { code: body.status }
                rules:
                  - { name: gone, when: { code: ["0202"] }, then: logout }
                """
        ],
        nonTriggering: [
            exampleHeader + """
                classify: { code: body.status }
                rules:
                  - { name: gone, when: { code: [202, "0"] }, then: logout }
                """,
            exampleHeader + """
                classify: { code: header.X-Status }
                rules:
                  - { name: gone, when: { code: ["0202"] }, then: logout }
                """,
        ])

    func check(_ context: LintContext) -> [Diagnostic] {
        var findings: [Diagnostic] = []
        for (rules, scope) in context.ruleSets {
            // A header's value is text as sent: '0202' there is the code the server sends.
            if case .header? = scope.classify { continue }
            for rule in rules {
                for code in rule.when.codes ?? [] where Self.hasLeadingZero(code) {
                    let digits = code.drop { $0 == "0" || $0 == "-" }
                    findings.append(
                        .warning(
                            Self.description.id,
                            "code '\(code.truncatedForMessage)' has a leading zero, so it is not \(digits.isEmpty ? "0" : String(digits)): codes compare by their text; write \(digits.isEmpty ? "0" : String(digits)) if the server sends a number",
                            at: rule.source.codes[code] ?? rule.range))
                }
            }
        }
        return findings
    }

    static func hasLeadingZero(_ code: String) -> Bool {
        // Over the bytes: `hasPrefix` and a substring of characters cost more than the check, for
        // every code. Two or more ASCII digits are as many bytes as characters, and a byte
        // that is no ASCII digit fails the check in either.
        var digits = code.utf8[...]
        if digits.first == UInt8(ascii: "-") { digits = digits.dropFirst() }
        guard digits.first == UInt8(ascii: "0") else { return false }
        return digits.count > 1 && digits.allSatisfy { $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }
    }
}
