import Foundation
import Testing

@testable import PolicyCLI

struct RuleReferenceTests {
    /// docs/lint-rules.md is `policy lint --list-rules`; regenerate it with that command.
    @Test func theRuleReferenceInDocsIsGeneratedFromTheRules() throws {
        var root = URL(fileURLWithPath: #filePath)
        while !FileManager.default.fileExists(atPath: root.appendingPathComponent("Package.swift").path) {
            root.deleteLastPathComponent()
        }
        let file = try String(contentsOf: root.appendingPathComponent("docs/lint-rules.md"), encoding: .utf8)
        #expect(file == LintCommand.ruleReference(), "run: swift run policy lint --list-rules > docs/lint-rules.md")
    }
}
