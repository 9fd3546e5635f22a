import Testing

@testable import ResponsePolicy

/// `tokens:` in a simulation script: a server that accepts only the newest token, so a storm on
/// an expired token, a re-expiry and header or query signing can be tried without a network.
struct TokenServerSimulationTests {
    /// The business-code scheme, with no share-window: a re-expiry must refresh again.
    private static let policy = basePolicy + "\n  share-window: 0s\n  max-per-request: 2\n"

    @Test func aStormOnAnExpiredTokenMakesOneRefreshAndEveryRequestIsDelivered() async throws {
        let result = try await simulate(
            Self.policy,
            """
            tokens:
              initial: expired
              rejected: { status: 200, body: '{"status":1401}' }
            requests:
              - { id: s, repeat: 500, responses: [{ status: 200, body: '{"status":0}' }] }
            refresh: [{ after: 200ms }]
            """)
        #expect(result.summary.refreshes == 1)
        #expect(result.summary.delivered == 500)
        // Every request goes out once with the dead token and once with the new one.
        #expect(result.summary.attempts == 1_000)
        for event in result.events where event.kind == .outcome { #expect(event.code == "0") }
    }

    @Test func aRejectedAttemptDoesNotUseUpAScriptedResponse() async throws {
        let result = try await simulate(
            Self.policy,
            """
            tokens: { initial: expired, rejected: { status: 200, body: '{"status":1401}' } }
            requests:
              - id: a
                responses: [{ status: 200, body: '{"status":7}' }, { status: 200, body: '{"status":8}' }]
            refresh: [{ after: 100ms }]
            """)
        // The first accepted attempt gets the first scripted response, not the second.
        #expect(result.outcome("a")?.code == "7")
        #expect(
            result.timeline("a")
                == "send@0 response@0.05 refresh-start@0.05 refresh-end@0.15 send@0.15 response@0.2 outcome@0.2")
    }

    @Test func aTokenThatExpiresAgainIsRefreshedAgain() async throws {
        let result = try await simulate(
            Self.policy,
            """
            tokens:
              rejected: { status: 200, body: '{"status":1401}' }
              expire: [1s]
            requests:
              - { id: before, at: 0s, responses: [{ body: '{"status":0}' }] }
              - { id: after, at: 2s, responses: [{ body: '{"status":0}' }] }
              - { id: later, at: 3s, responses: [{ body: '{"status":0}' }] }
            refresh: [{ after: 100ms }]
            """)
        // The initial token is valid until 1s; 'after' meets the expiry and refreshes once;
        // 'later' uses the new token, which no expire time has ended.
        #expect(result.timeline("before") == "send@0 response@0.05 outcome@0.05")
        #expect(result.summary.refreshes == 1)
        #expect(result.timeline("later") == "send@3 response@3.05 outcome@3.05")
        #expect(result.summary.delivered == 3)
        #expect(result.summary.attempts == 4)
    }

    @Test(arguments: [
        "authorize: { use: header, with: { name: auth_token } }",
        "authorize: { use: query, with: { name: access_token } }",
    ])
    func theServerReadsTheTokenWhereverTheAuthorizerPutsIt(_ authorize: String) async throws {
        let result = try await simulate(
            Self.policy + authorize + "\n",
            """
            tokens: { initial: expired, rejected: { status: 200, body: '{"status":1401}' } }
            requests: [{ id: a, responses: [{ body: '{"status":0}' }] }]
            """)
        #expect(result.summary.refreshes == 1)
        #expect(result.outcome("a")?.result == .delivered)
        #expect(result.summary.attempts == 2)
    }

    @Test func withoutTokensTheServerIgnoresWhichTokenSigned() async throws {
        let result = try await simulate(
            Self.policy, "requests: [{ id: a, responses: [{ body: '{\"status\":0}' }] }]")
        #expect(result.summary.attempts == 1)
        #expect(result.summary.refreshes == 0)
    }

    @Test func theTokensSectionIsChecked() {
        let (script, diagnostics) = SimulationScript.parse(
            Array(
                """
                tokens: { initial: stale, expire: [5], rejectd: {} }
                requests: [{ id: a, responses: [{ status: 200 }] }]
                """.utf8), file: "s.yaml")
        #expect(script == nil)
        #expect(
            diagnostics.map { "\($0.range.start.line):\($0.range.start.column) \($0.rule)" } == [
                "1:20 invalid-value", "1:36 invalid-duration", "1:40 unknown-key",
            ], "\(diagnostics.map(\.description))")
    }
}
