import Foundation
import Testing

@testable import ResponsePolicy

/// `simulate` keeps memory bounded: events stream out instead of piling up, and a run is capped
/// in attempts.
struct SimulationMemoryTests {
    static let retrying = """
        policy: 1
        name: retrying
        rules:
          - { name: busy, when: { status: [503] }, then: retry }
        retry: { max-retries: 3, backoff: constant, initial: 10ms, deadline: 60s, budget: { ratio: 1, min: 1000000 } }
        """
    static let script = """
        requests:
          - { id: r, at: 0s, repeat: 50, responses: [{ status: 503 }] }
        """

    private func parsed(_ text: String) throws -> (Policy, SimulationScript) {
        let policy = try Policy.load(yaml: Self.retrying, file: "policy.yaml")
        let script = try #require(SimulationScript.parse(Array(text.utf8), file: "script.yaml").0)
        return (policy, script)
    }

    @Test func streamedEventsAreTheCollectedOnesAndNoneIsKept() async throws {
        let (policy, script) = try parsed(Self.script)
        let collected = try await Simulator.run(policy: policy, script: script)
        let streamed = Locked<[String]>([])
        let result = try await Simulator.run(
            policy: policy, script: script, onEvent: { event in streamed.withLock { $0.append(event.jsonLine) } })
        #expect(result.events.isEmpty)
        #expect(streamed.withLock { $0 } == collected.events.map(\.jsonLine))
        #expect(result.summary == collected.summary)
        #expect(result.summary.attempts == 200)
        #expect(result.leftovers == 0)
    }

    @Test func aRunPastTheAttemptLimitStopsWithAClearError() async throws {
        let (policy, script) = try parsed(Self.script)
        let sends = Locked(0)
        await #expect(throws: Simulator.Failure.tooManyAttempts(limit: 120, at: .milliseconds(120))) {
            try await Simulator.run(
                policy: policy, script: script, maxAttempts: 120,
                onEvent: { event in if event.kind == .send { sends.withLock { $0 += 1 } } })
        }
        #expect(sends.withLock { $0 } == 120)
        let message = Simulator.Failure.tooManyAttempts(limit: 1_000_000, at: .seconds(2)).description
        #expect(
            message
                == "the simulation stopped at t=2s: it would put more than 1000000 attempts on the wire; send fewer requests or retries"
        )
    }
}
