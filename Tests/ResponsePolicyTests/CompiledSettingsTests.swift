import Foundation
import Testing

@testable import ResponsePolicy

/// Issue 18's repros: every setting the engine uses is the compiled rule's, and behaves as
/// `explain` says.
struct CompiledSettingsTests {
    /// A retry rule 503 → constant 100ms and a refresh rule 1401 whose refresh fails into a
    /// logout; the logout has its own section so nothing is hidden.
    static let heldPolicy =
        basePolicy + """

              on-failure: logout
            retry: { backoff: constant, initial: 100ms }
            logout: { cooldown: 20s }
            """

    /// A request whose backoff ends while a refresh is in flight is held (an event says so);
    /// when the refresh fails into a logout it is never sent: the logout starts in the same step
    /// that ends the refresh. `a` is the older request, so it is woken first: before the fix it
    /// was released and sent in that instant.
    @Test func aHeldRetryIsNeverSentWhenItsRefreshFailsIntoALogout() async throws {
        let result = try await simulate(
            Self.heldPolicy,
            """
            requests:
              - { id: a, at: 0s, responses: [{ status: 503 }, { body: '{"status":0}' }] }
              - { id: b, at: 10ms, responses: [{ body: '{"status":1401}' }, { body: '{"status":0}' }] }
            refresh: [{ after: 500ms, result: fail }]
            """)
        #expect(result.timeline("a") == "send@0 response@0.05 wait@0.05 held@0.15 cancel@0.56 outcome@0.56")
        #expect(result.outcome("a")?.result == .loggedOut)
        #expect(result.outcome("b")?.result == .loggedOut)
        #expect(result.summary.attempts == 2 && result.summary.logouts == 1)
        let logout = try #require(result.events.firstIndex { $0.kind == .logout })
        #expect(!result.events[logout...].contains { $0.kind == .send })
    }

    /// `then: { do: retry, attempt-timeout: …, deadline: … }` and `then: { do: refresh, ahead: …,
    /// hold-new-requests: … }` were accepted and ignored; they are refused at the key.
    @Test func requestWideKeysInThenAreRefusedWhereTheyAreWritten() {
        let text = """
            policy: 1
            name: over
            refresh: { use: oauth2, with: { token-url: "https://auth.example.com/token", client-id: app } }
            logout: { cooldown: 20s }
            rules:
              - { name: slow, when: { status: [503] }, then: { do: retry, attempt-timeout: 100ms, deadline: 500ms } }
              - { name: auth, when: { status: [401] }, then: { do: refresh, ahead: 5m, hold-new-requests: false } }
            """
        #expect(
            findings(text).filter { $0.severity == .error }.map(\.description) == [
                "test.yaml:6:63: error: 'attempt-timeout' applies to the whole request, not to one rule; set it in 'retry:' or in a route's 'retry:' [request-wide-override]",
                "test.yaml:6:87: error: 'deadline' applies to the whole request, not to one rule; set it in 'retry:' or in a route's 'retry:' [request-wide-override]",
                "test.yaml:7:65: error: 'ahead' applies to the whole request, not to one rule; set it in 'refresh:' or in a route's 'refresh:' [request-wide-override]",
                "test.yaml:7:76: error: 'hold-new-requests' applies to the whole request, not to one rule; set it in 'refresh:' or in a route's 'refresh:' [request-wide-override]",
            ])
    }

    /// The key is prepared from the retry rules' own settings, and retryability is judged from
    /// the same: a rule `methods: [GET]` under a section listing POST does not retry a POST; a
    /// rule listing POST under a section that does not retries it with the generated key.
    @Test(arguments: [
        ("retry: { methods: [GET, POST], backoff: constant, initial: 100ms }", "[GET]", 1, false),
        ("retry: { backoff: constant, initial: 100ms }", "[GET, POST]", 2, true),
    ])
    func idempotencyIsPreparedAndJudgedFromTheRule(
        section: String, ruleMethods: String, attempts: Int, keyed: Bool
    ) async throws {
        let transport = RecordingTransport { _, count in count < 2 ? response("", status: 503) : response("ok") }
        let sim = try SimulatedEngine(
            """
            policy: 1
            name: keys
            \(section)
            rules:
              - { name: busy, when: { status: [503] }, then: { do: retry, methods: \(ruleMethods) } }
            """, transport: transport)
        let delivered = try await sim.run { engine in
            try await engine.send(HTTPRequest(method: "POST", url: testURL, body: Data("{}".utf8)))
        }
        #expect(delivered.status == (attempts == 1 ? 503 : 200))
        let sent = transport.requests
        #expect(sent.count == attempts)
        #expect(sent.allSatisfy { ($0.headers["Idempotency-Key"] != nil) == keyed })
        #expect(Set(sent.compactMap { $0.headers["Idempotency-Key"] }).count == (keyed ? 1 : 0))
    }

    /// `max-delay: 8s, jitter: "20%"` waited up to 9.5s while explain said "capped at 8s".
    @Test func maxDelayCapsTheWaitAfterJitter() {
        var settings = RetrySettings()
        settings.backoff = .exponential
        settings.initial = .seconds(2)
        settings.maxDelay = .seconds(8)
        settings.jitter = .proportional(0.2)
        settings.honorRetryAfter = false
        #expect(settings.longestWait(forRetry: 1) == .milliseconds(2400))
        #expect(settings.longestWait(forRetry: 3) == .seconds(8))
        for n in 1...6 {
            for unit in [0.0, 0.5, 0.999_999] {
                let delay = RetryTiming.delay(
                    forRetry: n, settings: settings, response: nil, now: Date(), random: FixedRandom(unit))
                #expect(delay <= settings.longestWait(forRetry: n) && delay <= .seconds(8), "retry \(n), draw \(unit)")
            }
        }
    }

    /// With `503 → 3 retries from 1s` and `502 → 2 retries of 12s`, a request waits 12s + 12s +
    /// 4s at most: the retry counter is shared, each wait uses the matching rule's settings.
    @Test func theWorstCaseTakesTheLongestWaitOfAnyRuleAtEachRetry() throws {
        let policy = try Policy.load(
            yaml: """
                policy: 1
                name: mixed
                retry: { attempt-timeout: 1s, deadline: 60s, retry-after: ignore }
                rules:
                  - { name: busy, when: { status: [503] }, then: { do: retry, max-retries: 3, initial: 1s } }
                  - { name: gateway, when: { status: [502] }, then: { do: retry, max-retries: 2, backoff: constant, initial: 12s } }
                """)
        let worst = policy.graph.scopes[0].worstCase
        #expect(worst.waits == [.seconds(12), .seconds(12), .seconds(4)])
        #expect(worst.total == .seconds(4 + 28))
    }

    /// A refresh rule at defaults logs out though nothing in the policy says so: lint says it.
    @Test func aHiddenLogoutIsAWarning() {
        let text = """
            policy: 1
            name: hidden
            refresh: { use: oauth2, with: { token-url: "https://auth.example.com/token", client-id: app } }
            rules: [{ name: auth, when: { status: [401], header: { WWW-Authenticate: "*invalid_token*" } }, then: refresh }]
            """
        #expect(findings(text).map(\.rule) == ["hidden-logout"])
        #expect(findings(text + "\nlogout: { cooldown: 20s }\n").isEmpty)
    }

    /// A code inside a later rule's range with another action is a conflict, as in a list.
    @Test func aCodeInsideALaterRangeConflicts() {
        let text = """
            policy: 1
            name: ranges
            classify: { code: body.status }
            logout: { cooldown: 20s }
            refresh: { use: oauth2, with: { token-url: "https://auth.example.com/token", client-id: app } }
            rules:
              - { name: expired, when: { code: [1401] }, then: refresh }
              - { name: revoked, when: { code: ["1400-1499"] }, then: logout }
            """
        #expect(
            findings(text).map(\.description) == [
                "test.yaml:8:37: error: code '1400-1499' overlaps '1401', which is in rule 'expired' (refresh) and rule 'revoked' (logout); the first match wins, so split the range around it: 1400, '1402-1499' [conflicting-codes]"
            ])
    }
}

/// A random source that always draws `unit`.
private struct FixedRandom: RandomSource {
    let unit: Double
    init(_ unit: Double) { self.unit = unit }
    func nextUnit() -> Double { unit }
    func nextBits() -> UInt64 { 0 }
}
