import Foundation
import TestSupport
import Testing

@testable import ResponsePolicy

struct YAMLLoaderTests {
    func load(_ text: String, limits: YAMLLimits = .default) throws -> (YAMLNode?, [Diagnostic]) {
        var diagnostics: [Diagnostic] = []
        let node = try YAMLLoader(limits: limits).load(Array(text.utf8), diagnostics: &diagnostics)
        return (node, diagnostics)
    }

    func syntaxError(_ text: String, limits: YAMLLimits = .default) -> Diagnostic? {
        var diagnostics: [Diagnostic] = []
        do {
            _ = try YAMLLoader(limits: limits).load(Array(text.utf8), diagnostics: &diagnostics)
            return nil
        } catch {
            guard case .syntax(let diagnostic) = error else { return nil }
            return diagnostic
        }
    }

    @Test func keysAndValuesKeepOneBasedPositions() throws {
        let (root, _) = try load("policy: 1\nretry:\n  max-retries: 3\n  \"quoted key\": 'x'\n")
        let pairs = try #require(root?.pairs)
        #expect(pairs[0].key.range.start == SourcePosition(line: 1, column: 1))
        #expect(pairs[0].value.range.start == SourcePosition(line: 1, column: 9))
        let retry = try #require(pairs[1].value.pairs)
        #expect(retry[0].key.scalar == "max-retries")
        #expect(retry[0].key.range.start == SourcePosition(line: 3, column: 3))
        #expect(retry[0].value.range.start == SourcePosition(line: 3, column: 16))
        #expect(retry[1].key.scalar == "quoted key")
        #expect(retry[1].key.range.start == SourcePosition(line: 4, column: 3))
        #expect(retry[1].value.value == .scalar("x", .singleQuoted))
    }

    @Test func columnsCountUnicodeScalarsNotBytes() throws {
        let (root, _) = try load("é: ünïcode\nname: x\n")
        let pairs = try #require(root?.pairs)
        #expect(pairs[0].value.range.start == SourcePosition(line: 1, column: 4))
    }

    @Test func flowAndBlockStylesGiveTheSameTree() throws {
        let (block, _) = try load("a:\n  - 1\n  - two\nb:\n  c: true\n")
        let (flow, _) = try load("{a: [1, two], b: {c: true}}")
        func strip(_ node: YAMLNode?) -> String {
            guard let node else { return "nil" }
            switch node.value {
            case .scalar(let text, _): return text
            case .sequence(let items): return "[" + items.map(strip).joined(separator: ",") + "]"
            case .mapping(let pairs):
                return "{" + pairs.map { strip($0.key) + ":" + strip($0.value) }.joined(separator: ",") + "}"
            }
        }
        #expect(strip(block) == "{a:[1,two],b:{c:true}}")
        #expect(strip(flow) == strip(block))
    }

    @Test func anchorsAliasesAndMergeKeys() throws {
        let text = """
            x-base: &base { max-retries: 2, backoff: constant }
            x-more: &more { initial: 2s, backoff: linear }
            retry:
              <<: [*base, *more]
              backoff: exponential
            copy: *base
            """
        let (root, diagnostics) = try load(text)
        #expect(diagnostics.isEmpty)
        let pairs = try #require(root?.pairs)
        let retry = try #require(pairs.first { $0.key.scalar == "retry" }?.value.pairs)
        let values = Dictionary(uniqueKeysWithValues: retry.map { ($0.key.scalar ?? "", $0.value.scalar ?? "") })
        // Explicit keys win over merged ones; earlier merged mappings win over later ones.
        #expect(values == ["backoff": "exponential", "max-retries": "2", "initial": "2s"])
        let copy = try #require(pairs.first { $0.key.scalar == "copy" }?.value)
        // An alias takes the position of the alias, so findings point where it is used.
        #expect(copy.range.start == SourcePosition(line: 6, column: 7))
        #expect(copy.pairs?.count == 2)
    }

    @Test func commentsAndExplicitDocumentMarkers() throws {
        let (root, diagnostics) = try load("# top\n---\npolicy: 1 # trailing\n...\n")
        #expect(diagnostics.isEmpty)
        #expect(root?.pairs?.first?.value.scalar == "1")
    }

    @Test func secondDocumentIsAnError() {
        let diagnostic = syntaxError("policy: 1\n---\npolicy: 2\n")
        #expect(diagnostic?.rule == "multiple-documents")
        #expect(diagnostic?.range.start == SourcePosition(line: 2, column: 1))
    }

    @Test func duplicateKeysAreReportedWithTheFirstPlace() throws {
        let (_, diagnostics) = try load("a: 1\nb: 2\na: 3\n")
        #expect(diagnostics.count == 1)
        #expect(diagnostics.first?.rule == "duplicate-key")
        #expect(diagnostics.first?.range.start == SourcePosition(line: 3, column: 1))
        #expect(diagnostics.first?.notes.first?.range.start == SourcePosition(line: 1, column: 1))
    }

    /// YAML 1.2 core tags are honoured as the types they name: the same value as written
    /// without them (or quoted, for `!!str`).
    @Test func coreTagsAreReadAsTheTypesTheyName() throws {
        let (tagged, _) = try load(
            "a: !!int 3\nb: !!float 1.5\nc: !!bool True\nd: !!null ~\ne: !!str 503\nf: !!map { x: 1 }\ng: !!seq [1]\n")
        let (plain, _) = try load("a: 3\nb: 1.5\nc: true\nd: null\ne: \"503\"\nf: { x: 1 }\ng: [1]\n")
        // The trees without positions (the tags shift the columns).
        func shape(_ node: YAMLNode) -> String {
            let tag = node.tag.map { "<\($0)>" } ?? ""
            switch node.value {
            case .scalar(let text, let style): return "\(tag)\(text)/\(style)"
            case .sequence(let items): return tag + "[" + items.map(shape).joined(separator: ",") + "]"
            case .mapping(let pairs):
                return tag + "{" + pairs.map { shape($0.key) + ":" + shape($0.value) }.joined(separator: ",") + "}"
            }
        }
        #expect(try shape(#require(tagged)) == shape(#require(plain)))
    }

    @Test(arguments: [
        ("a: !!int three\n", "'!!int' is given 'three', which is not a whole number written in decimal"),
        ("a: !!int 0x1F\n", "'!!int' is given '0x1F', which is not a whole number written in decimal"),
        ("a: !!bool yes\n", "'!!bool' is given 'yes', which is not true or false"),
        ("a: !!float abc\n", "'!!float' is given 'abc', which is not a number"),
        ("a: !!binary aGk=\n", "'!!binary' is not a tag a policy can use; write the value without it"),
    ])
    func aCoreTagThatDoesNotFitItsValueIsAPositionedError(text: String, message: String) {
        let diagnostic = syntaxError(text)
        #expect(diagnostic?.rule == "invalid-tag")
        #expect(diagnostic?.message == message)
        #expect(diagnostic?.range.start == SourcePosition(line: 1, column: 4))
    }

    @Test func undefinedAliasIsAnError() {
        let diagnostic = syntaxError("a: *nothing\n")
        #expect(diagnostic?.rule == "undefined-alias")
        #expect(diagnostic?.message == "alias '*nothing' refers to no anchor defined before it")
        #expect(diagnostic?.range.start == SourcePosition(line: 1, column: 4))
    }

    /// Ten lists of ten aliases of the list before: 10^10 nodes once expanded.
    static var billionLaughs: String {
        var text = "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
        var previous = "a"
        for level in 0..<9 {
            text +=
                "l\(level): &l\(level) [" + Array(repeating: "*\(previous)", count: 10).joined(separator: ", ") + "]\n"
            previous = "l\(level)"
        }
        return text
    }

    @Test func billionLaughsStopsAtTheNodeLimit() {
        let text = Self.billionLaughs
        let started = ContinuousClock.now
        let diagnostic = syntaxError(text)
        #expect(diagnostic?.rule == "too-many-nodes")
        #expect(diagnostic?.range.start.line == 7)
        // Not a timing assertion of the product: a guard that expansion is not exponential.
        #expect(ContinuousClock.now - started < .seconds(20))
    }

    @Test func deepNestingStopsAtTheDepthLimit() {
        let text = "a: " + String(repeating: "[", count: 100_000) + String(repeating: "]", count: 100_000)
        let diagnostic = syntaxError(text)
        #expect(diagnostic?.rule == "nesting-too-deep")
        // The root mapping is the first of the 64 levels.
        #expect(diagnostic?.range.start == SourcePosition(line: 1, column: 4 + 63))
    }

    @Test func fileSizeLimit() {
        let diagnostic = syntaxError(
            String(repeating: "# filler\n", count: 200), limits: YAMLLimits(maxFileBytes: 1000))
        #expect(diagnostic?.rule == "file-too-large")
    }

    @Test(arguments: [
        (
            "nul", "policy: 1\nname: a\u{0}b\n", "yaml-syntax", 2, 8,
            "the file contains a NUL byte; policy files are text"
        ),
        (
            "tab", "policy: 1\nretry:\n\tmax-retries: 3\n", "yaml-syntax", 3, 1,
            "a tab indents this line; YAML indents with spaces only: replace the tab with spaces"
        ),
        ("unclosed", "rules: [\n", "yaml-syntax", 2, 1, "a value is missing here, or a '[' or '{' is not closed"),
        (
            "bad indent", "a:\n  b: 1\n c: 2\n", "yaml-syntax", 3, 2,
            "this line does not line up with the keys of the mapping that starts on line 1: indent it like them"
        ),
    ])
    func syntaxErrorsArePositioned(
        _ name: String, _ text: String, _ rule: String, _ line: Int, _ column: Int, _ message: String
    ) {
        let diagnostic = syntaxError(text)
        #expect(diagnostic?.rule == rule, "\(name)")
        #expect(diagnostic?.range.start == SourcePosition(line: line, column: column), "\(name)")
        #expect(diagnostic?.message == message, "\(name)")
    }

    @Test func invalidUTF8IsPositioned() {
        var bytes = Array("policy: 1\nname: ".utf8)
        bytes += [0xFF, 0xFE, 0x0A]
        var diagnostics: [Diagnostic] = []
        do {
            _ = try YAMLLoader().load(bytes, diagnostics: &diagnostics)
            Issue.record("invalid UTF-8 was accepted")
        } catch {
            guard case .syntax(let diagnostic) = error else { return }
            #expect(diagnostic.message == "the file is not valid UTF-8 (invalid leading UTF-8 octet)")
            #expect(diagnostic.range.start == SourcePosition(line: 2, column: 7))
        }
    }

    @Test func binaryGarbageNeverCrashes() {
        var generator = SeededGenerator(seed: 42)
        for _ in 0..<300 {
            let count = Int(generator.next() % 400)
            let bytes = (0..<count).map { _ in UInt8(truncatingIfNeeded: generator.next()) }
            var diagnostics: [Diagnostic] = []
            _ = try? YAMLLoader().load(bytes, diagnostics: &diagnostics)
            let analysis = Policy.analyze(bytes: bytes, file: "garbage", catalog: PluginCatalog(), limits: .default)
            #expect(analysis.policy == nil || !analysis.diagnostics.hasErrors)
        }
    }

    @Test func renderedDiagnosticShowsTheLineAndACaret() {
        let text = "policy: 1\nname: demo\nretry: { max-retries: 3, backof: constant }\n"
        let diagnostic = findings(text).first { $0.rule == "unknown-key" }
        let out = diagnostic.map { DiagnosticRenderer().render($0, source: text) }
        #expect(
            out == """
                test.yaml:3:26: error: unknown key 'backof'; did you mean 'backoff'? [unknown-key]
                  retry: { max-retries: 3, backof: constant }
                                           ^
                """)
    }
}
