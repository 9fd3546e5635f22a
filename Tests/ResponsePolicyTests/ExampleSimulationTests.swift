import Foundation
import Testing

@testable import ResponsePolicy

/// Replays every script in examples/simulations/. Each names its policy (`# policy: PATH`,
/// relative to the script) and the summary it must end with (`# expect: {...}`), worked out by
/// hand in the script's comment; the engine must agree.
struct ExampleSimulationTests {
    struct Example: CustomTestStringConvertible, Sendable {
        let script: URL
        var testDescription: String { script.lastPathComponent }
    }

    static let examples: [Example] = {
        let folder = repositoryRoot.appendingPathComponent("examples/simulations")
        let names = (try? FileManager.default.contentsOfDirectory(atPath: folder.path)) ?? []
        return names.filter { $0.hasSuffix(".yaml") }.sorted().map {
            Example(script: folder.appendingPathComponent($0))
        }
    }()

    @Test func thereIsAnExampleForEveryEngineBehaviour() {
        #expect(Self.examples.count >= 16)
    }

    @Test(arguments: examples)
    func exampleEndsWithItsExpectedSummary(_ example: Example) async throws {
        let text = try String(contentsOf: example.script, encoding: .utf8)
        func header(_ name: String) -> String? {
            text.split(separator: "\n").first { $0.hasPrefix("# \(name): ") }.map {
                String($0.dropFirst(name.count + 4))
            }
        }
        let policyPath = try #require(header("policy"), "the script names no '# policy:'")
        let expected = try #require(header("expect"), "the script states no '# expect:'")
        let folder = example.script.deletingLastPathComponent().path
        let policy = try Policy.load(path: folder + "/" + policyPath)
        let (script, diagnostics) = SimulationScript.parse(Array(text.utf8), file: example.script.path)
        #expect(diagnostics.isEmpty)
        let parsed = try #require(script)
        let result = try await Simulator.run(policy: policy, script: parsed) { path throws(PolicyError) -> Policy in
            try Policy.load(path: folder + "/" + path)
        }
        #expect(result.summary.jsonLine == expected)
        #expect(result.leftovers == 0)
    }
}
