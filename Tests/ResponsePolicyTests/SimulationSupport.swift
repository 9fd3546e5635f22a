import Foundation
import Testing

@testable import ResponsePolicy

/// Runs a script against a policy on the virtual clock and checks nothing leaked.
func simulate(
    _ policyText: String, _ scriptText: String, sourceLocation: SourceLocation = #_sourceLocation
) async throws -> Simulator.Result {
    let policy = try Policy.load(yaml: policyText, file: "policy.yaml")
    let (script, diagnostics) = SimulationScript.parse(Array(scriptText.utf8), file: "script.yaml")
    guard let script else {
        Issue.record("script did not parse: \(diagnostics.map(\.description))", sourceLocation: sourceLocation)
        throw SimulationScriptError()
    }
    let result = try await Simulator.run(policy: policy, script: script)
    #expect(result.leftovers == 0, "the engine leaked requests or waiters", sourceLocation: sourceLocation)
    return result
}

struct SimulationScriptError: Error {}

extension Simulator.Result {
    func events(_ request: String) -> [PolicyEvent] { events.filter { $0.request == request } }

    func outcome(_ request: String) -> PolicyEvent? { events(request).last { $0.kind == .outcome } }

    /// `kind@t` for one request, like `send@0 response@0.05 refresh-start@0.05`.
    func timeline(_ request: String) -> String {
        events(request).map { "\($0.kind.rawValue)@\(PolicyEvent.seconds($0.time))" }.joined(separator: " ")
    }

    /// Every wait's delay in seconds, for one request.
    func waits(_ request: String) -> [Double] {
        events(request).filter { $0.kind == .wait }.compactMap { $0.delay.map { ($0.seconds * 1000).rounded() / 1000 } }
    }
}
