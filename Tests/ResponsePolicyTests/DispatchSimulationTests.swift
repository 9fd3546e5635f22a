import TestSupport
import Testing

@testable import ResponsePolicy

/// `dispatch: { max-in-flight-per-host: N }` and `refresh.hold-new-requests`, on the virtual
/// clock against the scripted token server.
struct DispatchSimulationTests {
    private static let policy = basePolicy + "\n  share-window: 0s\n  max-per-request: 2\n"

    private static func limited(_ limit: Int, hold: Bool = true) -> String {
        policy + "  hold-new-requests: \(hold)\ndispatch: { max-in-flight-per-host: \(limit) }\n"
    }

    @Test func aStormOnAnExpiredTokenThroughSixSlotsSendsAtMostTwelveStaleAttempts() async throws {
        let result = try await simulate(
            Self.limited(6),
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
        // Six go out with the dead token; the queue waits for the refresh and leaves signed
        // with the new one. (The goal is at most N + 12.)
        #expect(result.summary.attempts == 506)
        for event in result.events where event.kind == .outcome { #expect(event.code == "0") }
    }

    @Test func requestsBeyondTheLimitLeaveAsSlotsFreeInArrivalOrder() async throws {
        let result = try await simulate(
            Self.limited(2),
            """
            requests:
              - { id: r, repeat: 5, responses: [{ body: '{"status":0}' }] }
            """)
        #expect(result.timeline("r-1") == "send@0 response@0.05 outcome@0.05")
        #expect(result.timeline("r-2") == "send@0 response@0.05 outcome@0.05")
        #expect(result.timeline("r-3") == "queued@0 send@0.05 response@0.1 outcome@0.1")
        #expect(result.timeline("r-4") == "queued@0 send@0.05 response@0.1 outcome@0.1")
        #expect(result.timeline("r-5") == "queued@0 send@0.1 response@0.15 outcome@0.15")
    }

    @Test func requestsSentBeforeLeaveAheadOfThoseWaitingForTheirFirstAttempt() async throws {
        let result = try await simulate(
            Self.limited(2),
            """
            tokens:
              initial: expired
              rejected: { status: 200, body: '{"status":1401}' }
            requests:
              - { id: r, repeat: 5, responses: [{ status: 200, body: '{"status":0}' }] }
            refresh: [{ after: 100ms }]
            """)
        // r-1 and r-2 met the expired token; after the refresh they go out first, not behind
        // the three that never went out.
        #expect(
            result.timeline("r-1")
                == "send@0 response@0.05 refresh-start@0.05 refresh-end@0.15 send@0.15 response@0.2 outcome@0.2")
        #expect(result.timeline("r-2") == "send@0 response@0.05 send@0.15 response@0.2 outcome@0.2")
        #expect(result.timeline("r-3") == "queued@0 send@0.2 response@0.25 outcome@0.25")
        #expect(result.timeline("r-5") == "queued@0 send@0.25 response@0.3 outcome@0.3")
        #expect(result.summary.attempts == 7)
    }

    @Test func aRequestMadeDuringARefreshWaitsForItsToken() async throws {
        let script = """
            tokens:
              initial: expired
              rejected: { status: 200, body: '{"status":1401}' }
            requests:
              - { id: a, at: 0s, responses: [{ body: '{"status":0}' }] }
              - { id: b, at: 100ms, responses: [{ body: '{"status":0}' }] }
            refresh: [{ after: 200ms }]
            """
        let held = try await simulate(Self.policy, script)
        // The refresh runs from 0.05 to 0.25: b is held (an event says so), signed when it ends,
        // and goes out once.
        #expect(held.timeline("b") == "held@0.1 send@0.25 response@0.3 outcome@0.3")
        #expect(held.summary.attempts == 3)
        let sent = try await simulate(Self.policy + "  hold-new-requests: false\n", script)
        // Today's behaviour on request: b goes out with the stale token and is re-sent.
        #expect(sent.timeline("b").hasPrefix("send@0.1 response@0.15"))
        #expect(sent.summary.attempts == 4)
        #expect(sent.summary.refreshes == 1)
    }

    @Test func withoutHoldingTheQueueKeepsLeavingDuringARefresh() async throws {
        let result = try await simulate(
            Self.limited(6, hold: false),
            """
            tokens:
              initial: expired
              rejected: { status: 200, body: '{"status":1401}' }
            requests:
              - { id: s, repeat: 60, responses: [{ status: 200, body: '{"status":0}' }] }
            refresh: [{ after: 200ms }]
            """)
        #expect(result.summary.refreshes == 1)
        #expect(result.summary.delivered == 60)
        // Queued requests keep going out with the dead token while the refresh runs.
        #expect(result.summary.attempts > 66)
    }

    @Test func aLogoutEndsTheQueuedRequestsWhateverCancelInFlightSays() async throws {
        let result = try await simulate(
            Self.limited(1) + "logout: { cancel-in-flight: false, cooldown: 10s }\n",
            """
            requests:
              - { id: trigger, responses: [{ body: '{"status":202}' }] }
              - { id: q, repeat: 3, responses: [{ body: '{"status":0}' }] }
            """)
        #expect(result.summary.loggedOut == 4)
        #expect(result.summary.attempts == 1)
        #expect(result.outcome("q-3")?.result == .loggedOut)
    }

    /// The attempt timeout runs from the moment the attempt leaves the engine: a request queued
    /// for longer than `attempt-timeout` still gets all of it on the wire.
    @Test func aRequestQueuedLongerThanTheAttemptTimeoutGetsItsWholeTimeoutOnTheWire() async throws {
        let result = try await simulate(
            Self.limited(1) + "retry: { attempt-timeout: 300ms, deadline: 10s, max-retries: 0 }\n",
            """
            requests:
              - { id: q, repeat: 3, responses: [{ body: '{"status":0}', latency: 280ms }] }
              - { id: stuck, at: 10ms, responses: [{ body: '{"status":0}', latency: 5s }] }
            """)
        // q-3 waits 560 ms for the slot, nearly twice its attempt timeout, then gets 280 ms of
        // its 300 ms on the wire and is delivered.
        #expect(result.timeline("q-2") == "queued@0 send@0.28 response@0.56 outcome@0.56")
        #expect(result.timeline("q-3") == "queued@0 send@0.56 response@0.84 outcome@0.84")
        // One that gets no answer times out 300 ms after it went out, not after it was made.
        #expect(result.timeline("stuck") == "queued@0.01 send@0.84 response@1.14 outcome@1.14")
        #expect(result.events("stuck").first { $0.kind == .response }?.error == .timeout)
        #expect(result.summary.delivered == 3)
    }

    /// The same property on random schedules: however long a request waited for a slot, an
    /// attempt is never cut short before `attempt-timeout` has passed since its `send`.
    @Test(arguments: [1, 2, 3, 4, 5] as [UInt64])
    func noAttemptTimesOutBeforeItsTimeoutHasPassedSinceItsSend(_ seed: UInt64) async throws {
        var random = SeededGenerator(seed: seed)
        var lines: [String] = []
        for index in 0..<12 {
            let at = random.next() % 200
            // Never exactly the timeout: a response and the timer at one instant is a tie.
            let drawn = 50 + random.next() % 400
            let latency = drawn == 300 ? 301 : drawn
            lines.append(
                "  - { id: r\(index), at: \(at)ms, responses: [{ body: '{\"status\":0}', latency: \(latency)ms }] }")
        }
        let limit = Int(1 + random.next() % 3)
        let result = try await simulate(
            Self.limited(limit) + "retry: { attempt-timeout: 300ms, deadline: 1m, max-retries: 0 }\n",
            "requests:\n" + lines.joined(separator: "\n") + "\n")
        for index in 0..<12 {
            let events = result.events("r\(index)")
            guard let send = events.first(where: { $0.kind == .send }),
                let response = events.first(where: { $0.kind == .response })
            else {
                Issue.record("r\(index) was never sent: \(result.timeline("r\(index)"))")
                continue
            }
            let onWire = response.time - send.time
            if response.error == .timeout {
                #expect(onWire == .milliseconds(300), "r\(index): \(result.timeline("r\(index)"))")
            } else {
                #expect(onWire < .milliseconds(300), "r\(index): \(result.timeline("r\(index)"))")
            }
        }
    }

    @Test func theDispatchSectionIsChecked() throws {
        #expect(
            renderedErrors("policy: 1\nname: d\ndispatch: { max-in-flight-per-host: 0 }\n")
                == "test.yaml:3:37: error: 'max-in-flight-per-host' must be between 1 and 1000000, not 0 [invalid-value]"
        )
        #expect(
            renderedErrors("policy: 1\nname: d\ndispatch: { max-in-flight: 6 }\n").contains(
                "test.yaml:3:13: error: unknown key 'max-in-flight'"))
        #expect(
            renderedErrors("policy: 1\nname: d\nrefresh: { hold-new-requests: maybe }\n").hasPrefix(
                "test.yaml:3:31: error:"))
        #expect(
            renderedErrors("policy: 1\nname: d\ndispatch: { max-in-flight-per-host: many }\n")
                == "test.yaml:3:37: error: 'max-in-flight-per-host' must be a whole number, auto or unlimited, not 'many' [invalid-type]"
        )
        let policy = try validPolicy("policy: 1\nname: d\ndispatch: { max-in-flight-per-host: 6 }\n")
        #expect(policy.dispatch.maxInFlightPerHost == 6)
        #expect(policy.refresh.holdNewRequests)
        #expect(try validPolicy("policy: 1\nname: d\n").dispatch.maxInFlightPerHost == .auto)
        let unlimited = try validPolicy("policy: 1\nname: d\ndispatch: { max-in-flight-per-host: unlimited }\n")
        #expect(unlimited.dispatch.maxInFlightPerHost == .unlimited)
        let auto = try validPolicy("policy: 1\nname: d\ndispatch: { max-in-flight-per-host: auto }\n")
        #expect(auto.dispatch.maxInFlightPerHost == .auto)
        #expect(
            renderedErrors("policy: 1\nname: d\ndispatch: { max-in-flight-per-host: \"auto\" }\n")
                == "test.yaml:3:37: error: 'max-in-flight-per-host' must be a whole number, auto or unlimited, not 'auto' [invalid-type]"
        )
    }
}

/// No request waits past its deadline, whatever it waits for.
struct DeadlineWhileWaitingTests {
    @Test func aRequestQueuedForADispatchSlotFailsAtItsDeadline() async throws {
        let result = try await simulate(
            basePolicy + "\ndispatch: { max-in-flight-per-host: 1 }\nretry: { deadline: 100ms }\n"
                + "routes:\n  - match: { path: /slow }\n    retry: { deadline: 10s }\n",
            """
            requests:
              - { id: slow, path: /slow, responses: [{ body: '{"status":0}', latency: 250ms }] }
              - { id: queued, at: 10ms, responses: [{ body: '{"status":0}' }] }
            """)
        #expect(result.outcome("slow")?.result == .delivered)
        // Its slot would free at 0.25 s, past its deadline at 0.11 s: it never goes out.
        #expect(result.timeline("queued") == "queued@0.01 cancel@0.11 outcome@0.11")
        #expect(result.outcome("queued")?.result == .failed)
    }

    @Test func aRequestWaitingForARefreshFailsAtItsDeadlineAndTheRefreshGoesOn() async throws {
        let result = try await simulate(
            basePolicy + "\nretry: { deadline: 1s }\n",
            """
            requests:
              - { id: a, responses: [{ body: '{"status":1401}' }, { body: '{"status":0}' }] }
              - { id: late, at: 2s, responses: [{ body: '{"status":0}' }] }
            refresh: [{ after: 1500ms }]
            """)
        #expect(result.timeline("a") == "send@0 response@0.05 refresh-start@0.05 cancel@1 outcome@1 refresh-end@1.55")
        #expect(result.outcome("a")?.result == .failed)
        // The refresh it started went on, for the requests after it.
        #expect(result.timeline("late") == "send@2 response@2.05 outcome@2.05")
        #expect(result.summary.refreshes == 1)
    }

    @Test func aRequestHeldDuringARefreshFailsAtItsDeadline() async throws {
        let result = try await simulate(
            basePolicy + "\nretry: { deadline: 500ms }\n",
            """
            requests:
              - { id: a, responses: [{ body: '{"status":1401}' }, { body: '{"status":0}' }] }
              - { id: held, at: 100ms, responses: [{ body: '{"status":0}' }] }
            refresh: [{ after: 1s }]
            """)
        #expect(result.timeline("held") == "held@0.1 cancel@0.6 outcome@0.6")
        #expect(result.outcome("held")?.result == .failed)
    }
}
