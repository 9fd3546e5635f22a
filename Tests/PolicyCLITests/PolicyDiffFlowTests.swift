import Foundation
import ResponsePolicyTesting
import Testing

@testable import PolicyCLI
@testable import ResponsePolicy

/// `policy diff` (PolicyDiff, in the CLI: no service links it) reads the compiled flow: a change
/// of any key is a difference, and a hostile pair stays bounded (issue 32 item 8).
struct PolicyDiffFlowTests {
    /// A value of each key other than its default, as the policy writes it.
    static func otherValue(_ info: SettingInfo) -> String {
        let standard = info.defaultValue.policyText
        switch info.kind {
        case .integer(let range):
            return standard == "\(range.lowerBound)" ? "\(range.upperBound)" : "\(range.lowerBound)"
        case .number(let range): return formatNumber(range.upperBound)
        case .boolean: return standard == "true" ? "false" : "true"
        case .duration: return "7s"
        case .durationOrNone: return standard == "none" ? "7s" : "none"
        case .action: return standard == "fail" ? "deliver" : "fail"
        case .choice(let values): return values.first { $0 != standard } ?? standard
        case .noneOr: return "none"
        case .custom:
            let others = [
                "jitter": "full", "methods": "[GET]", "idempotency-key": "none", "max-in-flight-per-host": "7",
            ]
            return others[info.name] ?? standard
        }
    }

    /// `policy diff` reads the compiled flow's settings, so a change of any key of any section
    /// is a change in behaviour, named after the key (`hold-new-requests` was once missing from
    /// the compiled settings, and a change of it was "no change in behaviour"); a key whose
    /// value is an action is compared as the edges it leads to.
    @Test(arguments: ["retry", "refresh", "logout", "dispatch"])
    func aChangeOfAnyKeyIsADifference(_ section: String) throws {
        let base = """
            policy: 1
            name: t
            rules:
              - { name: r, when: { status: [503] }, then: retry }
              - { name: s, when: { status: [419] }, then: refresh }
              - { name: l, when: { status: [403] }, then: logout }
            refresh:
              use: oauth2
              with: { token-url: "https://a.example.com/t", client-id: x }

            """
        let infos: [SettingInfo] =
            switch section {
            case "retry": RetrySettings.infos
            case "refresh": RefreshSettings.infos
            case "logout": LogoutSettings.infos
            default: DispatchSettings.infos
            }
        let old = try Policy.load(yaml: base)
        for info in infos {
            let value = Self.otherValue(info)
            #expect(value != info.defaultValue.policyText, "\(info.name)")
            let line = "  \(info.name): \(value)\n"
            let yaml = section == "refresh" ? base + line : base + "\(section):\n" + line
            let new = try Policy.load(yaml: yaml)
            let changes = PolicyDiff(old: old, new: new).changes
            if case .action = info.kind {
                #expect(changes.contains { $0.kind == .escalation && $0.key == info.name }, "\(info.name): \(changes)")
            } else {
                #expect(
                    changes.contains { $0.kind == .setting && $0.key == "\(section).\(info.name)" && $0.new == value },
                    "\(section).\(info.name): \(changes)")
            }
        }
    }

    /// A generated pair whose rules name hundreds of paths and header sets: `diff` compares its
    /// rules and says it did not compare its triggers, instead of writing lines of megabytes
    /// (a 100-rule pair wrote 73 MB, a 400-rule pair took over two minutes).
    @Test func aHostileMixedDiffIsBoundedAndSaysWhatItSkipped() throws {
        let (oldText, newText) = ScaleFixtures.mixedPair(400, seed: 3)
        let old = try Policy.load(yaml: oldText)
        let new = try Policy.load(yaml: newText)
        let diff = PolicyDiff(old: old, new: new)
        #expect(diff.notes.count == 1, "\(diff.notes)")
        #expect(diff.notes.first?.contains("triggers not compared") == true)
        #expect(diff.changes.contains { $0.kind == .rule && $0.key == "then" })
        #expect(!diff.changes.contains { $0.kind == .trigger })
        // The same rule changes as a small diff of the same pair would list: every changed action.
        let changedThen = zip(oldText.split(separator: "\n"), newText.split(separator: "\n")).filter { $0 != $1 }.count
        #expect(diff.changes.filter { $0.key == "then" }.count == changedThen)
    }

    /// Where triggers are compared, a set of contexts that is no product of methods, paths and
    /// header sets names its first few and counts the rest.
    @Test func aTriggerQualifierNamesAFewContextsAndCountsTheRest() throws {
        let (oldText, newText) = ScaleFixtures.mixedPair(60, seed: 3)
        let diff = PolicyDiff(old: try Policy.load(yaml: oldText), new: try Policy.load(yaml: newText))
        let triggers = diff.changes.filter { $0.kind == .trigger }
        #expect(!triggers.isEmpty)
        for change in triggers {
            for text in [change.old, change.new].compactMap({ $0 }) {
                #expect(text.utf8.count < 200_000, "\(change.key): \(text.utf8.count) bytes")
            }
        }
        #expect(triggers.contains { ($0.new ?? "").contains(" more request context") })
    }
}
