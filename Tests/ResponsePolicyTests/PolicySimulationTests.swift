import Foundation
import ResponsePolicy
import ResponsePolicyTesting
import Testing

/// The testing product's simulator, used as a service's own tests would: public API only.
struct PolicySimulationTests {
    static let policy = """
        policy: 1
        name: app
        classify: { code: body.status }
        rules:
          - { name: expired, when: { code: [1401] }, then: refresh }
          - { name: revoked, when: { code: [202] }, then: logout }
        refresh: { use: http, with: { url: "https://auth.example.com/refresh", token: body.token } }

        """

    @Test func aStormMakesOneRefreshAndEveryExpectationHolds() async throws {
        let policy = try Policy.load(yaml: Self.policy)
        let result = try await PolicySimulation.run(
            policy: policy,
            script: """
                requests:
                  - { id: a, repeat: 20, responses: [{ body: '{"status":1401}' }, { body: '{"status":0}' }], expect: delivered }
                refresh: [{ after: 100ms, result: ok }]
                expect:
                  summary: { refreshes: 1, delivered: 20 }

                """)
        #expect(result.unmet == [])
        #expect(result.summary.refreshes == 1)
        #expect(result.summary.delivered == 20)
        #expect(result.summary.attempts == 40)
        #expect(result.events.filter { $0.kind == .refreshStart }.count == 1)
    }

    @Test func anUnmetExpectationIsReportedWithItsPosition() async throws {
        let policy = try Policy.load(yaml: Self.policy)
        let result = try await PolicySimulation.run(
            policy: policy,
            script: "requests:\n  - { id: a, responses: [{ body: '{\"status\":202}' }], expect: delivered }\n",
            file: "revoked.yaml")
        #expect(result.unmet == ["revoked.yaml:2:63: request 'a': expected outcome 'delivered', got 'logged-out'"])
        #expect(result.summary.loggedOut == 1)
    }

    @Test func anInvalidScriptThrowsItsDiagnostics() async throws {
        let policy = try Policy.load(yaml: Self.policy)
        await #expect(throws: PolicySimulation.Failure.self) {
            try await PolicySimulation.run(policy: policy, script: "requests: 3\n")
        }
    }

    /// The seeded random source gives the same draws for the same seed; the virtual clock moves
    /// only when it is advanced.
    @Test func seededRandomnessAndTheVirtualClockAreDeterministic() async throws {
        let a = SeededRandomSource(seed: 7)
        let b = SeededRandomSource(seed: 7)
        #expect((0..<5).map { _ in a.nextBits() } == (0..<5).map { _ in b.nextBits() })
        let clock = VirtualClock()
        #expect(clock.now == .zero)
        clock.advance(to: .seconds(3))
        #expect(clock.now == .seconds(3))
        #expect(clock.date == VirtualClock.epoch.addingTimeInterval(3))
    }
}
