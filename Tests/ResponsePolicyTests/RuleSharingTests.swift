import Testing

@testable import ResponsePolicy

/// A `Rule` is one copy-on-write box shared by the decoded rules, every scope and every compiled
/// rule; rule node labels and a plain rule's edges are made when asked (issue 22 item 5: lint
/// speed and memory). These tests check that sharing is invisible: a changed copy never changes
/// the rule it came from, and what is made on demand is what the graph holds.
struct RuleSharingTests {
    @Test(arguments: [11, 12, 13] as [UInt64])
    func aChangedCopyLeavesTheSharedRuleAlone(seed: UInt64) throws {
        let policy = try Policy.load(yaml: CompiledSharingTests.policy(seed: seed, count: 40))
        let scope = try #require(policy.graph.scopes.last)
        for (index, flow) in scope.compiled.enumerated() {
            let original = policy.rules[index]
            // The compiled rule holds the decoded rule itself, equal by value.
            #expect(flow.rule == original)
            var copy = flow.rule
            copy.name += "-changed"
            copy.when.codes = ["other"]
            copy.action = original.action == .fail ? .deliver : .fail
            copy.source.codes["other"] = .fileStart
            #expect(copy != original)
            #expect(flow.rule == original)
            #expect(policy.rules[index].name == original.name)
            #expect(policy.rules[index].when.codes == original.when.codes)
            #expect(scope.rules[index].action == original.action)
            #expect(flow.rule.source.codes["other"] == nil)
            // Equal values hash alike, whether or not they share a box.
            var rebuilt = Rule(name: original.name, when: original.when, action: original.action, range: original.range)
            rebuilt.retry = original.retry
            rebuilt.refresh = original.refresh
            rebuilt.logout = original.logout
            rebuilt.overrides = original.overrides
            rebuilt.source = original.source
            #expect(rebuilt == original)
            #expect(rebuilt.hashValue == original.hashValue)
        }
    }

    @Test(arguments: [21, 22, 23] as [UInt64])
    func labelsAndEdgesMadeWhenAskedAreTheGraphs(seed: UInt64) throws {
        let policy = try Policy.load(yaml: CompiledSharingTests.policy(seed: seed, count: 40))
        for scope in policy.graph.scopes {
            let edgeIDs = Set(scope.edges.map(\.id))
            for flow in scope.compiled {
                // Every edge a compiled rule reports is one of its scope's, in the scope's order.
                let own = flow.edges
                #expect(own.allSatisfy { edgeIDs.contains($0.id) })
                let start = try #require(scope.edges.firstIndex { $0 == own.first })
                #expect(Array(scope.edges[start..<(start + own.count)]) == own)
                #expect(
                    own.first == RuleGraph.Edge(from: scope.id + ".classify", to: flow.node, kind: .match, label: ""))
                #expect(own.contains { $0.from == flow.node && $0.to == flow.actionNode && $0.kind == .then })
                // The rule's node says its number, name and condition.
                let node = try #require(scope.nodes.first { $0.id == flow.node })
                #expect(node.label == "\(flow.index + 1). \(flow.rule.name): \(RuleGraph.describe(flow.rule.when))")
                #expect(
                    node
                        == RuleGraph.Node(
                            id: node.id, kind: .rule, label: node.label, scope: scope.id, rule: flow.index, action: nil,
                            settings: .none))
            }
        }
    }
}
