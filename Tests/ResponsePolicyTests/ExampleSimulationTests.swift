import Foundation
import TestSupport
import Testing

@testable import ResponsePolicy

/// Replays every script in examples/simulations/. Each names its policy (`policy: PATH`,
/// relative to the script) and states what must happen (`expect:`), worked out by hand in the
/// script's comment; the engine must agree. `policy test examples/` runs the same in CI.
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
    func exampleMeetsItsExpectations(_ example: Example) async throws {
        let bytes = Array(try Data(contentsOf: example.script))
        let parsed = Policy.parse(bytes: bytes, limits: .default)
        let (expectations, expectDiagnostics) = SimulationExpectations.parse(parsed, file: example.script.path)
        #expect(expectDiagnostics.isEmpty)
        let policyPath = try #require(expectations.policy, "the script names no 'policy:'")
        #expect(!expectations.summary.isEmpty, "the script states no expected summary")
        #expect(!expectations.requests.isEmpty, "the script states no request's outcome")
        let folder = example.script.deletingLastPathComponent().path
        let policy = try Policy.load(path: folder + "/" + policyPath)
        let (script, diagnostics) = SimulationScript.parse(parsed, file: example.script.path)
        #expect(diagnostics.isEmpty)
        let parsedScript = try #require(script)
        let result = try await Simulator.run(policy: policy, script: parsedScript) {
            path throws(PolicyError) -> Policy in
            try Policy.load(path: folder + "/" + path)
        }
        var checker = ExpectationChecker(expectations)
        for event in result.events { checker.observe(event) }
        #expect(checker.failures(summary: result.summary) == [])
        #expect(result.leftovers == 0)
    }
}
