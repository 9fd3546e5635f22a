import Foundation
import Testing

@testable import ResponsePolicy

/// Backoff shapes, cap, jitter, Retry-After, attempt timeouts, the methods guard, deadline,
/// on-exhausted, per-rule overrides, routes and the retry budget.
struct RetrySimulationTests {
    let fourFailures = """
        requests:
          - id: a
            responses: [{ status: 503 }, { status: 503 }, { status: 503 }, { status: 503 }, { status: 200 }]
        """

    @Test(arguments: [
        ("backoff: constant", [1.0, 1, 1]), ("backoff: linear", [1.0, 2, 3]), ("backoff: exponential", [1.0, 2, 4]),
        ("backoff: exponential, max-delay: 1500ms", [1.0, 1.5, 1.5]),
        ("backoff: exponential, initial: 250ms, multiplier: 3", [0.25, 0.75, 2.25]),
    ])
    func backoffShapes(_ settings: String, _ waits: [Double]) async throws {
        let result = try await simulate(basePolicy + "\nretry: { \(settings), retry-after: ignore }\n", fourFailures)
        #expect(result.waits("a") == waits)
        // Three retries, then on-exhausted deliver hands over the last 503.
        #expect(result.summary.attempts == 4)
        #expect(result.outcome("a")?.result == .delivered)
        #expect(result.outcome("a")?.status == 503)
    }

    @Test(arguments: [("full", 0.0, 1.0), ("equal", 0.5, 1.0), ("\"20%\"", 0.8, 1.2)])
    func jitterStaysInItsRange(_ jitter: String, _ low: Double, _ high: Double) async throws {
        let result = try await simulate(
            basePolicy + "\nretry: { backoff: constant, max-retries: 3, jitter: \(jitter), budget: none }\n",
            """
            requests:
              - id: j
                repeat: 30
                responses: [{ status: 503 }, { status: 503 }, { status: 503 }, { status: 200 }]
            """)
        let waits = result.events.filter { $0.kind == .wait }.compactMap { $0.delay?.seconds }
        #expect(waits.count == 90)
        #expect(waits.allSatisfy { $0 >= low - 0.001 && $0 <= high + 0.001 })
        // Drawn, not constant.
        #expect(Set(waits).count > 10)
    }

    @Test(arguments: [
        ("Retry-After: 3", "", 3.0), ("Retry-After: 3", "max-delay: 2s", 2.0),
        ("Retry-After: 'Thu, 01 Jan 2026 00:00:05 GMT'", "", 4.95), ("Retry-After: 3", "retry-after: ignore", 1.0),
    ])
    func retryAfterIsHonouredUpToMaxDelay(_ header: String, _ settings: String, _ wait: Double) async throws {
        let result = try await simulate(
            basePolicy + "\nretry: { \(settings.isEmpty ? "max-retries: 1" : settings) }\n",
            """
            requests:
              - id: a
                responses: [{ status: 503, headers: { \(header) } }, { status: 200 }]
            """)
        #expect(result.waits("a").first == wait)
    }

    @Test func aSlowAttemptTimesOutAndCountsAsATimeoutError() async throws {
        let result = try await simulate(
            basePolicy + "\nretry: { attempt-timeout: 1s, backoff: constant, initial: 500ms }\n",
            """
            requests:
              - id: a
                responses: [{ status: 200, latency: 30s }, { body: '{"status":0}' }]
            """)
        let first = try #require(result.events("a").first { $0.kind == .response })
        #expect(first.error == .timeout)
        #expect(first.rule == "transient")
        #expect(PolicyEvent.seconds(first.time) == "1")
        #expect(result.timeline("a") == "send@0 response@1 wait@1 send@1.5 response@1.55 outcome@1.55")
    }

    @Test(arguments: [
        ("", "", 1, PolicyEvent.Result.delivered, 503),
        ("methods: [GET, POST]", "", 2, .delivered, 200),
        ("", "headers: { Idempotency-Key: k-1 }", 2, .delivered, 200),
    ])
    func postIsRetriedOnlyWhenListedOrCarryingAnIdempotencyKey(
        _ settings: String, _ headers: String, _ attempts: Int, _ result: PolicyEvent.Result, _ status: Int
    ) async throws {
        let run = try await simulate(
            basePolicy + "\nretry: { max-retries: 2\(settings.isEmpty ? "" : ", " + settings) }\n",
            """
            requests:
              - id: p
                method: POST
                \(headers)
                responses: [{ status: 503 }, { status: 200 }]
            """)
        #expect(run.summary.attempts == attempts)
        #expect(run.outcome("p")?.result == result)
        #expect(run.outcome("p")?.status == status)
    }

    @Test func aWaitThatWouldEndPastTheDeadlineIsNotStarted() async throws {
        let result = try await simulate(basePolicy + "\nretry: { deadline: 2s, retry-after: ignore }\n", fourFailures)
        // Waits 1s (ends 1.05), attempt 2 answers at 1.1; the next wait (2s) would end at 3.1 > 2.
        #expect(result.timeline("a") == "send@0 response@0.05 wait@0.05 send@1.05 response@1.1 outcome@1.1")
        #expect(result.outcome("a")?.result == .failed)
        #expect(result.outcome("a")?.reason == "deadline")
        #expect(result.outcome("a")?.status == 503)
    }

    @Test(arguments: [("deliver", PolicyEvent.Result.delivered), ("fail", .failed)])
    func onExhausted(_ value: String, _ expected: PolicyEvent.Result) async throws {
        let result = try await simulate(
            basePolicy + "\nretry: { max-retries: 1, on-exhausted: \(value), backoff: constant }\n", fourFailures)
        #expect(result.summary.attempts == 2)
        #expect(result.outcome("a")?.result == expected)
    }

    @Test func aRuleThenMappingOverridesTheRetrySection() async throws {
        let policy = """
            policy: 1
            name: test
            retry: { max-retries: 3, backoff: exponential }
            rules:
              - { name: busy, when: { status: [503] }, then: { do: retry, max-retries: 1, backoff: constant, initial: 500ms } }
            """
        let result = try await simulate(policy, fourFailures)
        #expect(result.waits("a") == [0.5])
    }

    @Test func routesApplyTheirOwnRules() async throws {
        let policy =
            basePolicy + """

                routes:
                  - match: { path: "/oauth/*" }
                    rules: []
                """
        let result = try await simulate(
            policy,
            """
            requests:
              - id: token
                path: /oauth/token
                responses: [{ body: '{"status":1401}' }]
              - id: api
                path: /profile
                responses: [{ body: '{"status":1401}' }, { body: '{"status":0}' }]
            """)
        #expect(result.outcome("token")?.code == "1401")
        #expect(result.outcome("token")?.result == .delivered)
        #expect(result.outcome("api")?.code == "0")
        #expect(result.summary.refreshes == 1)
    }

    @Test(arguments: [("connection", 2, PolicyEvent.Result.delivered), ("dns", 1, .failed)])
    func transportErrorClassesMatchErrorRules(_ error: String, _ attempts: Int, _ expected: PolicyEvent.Result)
        async throws
    {
        let result = try await simulate(
            basePolicy,
            """
            requests:
              - id: a
                responses: [{ error: \(error) }, { body: '{"status":0}' }]
            """)
        #expect(result.summary.attempts == attempts)
        #expect(result.outcome("a")?.result == expected)
        #expect(result.events("a").first { $0.kind == .response }?.error?.rawValue == error)
    }

    @Test func theRetryBudgetCapsARetryStorm() async throws {
        // 50 requests all failing: without a budget 150 retries; min 5 + 10% of 50 allows 10.
        let result = try await simulate(
            basePolicy + "\nretry: { budget: { ratio: 0.1, min: 5 }, backoff: constant }\n",
            """
            requests:
              - id: s
                repeat: 50
                responses: [{ status: 503 }]
            """)
        #expect(result.summary.attempts == 60)
        #expect(result.summary.delivered == 50)
    }
}
