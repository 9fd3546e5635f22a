import Foundation
import ResponsePolicyTesting
import Testing

@testable import ResponsePolicy

/// Issue 32 item 8: lint, explain, graph and diff stay linear (or bounded) in routes and rules.
/// Wall time is measured in `policy-bench`; these check the shapes that used to blow up, by what
/// they produce and by steps, and that the faster paths say the same as the plain ones.
struct ScaleBoundsTests {
    /// The route index gives the same first covering route as comparing every earlier route.
    @Test func shadowedRouteIndexAgreesWithTheQuadraticScan() throws {
        var random = ScaleFixtures.Random(seed: 0x5C_A1E)
        let pieces = ["/a", "/a/b", "/api", "/api/v1", "/x?", "/a/*/c", ""]
        for _ in 0..<300 {
            var yaml = "policy: 1\nname: r\nrules: []\nroutes:\n"
            for _ in 0..<random.int(1...14) {
                var match: [String] = []
                if random.chance(85) {
                    var path = pieces[random.int(0...(pieces.count - 1))]
                    if random.chance(60) { path += random.chance(50) ? "/*" : "*" }
                    if random.chance(15) { path += "/?" }
                    match.append("path: '\(path.isEmpty ? "*" : path)'")
                }
                if random.chance(40) {
                    match.append("method: [" + (random.chance(50) ? "GET" : "GET, POST") + "]")
                }
                yaml += "  - { match: { \(match.joined(separator: ", ")) }, retry: { max-retries: 1 } }\n"
            }
            let analysis = Policy.analyze(
                bytes: Array(yaml.utf8), file: "r.yaml", catalog: PluginCatalog(), limits: .default)
            guard let policy = analysis.policy else { continue }
            let routes = policy.routes
            var expected: [String] = []
            for (index, route) in routes.enumerated() {
                if let earlier = routes[..<index].firstIndex(where: { ShadowedRouteRule.covers($0, route) }) {
                    expected.append("route \(index + 1) never applies: route \(earlier + 1) comes first")
                }
            }
            let messages = analysis.diagnostics.filter { $0.rule == "shadowed-route" }.map(\.message)
            #expect(messages.count == expected.count, "\(yaml)")
            for (message, prefix) in zip(messages, expected) {
                #expect(message.hasPrefix(prefix), "\(message) vs \(prefix) in\n\(yaml)")
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
