import Foundation
import Testing

@testable import ResponsePolicy

/// How often a request takes the engine's lock, per attempt (debug builds count acquisitions):
/// the figure issue 18 asks to report and to keep from growing.
struct EngineLockCountTests {
    static func policy(budget: String) -> String {
        """
        policy: 1
        name: locks
        retry: { backoff: constant, initial: 100ms, budget: \(budget) }
        rules: [{ name: busy, when: { status: [503] }, then: retry }]
        """
    }

    /// Lock acquisitions of one request whose first `failures` attempts meet 503.
    static func acquisitions(failures: Int, budget: String) async throws -> Int {
        let transport = RecordingTransport { _, count in count <= failures ? response("", status: 503) : response("ok")
        }
        let sim = try SimulatedEngine(Self.policy(budget: budget), transport: transport)
        let before = sim.engine.state.acquisitions
        _ = try await sim.run { engine in try await engine.send(HTTPRequest(url: testURL)) }
        // Not the request's: the snapshot `run` takes to check for leftovers, and this read.
        return sim.engine.state.acquisitions - before - 2
    }

    /// Before issue 18's changes: 5 for a one-attempt request; 7 per retry attempt (8 with a
    /// budget): budget, backoff start, park, timer, wake, gate, attempt start, attempt end. The
    /// budget and the backoff became one transition, and the wake runs the gate: 6. Now the gate
    /// begins the attempt (one transition at the top of the loop) and the attempt's end removes
    /// the slot when it decides the outcome, or starts the backoff a retry rule decides: 3 for a
    /// one-attempt request (admit, gate, attempt end), 4 per retry attempt (attempt end with the
    /// backoff's start, park, timer, wake with the gate).
    @Test(arguments: ["none", "{ ratio: 0.2, min: 100 }"])
    func lockAcquisitionsPerAttempt(budget: String) async throws {
        let one = try await Self.acquisitions(failures: 0, budget: budget)
        let three = try await Self.acquisitions(failures: 2, budget: budget)
        let perRetry = (three - one) / 2
        print(
            "engine lock acquisitions (budget \(budget)): a one-attempt request \(one), each retry attempt \(perRetry)")
        #expect(one <= 3, "a request delivered at the first attempt took the lock \(one) times")
        #expect(perRetry <= 4, "each retry took the lock \(perRetry) times")
    }

    /// Lock acquisitions of one request refused with a refresh trigger, refreshed (the refresh
    /// task's own acquisitions included: its start in the background, its end) and re-sent, less
    /// those of a one-attempt request: what a refresh-trigger re-send costs.
    static func refreshAcquisitions(triggers: Int) async throws -> Int {
        let transport = RecordingTransport { _, count in
            count <= triggers ? response(#"{"status":1401}"#) : response(#"{"status":0}"#)
        }
        let sim = try SimulatedEngine(
            basePolicy + "\n  share-window: 0s\n  max-per-request: 2\n", transport: transport,
            refresh: CountingRefresh())
        let before = sim.engine.state.acquisitions
        _ = try await sim.run { engine in
            let delivered = try await engine.send(HTTPRequest(url: testURL))
            // The refresh task's last bookkeeping, counted in full (the same look when there is none).
            await engine.waitForBackgroundWork()
            return delivered
        }
        return sim.engine.state.acquisitions - before - 2
    }

    /// Before the request's decisions became transitions (main at ff57621): 12 — the attempt's
    /// end, the generation read, the refresh decision, the refresh task's start (2) and end, its
    /// background bookkeeping, the park, the wake, the gate, the re-sent attempt's end, the
    /// accepted generation noted. Now 9: the trigger decides in the attempt's end, the refresh
    /// starts or is joined in it, and the wake runs the gate.
    @Test func lockAcquisitionsPerRefreshTriggerResend() async throws {
        let none = try await Self.refreshAcquisitions(triggers: 0)
        let one = try await Self.refreshAcquisitions(triggers: 1)
        print("engine lock acquisitions: a one-attempt request \(none), a refresh-trigger re-send \(one - none)")
        #expect(one - none <= 9, "a refresh-trigger re-send took the lock \(one - none) times")
    }

    /// A request whose retry rule is out of retries follows its `on-exhausted` edge in the
    /// transition that ends its attempt, which removes its slot too: admit, gate, the attempt's
    /// end with the edge (3; on main 4, the outcome's slot removal a lock of its own, and 6 when
    /// the edge logs out: the logout and the cooldown's read took one each).
    @Test func lockAcquisitionsWhenRetriesAreExhausted() async throws {
        let transport = RecordingTransport { _, _ in response("", status: 503) }
        let sim = try SimulatedEngine(
            """
            policy: 1
            name: locks
            retry: { max-retries: 0, on-exhausted: fail }
            rules: [{ name: busy, when: { status: [503] }, then: retry }]
            """, transport: transport)
        let before = sim.engine.state.acquisitions
        let failed = try await sim.run { engine in
            do {
                _ = try await engine.send(HTTPRequest(url: testURL))
                return false
            } catch {
                return true
            }
        }
        let taken = sim.engine.state.acquisitions - before - 2
        print("engine lock acquisitions: a request whose retries are exhausted \(taken)")
        #expect(failed)
        #expect(taken <= 3, "a request whose retries are exhausted took the lock \(taken) times")
    }
}
