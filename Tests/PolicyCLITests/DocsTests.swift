import Foundation
import ResponsePolicy
import TestSupport
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

    /// The README's policy is what a new user copies and checks with `lint --strict`: at the
    /// shipped defaults (deadline, attempt timeout, retries) its worst case fits the deadline and
    /// nothing else warns.
    @Test func theReadmePolicyPassesStrictLint() throws {
        let block = try #require(Self.blocks.first { $0.file == "README.md" && $0.text.hasPrefix("policy: 1") })
        let policy = try Policy.load(yaml: block.text, file: block.description)
        #expect(policy.warnings.map(\.description) == [])
        // The defaults are what makes it fit: the worst case is stated and below the deadline.
        let scope = try #require(policy.graph.scopes.last)
        let total = try #require(scope.worstCase.total)
        let deadline = try #require(scope.retry.deadline)
        #expect(total <= deadline)
    }

    /// A block as the policy a reader would save: itself when it has `policy:`, a fragment of
    /// policy sections given `policy: 1` and a name; `nil` for anything else.
    static func policyText(_ block: Block) -> String? {
        let parsed = Policy.parse(bytes: Array(block.text.utf8), limits: .default)
        guard case .mapping(let pairs) = parsed.root?.value else { return nil }
        let keys = pairs.compactMap(\.key.scalar)
        if keys.contains("requests") || keys.contains("processes") { return nil }
        if keys.contains("policy") { return block.text }
        if !keys.isEmpty, keys.allSatisfy({ PolicyDecoder.topLevelKeys.contains($0) }) {
            return "policy: 1\nname: docs-fragment\n" + block.text
        }
        return nil
    }

    /// What a reader does with an example: save it and run `policy lint --strict` on it. Every
    /// policy example passes as written (warnings it accepts on purpose suppressed with their
    /// reason); the suppression example of docs/commands.md once failed, with a second warning its
    /// comment did not name and a section no rule used. Through the binary, as a reader runs it.
    @Test(arguments: blocks.filter { policyText($0) != nil })
    func everyPolicyExamplePassesStrictLintAsWritten(_ block: Block) async throws {
        let directory = try TemporaryDirectory()
        try directory.write("example.yaml", try #require(Self.policyText(block)))
        // The host plugins the service guide's examples register in Swift.
        let result = try await runPolicy(
            ["lint", "--strict", "--plugin", "refresh:my-sso", "--plugin", "logout:host-signout", "example.yaml"],
            in: directory.url)
        #expect(result.status == 0, "\(block): \(result.stdout)\(result.stderr)")
        #expect(result.stdoutLines.last?.hasPrefix("1 file checked: 0 errors, 0 warnings") == true, "\(block)")
    }

    /// README's `lint policy.yaml` named a file a reader had not saved: every file a command in
    /// the README names exists in the repository, is made by an earlier command (`cp … FILE`,
    /// `> FILE`), or is one the text says to save.
    @Test(arguments: ["README.md"])
    func everyFileACommandNamesExistsOrIsSavedFirst(_ file: String) throws {
        let text = try String(contentsOf: repositoryRoot.appendingPathComponent(file), encoding: .utf8)
        let lines = text.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        var inShell = false
        var made: Set<String> = []
        var checked = 0
        for line in lines {
            if line == "```sh" {
                inShell = true
                continue
            }
            if line.hasPrefix("```") {
                inShell = false
                continue
            }
            guard inShell else { continue }
            let command = line.split(separator: "#", maxSplits: 1).first.map(String.init) ?? ""
            let words = command.split(separator: " ").map(String.init)
            if let index = words.firstIndex(where: { $0 == ">" || $0 == "cp" }), let target = words.last,
                index < words.count - 1
            {
                made.insert(target)
            }
            guard words.contains("policy") else { continue }
            for word in words where word.hasSuffix(".yaml") && !word.contains("://") && !made.contains(word) {
                let exists = FileManager.default.fileExists(atPath: repositoryRoot.appendingPathComponent(word).path)
                let saved = text.contains("Save it as `\(word)`")
                #expect(exists || saved, "\(file): '\(line)' names \(word), which a reader does not have")
                checked += 1
            }
        }
        #expect(checked > 0)
    }

    @Test(arguments: blocks) func everyYAMLBlockIsValid(_ block: Block) throws {
        let parsed = Policy.parse(bytes: Array(block.text.utf8), limits: .default)
        let syntax = parsed.diagnostics.filter { $0.severity == .error }
        #expect(syntax.isEmpty, "\(block): \(syntax.map(\.description))")
        guard syntax.isEmpty, case .mapping(let pairs) = parsed.root?.value else { return }
        let keys = pairs.compactMap(\.key.scalar)
        if keys.contains("requests") || keys.contains("processes") {
            let (script, diagnostics) = SimulationScript.parse(parsed, file: block.description)
            let (_, expectDiagnostics) = SimulationExpectations.parse(parsed, file: block.description)
            let errors = (diagnostics + expectDiagnostics).filter { $0.severity == .error }
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

    /// Every key the decoder accepts is in docs/policy.md (written as a YAML key or in code
    /// quotes), so a key added to the policy file cannot be left out of its reference.
    @Test func thePolicyReferenceNamesEveryKeyTheDecoderAccepts() throws {
        let reference = try String(
            contentsOf: repositoryRoot.appendingPathComponent("docs/policy.md"), encoding: .utf8)
        let lists: [(String, [String])] = [
            ("top level", PolicyDecoder.topLevelKeys), ("retry", PolicyDecoder.retryKeys),
            ("refresh", PolicyDecoder.refreshTuningKeys), ("logout", PolicyDecoder.logoutTuningKeys),
            ("dispatch", PolicyDecoder.dispatchKeys), ("when", PolicyDecoder.whenKeys),
            ("classify", PolicyDecoder.classifyKeys), ("route", PolicyDecoder.routeKeys),
            ("match", PolicyDecoder.matchKeys), ("budget", PolicyDecoder.budgetKeys),
            ("limit", PolicyDecoder.limitKeys), ("rule", PolicyDecoder.ruleKeys),
        ]
        for (section, keys) in lists {
            for key in keys {
                #expect(
                    reference.contains("\(key):") || reference.contains("`\(key)`"),
                    "docs/policy.md does not mention the \(section) key '\(key)'")
            }
        }
    }

    // MARK: - Swift

    /// A ```` ```swift ```` block and the marker on the line before it.
    struct SwiftBlock: CustomStringConvertible, Sendable {
        var file: String
        var line: Int
        var text: String
        /// `<!-- snippet: PATH#NAME -->` or `<!-- not compiled: WHY -->`, as written.
        var marker: String
        var description: String { "\(file):\(line)" }
    }

    static let swiftBlocks: [SwiftBlock] = {
        var files = ["README.md"]
        let names =
            (try? FileManager.default.contentsOfDirectory(atPath: repositoryRoot.appendingPathComponent("docs").path))
            ?? []
        files += names.filter { $0.hasSuffix(".md") }.sorted().map { "docs/" + $0 }
        var blocks: [SwiftBlock] = []
        for file in files {
            guard let text = try? String(contentsOf: repositoryRoot.appendingPathComponent(file), encoding: .utf8)
            else { continue }
            let lines = text.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
            var index = 0
            while index < lines.count {
                guard lines[index] == "```swift" else {
                    index += 1
                    continue
                }
                let start = index
                var body: [String] = []
                index += 1
                while index < lines.count, lines[index] != "```" {
                    body.append(lines[index])
                    index += 1
                }
                blocks.append(
                    SwiftBlock(
                        file: file, line: start + 1, text: body.joined(separator: "\n"),
                        marker: start > 0 ? lines[start - 1] : ""))
                index += 1
            }
        }
        return blocks
    }()

    /// The regions of a Swift file between `// snippet: NAME` and `// snippet end`, each dedented;
    /// the pieces of one name joined by a blank line (imports at the top, code in a function).
    static func regions(in path: String) throws -> [String: String] {
        let text = try String(contentsOf: repositoryRoot.appendingPathComponent(path), encoding: .utf8)
        var pieces: [String: [String]] = [:]
        var current: (name: String, lines: [String])?
        for line in text.split(separator: "\n", omittingEmptySubsequences: false).map(String.init) {
            let trimmed = line.trimmingCharacters(in: .whitespaces)
            if trimmed.hasPrefix("// snippet: ") {
                current = (String(trimmed.dropFirst("// snippet: ".count)), [])
            } else if trimmed == "// snippet end", let region = current {
                let indent =
                    region.lines.filter { !$0.trimmingCharacters(in: .whitespaces).isEmpty }
                    .map { $0.prefix { $0 == " " }.count }.min() ?? 0
                let piece = region.lines.map { String($0.dropFirst(min(indent, $0.count))) }
                    .joined(separator: "\n").trimmingCharacters(in: .newlines)
                pieces[region.name, default: []].append(piece)
                current = nil
            } else {
                current?.lines.append(line)
            }
        }
        return pieces.mapValues { $0.joined(separator: "\n\n") }
    }

    @Test func theDocumentationHasSwiftBlocksToCheck() {
        #expect(Self.swiftBlocks.count >= 10)
        #expect(Self.swiftBlocks.contains { $0.file == "README.md" })
    }

    /// Every Swift block is a region of a file the build compiles (docs/snippets is a target of
    /// the package; examples/service is built by .ci/run), word for word; a block that cannot be
    /// compiled says why.
    @Test(arguments: swiftBlocks) func everySwiftBlockIsCompiledCode(_ block: SwiftBlock) throws {
        if block.marker.hasPrefix("<!-- not compiled: ") { return }
        let marker = try #require(
            block.marker.firstMatch(of: /^<!-- snippet: ([^#]+)#(\S+) -->$/),
            "\(block): a Swift block needs <!-- snippet: PATH#NAME --> (or <!-- not compiled: WHY -->) above it")
        let path = String(marker.1)
        #expect(
            path.hasPrefix("docs/snippets/") || path.hasPrefix("examples/service/"),
            "\(block): \(path) is not compiled by the build or CI")
        let regions = try Self.regions(in: path)
        let region = try #require(regions[String(marker.2)], "\(block): no region '\(marker.2)' in \(path)")
        #expect(block.text == region, "\(block) differs from \(path)#\(marker.2)")
    }
}
