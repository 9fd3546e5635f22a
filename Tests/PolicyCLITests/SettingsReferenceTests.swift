import Foundation
import ResponsePolicy
import TestSupport
import Testing

@testable import PolicyCLI

/// docs/settings.md is printed from the settings tables the decoder reads, and the example in
/// docs/policy.md ("every value shown under refresh, logout and retry is that key's default")
/// is held to the same tables, so neither can drift from what the decoder does.
struct SettingsReferenceTests {
    @Test func theSettingsReferenceInDocsIsGeneratedFromTheTables() async throws {
        let file = try String(contentsOf: repositoryRoot.appendingPathComponent("docs/settings.md"), encoding: .utf8)
        let result = try await runPolicy(["schema", "--list-settings"])
        #expect(result.status == 0)
        #expect(result.stderr == "")
        #expect(file == result.stdout, "run: swift run policy schema --list-settings > docs/settings.md")
    }

    /// Each key has its row under its section, with the table's type, default and meaning.
    @Test func everyKeyHasItsRowUnderItsSection() throws {
        let markdown = SettingsReference.markdown()
        var rows = 0
        for section in SettingsReference.sections {
            let start = try #require(markdown.range(of: "\n## \(section.name)\n"), "no heading for \(section.name)")
            let rest = markdown[start.upperBound...]
            let body = rest[..<(rest.range(of: "\n## ")?.lowerBound ?? rest.endIndex)]
            func check(_ key: SettingInfo, _ prefix: String) {
                let row =
                    "| `\(prefix + key.name)` | \(SettingsReference.type(key.kind)) | `\(key.defaultValue.policyText)` | "
                #expect(body.contains(row), "\(section.name) lacks \(row)")
                #expect(body.contains(SettingsReference.escaped(key.doc) + " |\n"), "\(section.name).\(key.name)")
                rows += 1
                if case .noneOr(let nested) = key.kind { for inner in nested { check(inner, prefix + key.name + ".") } }
            }
            for key in section.keys { check(key, "") }
        }
        #expect(rows == markdown.components(separatedBy: "\n| `").count - 1)
        // A rule may override max-retries, not the deadline (request-wide).
        #expect(markdown.contains("| `max-retries` | whole number, 0 to 100 | `3` | yes | "))
        #expect(markdown.contains("| `deadline` | duration or `none` | `2m` | no | "))
        #expect(markdown.contains("| `budget.min` | whole number, 0 to 1000000 | `100` | yes | "))
    }

    /// docs/policy.md's "Every key at a glance" writes every key of retry, refresh, logout and
    /// dispatch, each with its default, as it says it does.
    @Test func theKeysAtAGlanceAreTheTablesWithTheirDefaults() throws {
        let reference = try String(
            contentsOf: repositoryRoot.appendingPathComponent("docs/policy.md"), encoding: .utf8)
        let heading = try #require(reference.range(of: "## Every key at a glance\n"))
        let open = try #require(reference.range(of: "```yaml\n", range: heading.upperBound..<reference.endIndex))
        let close = try #require(reference.range(of: "\n```\n", range: open.upperBound..<reference.endIndex))
        let yaml = String(reference[open.upperBound..<close.lowerBound]) + "\n"
        let policy = try Policy.load(yaml: yaml, file: "docs/policy.md")
        let root = try #require(Policy.parse(bytes: Array(yaml.utf8), limits: .default).root)
        func written(_ section: String) -> Set<String> {
            let node = root.pairs?.first { $0.key.scalar == section }?.value
            return Set(node?.pairs?.compactMap(\.key.scalar) ?? [])
        }
        let sections: [(String, [String], [(key: String, value: String)], [(key: String, value: String)])] = [
            ("retry", RetrySettings.names, policy.retry.settingTexts(), RetrySettings.defaults.settingTexts()),
            ("refresh", RefreshSettings.names, policy.refresh.settingTexts(), RefreshSettings.defaults.settingTexts()),
            ("logout", LogoutSettings.names, policy.logout.settingTexts(), LogoutSettings.defaults.settingTexts()),
            (
                "dispatch", DispatchSettings.names, policy.dispatch.settingTexts(),
                DispatchSettings.defaults.settingTexts()
            ),
        ]
        for (section, names, shown, defaults) in sections {
            #expect(written(section).subtracting(["use", "with"]) == Set(names), "docs/policy.md's \(section):")
            #expect(shown.map(\.key) == defaults.map(\.key))
            for (shown, standard) in zip(shown, defaults) where shown.value != standard.value {
                Issue.record(
                    "docs/policy.md shows \(section).\(shown.key): \(shown.value); its default is \(standard.value)")
            }
        }
    }
}
