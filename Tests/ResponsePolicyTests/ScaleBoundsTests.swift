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
}
