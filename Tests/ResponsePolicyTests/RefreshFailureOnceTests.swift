import Foundation
import Testing

@testable import ResponsePolicy

/// A failed refresh ahead of expiry is one failure: the same dead refresh token is not sent to the
/// token endpoint a second time by the same request.
struct RefreshFailureOnceTests {
    static let policy = basePolicy + "\n  ahead: 5s\n"

    @Test func aFailedRefreshAheadOfAStillValidTokenIsNotRepeatedWhenTheTokenIsRejected() async throws {
        let result = try await simulate(
            Self.policy,
            """
            requests:
              - { id: a, responses: [{ body: '{"status":1401}' }, { body: '{"status":0}' }] }
              - { id: b, at: 6s, responses: [{ body: '{"status":1401}' }, { body: '{"status":0}' }] }
            refresh: [{ after: 100ms, expires-in: 10s }, { after: 100ms, result: fail }]
            """)
        // a's refresh gives a token expiring at t=10.15; at t=6 b refreshes ahead, which fails; the
        // token is still valid, so b tries it; rejected, b meets the failure it already had.
        #expect(result.summary.refreshes == 2)
        #expect(
            result.timeline("b")
                == "refresh-start@6 refresh-end@6.1 send@6.1 response@6.15 logout@6.15 outcome@6.15")
        #expect(result.outcome("b")?.result == .loggedOut)
    }

    @Test func aFailedRefreshAheadOfAnExpiredTokenEndsTheRequestWithoutSendingIt() async throws {
        let result = try await simulate(
            Self.policy,
            """
            requests:
              - { id: a, responses: [{ body: '{"status":1401}' }, { body: '{"status":0}' }] }
              - { id: b, at: 7s, responses: [{ body: '{"status":1401}' }, { body: '{"status":0}' }] }
            refresh: [{ after: 100ms, expires-in: 6s }, { after: 100ms, result: fail }]
            """)
        #expect(result.summary.refreshes == 2)
        // The token expired at t=6.15; b's refresh ahead fails at t=7.1 and b is not sent.
        #expect(result.timeline("b") == "refresh-start@7 refresh-end@7.1 logout@7.1 outcome@7.1")
    }

    @Test func withOnFailureFailTheRequestFailsWithTheRefreshReason() async throws {
        let result = try await simulate(
            Self.policy + "  on-failure: fail\n",
            """
            requests:
              - { id: a, responses: [{ body: '{"status":1401}' }, { body: '{"status":0}' }] }
              - { id: b, at: 6s, responses: [{ body: '{"status":1401}' }, { body: '{"status":0}' }] }
              - { id: c, at: 20s, responses: [{ body: '{"status":1401}' }, { body: '{"status":0}' }] }
            refresh: [{ after: 100ms, expires-in: 10s }, { after: 100ms, result: fail }, { after: 100ms }]
            """)
        #expect(result.outcome("b")?.result == .failed)
        #expect(result.outcome("b")?.reason?.contains("scripted refresh failure") == true)
        // A later request is another request: it may refresh again (and here succeeds): ahead of
        // the expired token, then once more for its scripted 1401 (share-window is off).
        #expect(result.outcome("c")?.result == .delivered)
        #expect(result.summary.refreshes == 4)
    }
}
