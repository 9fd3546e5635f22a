import Foundation
import Testing

@testable import ResponsePolicy

/// Issue 20: a session ends only when the server means it. Transient token-endpoint trouble is
/// retried within `refresh.timeout` and never logs out; a definitive answer ends the session once
/// and is not asked again at once; `ahead` never exceeds half a token's lifetime; `limit` counts
/// only refreshes that did not help; a request refused with an older token is re-sent without
/// counting against `max-per-request`. All on the virtual clock.
struct SessionEndsOnlyWhenMeantTests {
    static let fortyRequests = """
          - { id: r, at: 0s, repeat: 40, responses: [{ body: '{"status":1401}' }, { body: '{"status":0}' }] }

        """

    // MARK: - Transient and definitive refresh answers

    @Test(arguments: [
        "{ after: 50ms, result: fail, status: 503 }", "{ after: 50ms, result: fail, status: 429 }",
        "{ after: 50ms, result: fail, status: 500 }", "{ after: 50ms, result: transient }",
        #"{ after: 50ms, result: fail, status: 400, body: '{"error":"temporarily_unavailable"}' }"#,
        #"{ after: 50ms, result: fail, status: 400, body: '{"error":"slow_down"}' }"#,
    ])
    func oneTransientAnswerIsRetriedAndNobodyIsLoggedOut(step: String) async throws {
        let result = try await simulate(
            basePolicy, "requests:\n" + Self.fortyRequests + "refresh: [\(step), { after: 50ms, result: ok }]\n")
        #expect(result.summary.logouts == 0)
        #expect(result.summary.delivered == 40)
        #expect(result.summary.refreshes == 2, "one failed call, one retry")
        let retries = result.events.filter { $0.kind == .refreshRetry }
        #expect(retries.count == 1)
        #expect(retries.first?.delay == .milliseconds(500), "refresh.transient.initial")
    }

    @Test func transientBackoffDoublesUpToItsCapAndNeverLoopsTightly() {
        var transient = RefreshSettings.Transient()
        let waits = (1...6).map { transient.delay(afterCall: $0, requested: nil) }
        #expect(waits == [.milliseconds(500), .seconds(1), .seconds(2), .seconds(4), .seconds(5), .seconds(5)])
        #expect(transient.delay(afterCall: 1, requested: .seconds(60)) == .seconds(60), "Retry-After obeyed in full")
        #expect(transient.delay(afterCall: 3, requested: .zero) == .milliseconds(50), "Retry-After: 0 is not a loop")
        transient.honorRetryAfter = false
        #expect(transient.delay(afterCall: 1, requested: .seconds(3)) == .milliseconds(500))
        transient.initial = .zero
        #expect(transient.delay(afterCall: 4, requested: nil) == RefreshSettings.Transient.minimumDelay)
    }

    @Test func retryAfterSetsTheWaitBeforeTheNextCall() async throws {
        let result = try await simulate(
            basePolicy,
            "requests:\n" + Self.fortyRequests
                + "refresh: [{ after: 50ms, result: fail, status: 503, retry-after: 2s }, { after: 50ms }]\n")
        #expect(result.events.first { $0.kind == .refreshRetry }?.delay == .seconds(2))
        #expect(result.summary.delivered == 40 && result.summary.logouts == 0)
        // Every request waited parked through the retry: each was sent twice, no more.
        #expect(result.summary.attempts == 80)
    }

    @Test func transientTroubleOutlastingTheTimeoutFailsTheRequestsAndKeepsTheSession() async throws {
        let result = try await simulate(
            basePolicy,
            """
            requests:
              - { id: r, at: 0s, repeat: 10, responses: [{ body: '{"status":1401}' }, { body: '{"status":0}' }] }
              - { id: late, at: 30s, responses: [{ body: '{"status":0}' }] }
            refresh: [{ after: 50ms, result: fail, status: 503 }]
            """)
        #expect(result.summary.logouts == 0, "transient trouble never ends the session")
        #expect(result.summary.failed == 10)
        #expect(result.outcome("r-1")?.reason?.contains("outlasted refresh.timeout (10s") == true)
        // Calls at 0, 0.55, 1.6, 3.65, 7.7 (backoff 0.5s doubling to the 5s cap): the next wait
        // would end past the timeout, so the refresh fails then, not later.
        #expect(result.summary.refreshes == 5)
        #expect(result.outcome("late")?.result == .delivered, "the session goes on")
        #expect(result.events.last { $0.kind == .refreshEnd }.map { $0.time < .seconds(10) } == true)
    }

    @Test func transientNoneFailsAtTheFirstTransientAnswerWithoutLoggingOut() async throws {
        let result = try await simulate(
            basePolicy + "\n  transient: none\n",
            "requests:\n" + Self.fortyRequests + "refresh: [{ after: 50ms, result: fail, status: 503 }]\n")
        #expect(result.summary.refreshes == 1 && result.summary.logouts == 0 && result.summary.failed == 40)
    }

    @Test func aDefinitiveAnswerEndsTheSessionOnceWithItsReason() async throws {
        let result = try await simulate(
            basePolicy,
            "requests:\n" + Self.fortyRequests
                + #"refresh: [{ after: 50ms, result: fail, status: 400, body: '{"error":"invalid_grant"}' }]"# + "\n")
        #expect(result.summary.refreshes == 1, "a definitive answer is not retried")
        #expect(result.summary.logouts == 1)
        #expect(result.summary.loggedOut == 40)
        let logout = result.events.first { $0.kind == .logout }
        #expect(logout?.reason?.contains("invalid_grant") == true || logout?.rule == nil)
    }

    @Test func aStatusTheRefreshRulesNameIsDefinitive() async throws {
        // A 401 from the token endpoint, which the policy's refresh rule names: definitive.
        let policy = basePolicy.replacingOccurrences(
            of: "  - { name: transient,",
            with: "  - { name: unauthorized, when: { status: [401] }, then: refresh }\n  - { name: transient,")
        let result = try await simulate(
            policy, "requests:\n" + Self.fortyRequests + "refresh: [{ after: 50ms, result: fail, status: 401 }]\n")
        #expect(result.summary.refreshes == 1 && result.summary.logouts == 1)
    }

    @Test func aDefinitiveFailureIsNotAskedAgainAtOnceAndLaterFailuresNameIt() async throws {
        let result = try await simulate(
            basePolicy + "\n  on-failure: fail\n",
            """
            requests:
              - { id: a, at: 0s, responses: [{ body: '{"status":1401}' }, { body: '{"status":0}' }] }
              - { id: b, at: 1s, repeat: 5, responses: [{ body: '{"status":1401}' }, { body: '{"status":0}' }] }
              - { id: c, at: 12s, responses: [{ body: '{"status":1401}' }, { body: '{"status":0}' }] }
            refresh: [{ after: 50ms, result: fail, status: 401, body: '{"error":"invalid_client"}' }, { after: 50ms }]
            """)
        // One call for a and the five b's (within refresh.timeout of the definitive answer), then
        // one for c, after it: not hammered, and never "refresh.limit".
        #expect(result.summary.refreshes == 2)
        for id in ["a", "b-1", "b-5"] {
            #expect(result.outcome(id)?.result == .failed)
            #expect(result.outcome(id)?.reason?.contains("invalid_client") == true, "\(id)")
            #expect(result.outcome(id)?.reason?.contains("refresh.limit") == false, "\(id)")
        }
        #expect(result.outcome("c")?.result == .delivered)
        #expect(result.summary.logouts == 0)
    }

    // MARK: - Lifetimes

    @Test func aheadNeverExceedsHalfTheLifetimeAsIssued() async throws {
        // ahead: 30s (the default) with tokens living 20s: refreshed ahead 10s before expiry, not
        // before every request.
        let result = try await simulate(
            basePolicy,
            """
            requests:
              - { id: a, at: 0s, responses: [{ body: '{"status":1401}' }, { body: '{"status":0}' }] }
              - { id: b, at: 1s, repeat: 20, responses: [{ body: '{"status":0}' }] }
              - { id: c, at: 11s, responses: [{ body: '{"status":0}' }] }
            refresh: [{ after: 50ms, expires-in: 20s }]
            """)
        #expect(result.summary.refreshes == 2, "one for a's trigger, one ahead for c")
        #expect(result.timeline("c").hasPrefix("refresh-start@11"))
        #expect(result.summary.delivered == 22 && result.summary.logouts == 0)
    }

    @Test func healthyRotationsOfShortTokensAreNotCountedByTheLimit() async throws {
        // Tokens living 2s, each used until the server refuses it: 20 refreshes in 40s, far
        // beyond limit { count: 5, per: 30s }, and nobody is logged out.
        var requests = ""
        for second in 0..<40 {
            requests += "  - { id: q\(second), at: \(second)s, responses: [{ body: '{\"status\":0}' }] }\n"
        }
        let result = try await simulate(
            basePolicy + "\n  ahead: none\n",
            """
            requests:
            \(requests)tokens:
              initial: valid
              rejected: { status: 200, body: '{"status":1401}' }
              expire: [\((1...20).map { "\($0 * 2 - 1).5s" }.joined(separator: ", "))]
            refresh: [{ after: 50ms, expires-in: 2s }]
            """)
        #expect(result.summary.logouts == 0)
        #expect(result.summary.delivered == 40)
        #expect(result.summary.refreshes >= 15)
    }

    @Test func refreshesThatDidNotHelpAreStoppedByTheLimit() async throws {
        // Every new token is refused at once: a loop, stopped by refresh.limit.
        let result = try await simulate(
            basePolicy + "\n  max-per-request: 10\n  limit: { count: 3, per: 30s }\n",
            """
            requests:
              - { id: a, responses: [{ body: '{"status":1401}' }] }
            refresh: [{ after: 50ms }]
            """)
        // Three refreshes: the initial token's (never counted) and two whose tokens were refused at
        // once; the third refused token reaches the limit. The request fails; the limit is a
        // counter the engine keeps, so the session goes on.
        #expect(result.summary.refreshes == 3)
        #expect(result.outcome("a")?.result == .failed)
        #expect(result.summary.logouts == 0)
        #expect(result.events.contains { $0.kind == .refreshEnd && $0.reason?.contains("refresh.limit") == true })
    }

    // MARK: - Generation first

    @Test func aResendWithANewerTokenDoesNotCountAgainstMaxPerRequest() async throws {
        // a is refused (t=0.3), refreshes (token 1 at 0.35, living 0.4s) and is re-sent at once,
        // but token 1 is refused from 0.35 on; before that refusal arrives (0.65), c refreshes
        // ahead of token 1's expiry (at 0.56, within half its lifetime): token 2 exists. a's
        // refusal of token 1 is re-sent with token 2 without counting: max-per-request (1) is not
        // used up, and nobody is logged out.
        let result = try await simulate(
            basePolicy,
            """
            requests:
              - { id: a, at: 0s, responses: [{ body: '{"status":0}' }] }
              - { id: c, at: 560ms, responses: [{ body: '{"status":0}' }] }
            tokens:
              initial: expired
              rejected: { status: 200, body: '{"status":1401}', latency: 300ms }
              expire: [350ms]
            refresh: [{ after: 50ms, expires-in: 400ms }]
            """)
        #expect(result.summary.logouts == 0)
        #expect(result.outcome("a")?.result == .delivered)
        #expect(result.outcome("c")?.result == .delivered)
        #expect(result.summary.refreshes == 2)
    }
}
