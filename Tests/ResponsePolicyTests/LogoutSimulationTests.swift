import Testing

@testable import ResponsePolicy

/// Forced logout: one logout for many triggers, in-flight and waiting requests ended, the
/// cooldown failing new requests without the network, refreshes and retries suppressed.
struct LogoutSimulationTests {
    @Test func manyLogoutTriggersAtOnceMakeOneLogout() async throws {
        let result = try await simulate(
            basePolicy,
            """
            requests:
              - id: g
                repeat: 20
                responses: [{ body: '{"status":202}' }]
            """)
        #expect(result.summary.logouts == 1)
        #expect(result.summary.loggedOut == 20)
        #expect(result.summary.attempts == 20)
    }

    @Test func inFlightAndWaitingRequestsEndAsLoggedOut() async throws {
        // The trigger goes out while a refresh runs: new requests are not held for it here.
        let result = try await simulate(
            basePolicy + "\n  hold-new-requests: false\n",
            """
            requests:
              - id: slow
                responses: [{ body: '{"status":0}', latency: 5s }]
              - id: waiting
                responses: [{ status: 503 }, { body: '{"status":0}' }]
              - id: refreshing
                responses: [{ body: '{"status":1401}' }, { body: '{"status":0}' }]
              - id: trigger
                at: 100ms
                responses: [{ body: '{"status":202}' }]
            refresh: [{ after: 1s }]
            """)
        #expect(result.summary.logouts == 1)
        // Cancelled on the wire at the logout (t=0.15), not left to finish at t=5.
        #expect(result.timeline("slow") == "send@0 cancel@0.15 outcome@0.15")
        #expect(result.outcome("slow")?.result == .loggedOut)
        // Waiting in its 1s backoff.
        #expect(result.timeline("waiting") == "send@0 response@0.05 wait@0.05 cancel@0.15 outcome@0.15")
        // The trigger ends by its own logout: nothing of it was cancelled.
        #expect(result.timeline("trigger") == "send@0.1 response@0.15 logout@0.15 outcome@0.15")
        #expect(result.events("refreshing").filter { $0.kind == .cancel }.map(\.reason) == ["logout"])
        // Waiting for the refresh, which no longer signs the session back in.
        #expect(result.outcome("refreshing")?.result == .loggedOut)
        #expect(result.outcome("trigger")?.result == .loggedOut)
        #expect(PolicyEvent.seconds(result.outcome("refreshing")?.time ?? .zero) == "0.15")
    }

    @Test func withoutCancelInFlightRequestsOnTheWireFinish() async throws {
        let result = try await simulate(
            basePolicy + "\nlogout: { cancel-in-flight: false }\n",
            """
            requests:
              - id: slow
                responses: [{ body: '{"status":0}', latency: 1s }]
              - id: trigger
                responses: [{ body: '{"status":202}' }]
            """)
        #expect(result.outcome("slow")?.result == .delivered)
        #expect(result.outcome("trigger")?.result == .loggedOut)
    }

    @Test func theCooldownFailsNewRequestsWithoutTheNetworkUntilItEnds() async throws {
        let result = try await simulate(
            basePolicy + "\nlogout: { cooldown: 20s }\n",
            """
            requests:
              - id: trigger
                responses: [{ body: '{"status":202}' }]
              - id: during
                at: 10s
                responses: [{ body: '{"status":0}' }]
              - id: after
                at: 21s
                responses: [{ body: '{"status":0}' }]
            """)
        #expect(result.timeline("during") == "outcome@10")
        #expect(result.outcome("during")?.result == .loggedOut)
        #expect(result.timeline("after") == "send@21 response@21.05 outcome@21.05")
        #expect(result.summary.attempts == 2)
    }

    @Test func theCooldownSuppressesRefreshesAndRetries() async throws {
        let result = try await simulate(
            basePolicy,
            """
            requests:
              - id: trigger
                at: 10ms
                responses: [{ body: '{"status":202}' }]
              - id: late-expiry
                at: 20ms
                responses: [{ body: '{"status":1401}', latency: 100ms }, { body: '{"status":0}' }]
            refresh: [{ after: 100ms }]
            """)
        #expect(result.summary.refreshes == 0)
        #expect(result.outcome("late-expiry")?.result == .loggedOut)
    }

    @Test func aFailedRefreshWithOnFailureLogoutCallsLogoutOnce() async throws {
        let result = try await simulate(
            basePolicy,
            """
            requests:
              - id: w
                repeat: 10
                responses: [{ body: '{"status":1401}' }]
            refresh: [{ after: 100ms, result: fail }]
            """)
        #expect(result.summary.logouts == 1)
        #expect(result.summary.loggedOut == 10)
    }
}
