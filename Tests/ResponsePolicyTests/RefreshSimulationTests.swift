import Foundation
import TestSupport
import Testing

@testable import ResponsePolicy

/// Single-flight refresh, generations, share-window, max-per-request, failures and limits,
/// each driven through the real engine on the virtual clock.
struct RefreshSimulationTests {
    @Test func concurrentTriggersMakeOneRefreshAndNeverReachTheCaller() async throws {
        let result = try await simulate(
            basePolicy,
            """
            requests:
              - id: a
                responses:
                  - { status: 200, body: '{"status":1401}' }
                  - { status: 200, body: '{"status":0}' }
              - id: b
                at: 10ms
                repeat: 50
                responses:
                  - { status: 200, body: '{"status":1401}' }
                  - { status: 200, body: '{"status":0}' }
            refresh:
              - { after: 100ms, result: ok }
            """)
        #expect(result.summary == Simulator.Summary(requests: 51, delivered: 51, refreshes: 1, attempts: 102))
        for event in result.events where event.kind == .outcome {
            #expect(event.code == "0" && event.status == 200)
        }
        #expect(
            result.timeline("a")
                == "send@0 response@0.05 refresh-start@0.05 refresh-end@0.15 send@0.15 response@0.2 outcome@0.2")
        #expect(result.timeline("b-7") == "send@0.01 response@0.06 send@0.15 response@0.2 outcome@0.2")
    }

    @Test func aRequestWithAnOlderTokenRetriesAtOnceWithoutRefreshing() async throws {
        // share-window 0s isolates the generation check; c goes out during the refresh only
        // when new requests are not held for it.
        let result = try await simulate(
            basePolicy + "\n  share-window: 0s\n  hold-new-requests: false\n",
            """
            requests:
              - id: a
                responses: [{ body: '{"status":1401}' }, { body: '{"status":0}' }]
              - id: c
                at: 120ms
                responses: [{ body: '{"status":1401}' }, { body: '{"status":0}' }]
            refresh: [{ after: 100ms }]
            """)
        #expect(result.summary.refreshes == 1)
        // c was signed before the refresh ended (t=0.15) and answered after it: it is re-sent at once.
        #expect(result.timeline("c") == "send@0.12 response@0.17 send@0.17 response@0.22 outcome@0.22")
    }

    @Test(arguments: [("20s", 1), ("0s", 2)])
    func triggersWithinTheShareWindowRetryWithoutRefreshing(_ window: String, _ refreshes: Int) async throws {
        let result = try await simulate(
            basePolicy + "\n  share-window: \(window)\n",
            """
            requests:
              - id: a
                responses: [{ body: '{"status":1401}' }, { body: '{"status":0}' }]
              - id: d
                at: 200ms
                responses: [{ body: '{"status":1401}' }, { body: '{"status":0}' }]
            refresh: [{ after: 100ms }]
            """)
        #expect(result.summary.refreshes == refreshes)
        #expect(result.outcome("d")?.result == .delivered)
    }

    @Test(arguments: [
        ("logout", PolicyEvent.Result.loggedOut, 1), ("fail", .failed, 0), ("deliver", .delivered, 0),
    ])
    func maxPerRequestThenOnExhausted(_ onExhausted: String, _ expected: PolicyEvent.Result, _ logouts: Int)
        async throws
    {
        let result = try await simulate(
            basePolicy + "\n  max-per-request: 1\n  on-exhausted: \(onExhausted)\n",
            """
            requests:
              - id: a
                responses: [{ body: '{"status":1401}' }]
            refresh: [{ after: 100ms }]
            """)
        #expect(result.summary.refreshes == 1)
        #expect(result.summary.attempts == 2)
        #expect(result.summary.logouts == logouts)
        #expect(result.outcome("a")?.result == expected)
        if expected == .delivered { #expect(result.outcome("a")?.code == "1401") }
    }

    /// A token refused after its lifetime, as the token endpoint issued it, ended on the way (it
    /// was valid when the attempt left) was not refused fresh: the refresh it leads to does not
    /// count against `max-per-request` (1 in default.yaml, with `on-exhausted: logout`), and the
    /// request is delivered. The same refusal while the token was still valid counts, and the
    /// request meets `on-exhausted`. (examples/simulations/25-token-expired-in-flight.yaml.)
    @Test(arguments: [
        ("1500ms", PolicyEvent.Result.delivered, 2, 0), ("500ms", .loggedOut, 1, 1),
    ])
    func aTokenExpiredInFlightIsNotCountedAgainstMaxPerRequest(
        _ latency: String, _ expected: PolicyEvent.Result, _ refreshes: Int, _ logouts: Int
    ) async throws {
        let policy = try String(
            contentsOf: repositoryRoot.appendingPathComponent("policies/default.yaml"), encoding: .utf8)
        let result = try await simulate(
            policy,
            """
            requests:
              - id: slow
                responses:
                  - { body: '{"status":1401}' }
                  - { body: '{"status":1401}', latency: \(latency) }
                  - { body: '{"status":0}' }
            refresh:
              - after: 100ms
                body: '{"access_token":"t1","token_type":"Bearer","expires_in":1,"refresh_token":"r1"}'
              - after: 100ms
                body: '{"access_token":"t2","token_type":"Bearer","expires_in":60,"refresh_token":"r2"}'
            """)
        #expect(result.outcome("slow")?.result == expected)
        #expect(result.summary.refreshes == refreshes)
        #expect(result.summary.logouts == logouts)
    }

    @Test(arguments: [("fail", PolicyEvent.Result.failed, 0), ("logout", .loggedOut, 1)])
    func aFailedRefreshEndsEveryWaiterPerOnFailure(_ onFailure: String, _ expected: PolicyEvent.Result, _ logouts: Int)
        async throws
    {
        let result = try await simulate(
            basePolicy + "\n  on-failure: \(onFailure)\n",
            """
            requests:
              - id: w
                repeat: 5
                responses: [{ body: '{"status":1401}' }, { body: '{"status":0}' }]
            refresh: [{ after: 100ms, result: fail }]
            """)
        #expect(result.summary.refreshes == 1)
        #expect(result.summary.logouts == logouts)
        for index in 1...5 { #expect(result.outcome("w-\(index)")?.result == expected) }
        #expect(result.events.contains { $0.kind == .refreshEnd && $0.ok == false })
    }

    @Test func aRefreshSlowerThanItsTimeoutFails() async throws {
        let result = try await simulate(
            basePolicy + "\n  timeout: 2s\n  on-failure: fail\n",
            """
            requests:
              - id: a
                responses: [{ body: '{"status":1401}' }, { body: '{"status":0}' }]
            refresh: [{ after: 30s }]
            """)
        // At the timeout its waiter fails; the call runs on one more timeout (a pair it brings
        // would be kept), then it is abandoned.
        let ends = result.events.filter { $0.kind == .refreshEnd }
        #expect(ends.map(\.ok) == [false, false])
        #expect(ends.first?.reason == "the refresh took longer than 2s")
        #expect(ends.first.map { PolicyEvent.seconds($0.time) } == "2.05")
        #expect(ends.last?.reason == "the token endpoint did not answer within 4s; the call was abandoned")
        #expect(ends.last.map { PolicyEvent.seconds($0.time) } == "4.05")
        #expect(result.outcome("a")?.result == .failed)
        #expect(result.outcome("a").map { PolicyEvent.seconds($0.time) } == "2.05")
    }

    @Test func aRefreshAnsweredWithALogoutCodeLogsOutWhateverOnFailureSays() async throws {
        let result = try await simulate(
            basePolicy + "\n  on-failure: fail\n",
            """
            requests:
              - id: a
                responses: [{ body: '{"status":1401}' }, { body: '{"status":0}' }]
            refresh: [{ after: 100ms, result: fail, status: 200, body: '{"status":202}' }]
            """)
        #expect(result.outcome("a")?.result == .loggedOut)
        #expect(result.summary.logouts == 1)
    }

    @Test func theRefreshLimitStopsARefreshLoop() async throws {
        let result = try await simulate(
            basePolicy
                + "\n  share-window: 0s\n  max-per-request: 10\n  on-failure: fail\n  limit: { count: 2, per: 30s }\n",
            """
            requests:
              - id: a
                responses: [{ body: '{"status":1401}' }]
            refresh: [{ after: 100ms }]
            """)
        #expect(result.summary.refreshes == 2)
        #expect(result.outcome("a")?.result == .failed)
        #expect(
            result.events.last { $0.kind == .refreshEnd }?.reason
                == "refresh.limit: 2 refreshes in 30s issued tokens the server refused at once; none is asked again"
                + " until the window allows (the session goes on)")
        #expect(result.summary.logouts == 0, "a counter the engine keeps never ends the session")
    }

    @Test func tokensAboutToExpireAreRefreshedBeforeSending() async throws {
        // The first refresh returns a token that expires at t=10.15; at t=6 that is within the
        // 5s 'ahead' window, so b refreshes before it goes out.
        let result = try await simulate(
            basePolicy + "\n  ahead: 5s\n",
            """
            requests:
              - id: a
                responses: [{ body: '{"status":1401}' }, { body: '{"status":0}' }]
              - id: b
                at: 6s
                responses: [{ body: '{"status":0}' }]
            refresh: [{ after: 100ms, expires-in: 10s }, { after: 100ms, expires-in: 1h }]
            """)
        #expect(result.summary.refreshes == 2)
        #expect(
            result.timeline("a")
                == "send@0 response@0.05 refresh-start@0.05 refresh-end@0.15 send@0.15 response@0.2 outcome@0.2")
        #expect(result.timeline("b") == "refresh-start@6 refresh-end@6.1 send@6.1 response@6.15 outcome@6.15")
    }

    @Test func tenThousandConcurrentTriggersMakeOneRefresh() async throws {
        let result = try await simulate(
            basePolicy,
            """
            requests:
              - id: r
                repeat: 10000
                responses: [{ body: '{"status":1401}' }, { body: '{"status":0}' }]
            refresh: [{ after: 100ms }]
            """)
        #expect(result.summary == Simulator.Summary(requests: 10000, delivered: 10000, refreshes: 1, attempts: 20000))
    }

    @Test func theSameScriptGivesTheSameEventsEveryRun() async throws {
        let script = """
            requests:
              - id: a
                responses: [{ body: '{"status":1401}' }, { status: 503 }, { body: '{"status":0}' }]
              - id: b
                repeat: 20
                at: 5ms
                responses: [{ body: '{"status":1401}' }, { body: '{"status":0}' }]
            """
        let first = try await simulate(basePolicy + "\nretry: { jitter: full }\n", script)
        let second = try await simulate(basePolicy + "\nretry: { jitter: full }\n", script)
        #expect(first.events.map(\.jsonLine) == second.events.map(\.jsonLine))
    }
}
