import Foundation
import TestSupport
import Testing

@testable import ResponsePolicy

/// The flat node store behind ``YAMLNode``: nodes compare by what they hold (not by which
/// document holds them), a detached copy is the same value, duplicate keys are found the same way
/// in small mappings (scanned) and large ones (a table), and a decoded policy does not keep its
/// file's nodes alive.
struct YAMLDocumentTests {
    func load(_ text: String) throws -> (YAMLNode?, [Diagnostic]) {
        var diagnostics: [Diagnostic] = []
        let node = try YAMLLoader().load(Array(text.utf8), diagnostics: &diagnostics)
        return (node, diagnostics)
    }

    /// Every node under `node`, itself first, keys included.
    func walk(_ node: YAMLNode) -> [YAMLNode] {
        var out = [node]
        switch node.value {
        case .scalar: break
        case .mapping(let pairs):
            for pair in pairs { out += walk(pair.key) + walk(pair.value) }
        case .sequence(let items):
            for item in items { out += walk(item) }
        }
        return out
    }

    /// The node as text with every range, tag and style, to compare two trees in full.
    func shape(_ node: YAMLNode) -> String {
        let head = "\(node.range)\(node.tag.map { "!\($0)" } ?? "")"
        switch node.value {
        case .scalar(let text, let style): return "\(head)'\(text)'/\(style)"
        case .sequence(let items): return head + "[" + items.map(shape).joined(separator: ",") + "]"
        case .mapping(let pairs):
            return head + "{" + pairs.map { shape($0.key) + ":" + shape($0.value) }.joined(separator: ",") + "}"
        }
    }

    static let documents = [
        "a: 1\nb: [x, 'y', \"z\"]\nc: { d: ~, e: !!str 5 }\n",
        "base: &b { k: 1, l: [1, 2] }\nuse:\n  <<: *b\n  k: 2\nlist: [*b, *b]\n",
        "text: |\n  two\n  lines\nfolded: >\n  one\n  line\nempty:\nseq:\n  - - nested\n    - again\n  - {}\n",
        "- !custom 1\n- !!int 2\n- [a, {b: c}]\n",
    ]

    @Test(arguments: documents)
    func aDetachedNodeIsTheSameValueAsItsOriginal(_ text: String) throws {
        let root = try #require(try load(text).0)
        let nodes = walk(root)
        #expect(nodes.count > 5)
        for node in nodes {
            let copy = node.detached()
            #expect(copy.document !== node.document)
            #expect(copy == node)
            #expect(copy.hashValue == node.hashValue)
            #expect(shape(copy) == shape(node))
        }
    }

    @Test func nodesOfTwoDocumentsCompareByWhatTheyHold() throws {
        let text = Self.documents[1]
        let first = try #require(try load(text).0)
        let second = try #require(try load(text).0)
        #expect(first.document !== second.document)
        #expect(first == second)
        #expect(first.hashValue == second.hashValue)
        let changed = try #require(try load(text.replacingOccurrences(of: "k: 2", with: "k: 3")).0)
        #expect(changed != first)
        // The same text at another place is another node: ranges are part of a node.
        let moved = try #require(try load("\n" + text).0)
        #expect(moved != first)
    }

    /// Duplicate keys against a model (each key's first place; every later one reported there),
    /// in mappings of 1 to 40 keys: small ones are scanned, larger ones switch to a table part
    /// way through, and both must agree with the model. Merge keys are never duplicates.
    @Test func duplicateKeysMatchAModelInSmallAndLargeMappings() throws {
        var random = SeededGenerator(seed: 22)
        for _ in 0..<300 {
            let count = Int.random(in: 1...40, using: &random)
            let alphabet = Int.random(in: 1...30, using: &random)
            var text = "m: &m { z: 0 }\nt:\n"
            var firstLine: [String: Int] = [:]
            var expected: [(line: Int, first: Int)] = []
            for index in 0..<count {
                let line = index + 3
                if Int.random(in: 0..<10, using: &random) == 0 {
                    text += "  <<: *m\n"
                    continue
                }
                let key = "k\(Int.random(in: 0..<alphabet, using: &random))"
                text += "  \(key): \(index)\n"
                if let first = firstLine[key] {
                    expected.append((line, first))
                } else {
                    firstLine[key] = line
                }
            }
            let (root, diagnostics) = try load(text)
            let duplicates = diagnostics.filter { $0.rule == "duplicate-key" }
            #expect(duplicates.count == expected.count, "\(text)")
            for (found, want) in zip(duplicates, expected) {
                #expect(found.range.start.line == want.line)
                #expect(found.notes.first?.range.start.line == want.first)
            }
            // What is kept: each key once, in the order first written, merged keys after.
            let kept = try #require(root?.pairs?.first { $0.key.scalar == "t" }?.value.pairs)
            let keys = kept.compactMap(\.key.scalar)
            #expect(Set(keys).count == keys.count)
            #expect(Array(keys.prefix(firstLine.count)) == firstLine.sorted { $0.value < $1.value }.map(\.key))
        }
    }

    /// A node limit above what a document can number is held at the document's own bound, and
    /// the finding names the bound that held.
    @Test func aNodeLimitAboveTheDocumentsBoundStopsAtTheBound() throws {
        let text = YAMLLoaderTests.billionLaughs
        var diagnostics: [Diagnostic] = []
        do {
            _ = try YAMLLoader(limits: YAMLLimits(maxNodes: 1_000_000_000)).load(
                Array(text.utf8), diagnostics: &diagnostics)
            Issue.record("a document of over 10^9 nodes loaded")
        } catch {
            guard case .syntax(let diagnostic) = error else { return }
            #expect(diagnostic.rule == "too-many-nodes")
            #expect(diagnostic.message.contains("more than 4194304 nodes"), "\(diagnostic.message)")
        }
    }

    @Test func aDecodedPolicyDoesNotKeepItsFileAlive() throws {
        let text = """
            policy: 1
            name: keep
            classify: { code: body.status }
            rules:
              - name: slow
                when: { code: [1] }
                then: { do: retry, max-retries: 2 }
            """
        weak var document: YAMLDocument?
        var parts: PolicyParts?
        do {
            let root = try #require(try load(text).0)
            document = root.document
            var decoder = PolicyDecoder(catalog: PluginCatalog())
            parts = decoder.policy(root)
            #expect(decoder.diagnostics.isEmpty)
        }
        let overrides = try #require(parts?.rules.first?.overrides)
        #expect(overrides.pairs?.first?.key.scalar == "do")
        #expect(overrides.range.start == SourcePosition(line: 7, column: 11))
        #expect(document == nil)
    }
}
