import Foundation
import ResponsePolicy
import Testing

/// Every YAML block in README.md and docs/ is checked, so a copied example works:
/// a whole policy (top-level `policy:`) loads without errors; a fragment made only of policy
/// sections (`refresh:`, `rules:`…) loads without errors once given `policy: 1` and a name; a
/// simulation script parses as one; anything else is at least valid YAML with one document.
/// A block that shows a mistake on purpose is written as ```` ```text ````, never ```` ```yaml ````
/// (docs/lint-rules.md, whose examples are checked against their rules, is left out).
struct DocsTests {
    struct Block: CustomStringConvertible, Sendable {
        var file: String
        var line: Int
        var text: String
        var description: String { "\(file):\(line)" }
    }

    static let blocks: [Block] = {
        var files = ["README.md"]
        let docs = repositoryRoot.appendingPathComponent("docs")
        let names = (try? FileManager.default.contentsOfDirectory(atPath: docs.path)) ?? []
        // lint-rules.md is excluded: its triggering examples are wrong on purpose, and
        // LintRuleExampleTests checks every one of them against its rule.
        files += names.filter { $0.hasSuffix(".md") && $0 != "lint-rules.md" }.sorted().map { "docs/" + $0 }
        var blocks: [Block] = []
        for file in files {
            guard let text = try? String(contentsOf: repositoryRoot.appendingPathComponent(file), encoding: .utf8)
            else { continue }
            var current: (line: Int, lines: [String])?
            for (index, line) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
                if current == nil, line == "```yaml" {
                    current = (index + 2, [])
                } else if let open = current, line == "```" {
                    blocks.append(Block(file: file, line: open.line, text: open.lines.joined(separator: "\n") + "\n"))
                    current = nil
                } else if current != nil {
                    current?.lines.append(String(line))
                }
            }
        }
        return blocks
    }()

    /// Plugins the documentation's examples register in Swift (the service guide's `my-sso` and
    /// `host-signout`).
    static let hostPlugins: PluginCatalog = {
        var catalog = PluginCatalog()
        catalog.declare(.refresh, "my-sso")
        catalog.declare(.logout, "host-signout")
        return catalog
    }()

    @Test func theDocumentationHasYAMLBlocksToCheck() {
        #expect(Self.blocks.count >= 12)
        #expect(Self.blocks.contains { $0.file == "README.md" })
        #expect(Self.blocks.contains { $0.file == "docs/policy.md" })
    }

    @Test(arguments: blocks) func everyYAMLBlockIsValid(_ block: Block) throws {
        let parsed = Policy.parse(bytes: Array(block.text.utf8), limits: .default)
        let syntax = parsed.diagnostics.filter { $0.severity == .error }
        #expect(syntax.isEmpty, "\(block): \(syntax.map(\.description))")
        guard syntax.isEmpty, case .mapping(let pairs) = parsed.root?.value else { return }
        let keys = pairs.compactMap(\.key.scalar)
        if keys.contains("requests") {
            let (script, diagnostics) = SimulationScript.parse(parsed, file: block.description)
            let errors = diagnostics.filter { $0.severity == .error }
            #expect(script != nil && errors.isEmpty, "\(block) is not a valid simulation script: \(errors)")
            return
        }
        let yaml: String
        if keys.contains("policy") {
            yaml = block.text
        } else if !keys.isEmpty, keys.allSatisfy({ PolicyDecoder.topLevelKeys.contains($0) }) {
            yaml = "policy: 1\nname: docs-fragment\n" + block.text
        } else {
            return
        }
        do {
            _ = try Policy.load(yaml: yaml, file: block.description, plugins: Self.hostPlugins)
        } catch {
            guard case .invalid(_, let diagnostics) = error else {
                Issue.record("\(block): \(error)")
                return
            }
            Issue.record("\(block) does not load as a policy: \(diagnostics.filter { $0.severity == .error })")
        }
    }
}
