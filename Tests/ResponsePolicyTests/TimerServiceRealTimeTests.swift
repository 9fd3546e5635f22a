import Foundation
import TestGate
import Testing

@testable import ResponsePolicy

/// The real-time timer driver fires on time while Swift's cooperative pool is saturated.
///
/// An attempt timeout, a backoff and a refresh timeout must not wait for a free slot in the pool:
/// the engine's timers fire from a Dispatch timer on a thread of their own. Before, a driver task
/// on the pool fired a 300 ms attempt timeout more than a second late while a storm ran, and the
/// engine delivered the answer of a server that should have been timed out.
@Suite(.loadGate(.realTime))
struct TimerServiceRealTimeTests {
    /// Spins the CPU without suspending until `end`, holding a cooperative thread the whole time.
    private static func spin(until end: ContinuousClock.Instant) -> Int {
        var counter = 0
        while ContinuousClock.now < end { counter &+= 1 }
        return counter
    }

    /// Bounds how late a timer fires (50 ms): another build beside `swift test` can delay any
    /// thread by more, so it runs when asked (`.ci/run`'s real-time step).
    @Test(.measuresRealTime(filter: "TimerServiceRealTimeTests/aTimerFiresWithin50ms"))
    func aTimerFiresWithin50msWhileThePoolIsSaturatedByCPUBoundTasks() async throws {
        let clock = SystemPolicyClock()
        let timers = TimerService(clock: clock, executor: nil)
        let fired = Locked<Duration?>(nil)
        let spinEnd = ContinuousClock.now + .milliseconds(700)
        // Twice as many CPU-bound tasks as the pool has threads: every thread is busy until spinEnd.
        let spinners = (0..<(2 * ProcessInfo.processInfo.activeProcessorCount)).map { _ in
            Task.detached { Self.spin(until: spinEnd) }
        }
        // A task queued behind the spinners shows the pool really was saturated.
        let probe = Task.detached { clock.now }
        let deadline = clock.now + .milliseconds(150)
        timers.schedule(at: deadline) { fired.withLock { $0 = clock.now } }

        for spinner in spinners { _ = await spinner.value }
        let probeRan = await probe.value
        let firedAt = try #require(fired.withLock { $0 }, "the timer never fired")

        #expect(firedAt >= deadline)
        #expect(firedAt - deadline < .milliseconds(50), "fired \(firedAt - deadline) late")
        // Had the timer needed a pool thread, it could not have fired before the probe ran.
        #expect(probeRan > firedAt, "the pool was not saturated; the test proves nothing")
        #expect(timers.count == 0)
    }

    @Test func timersFireInDeadlineOrderAndACancelledOneNeverFires() async throws {
        let clock = SystemPolicyClock()
        let timers = TimerService(clock: clock, executor: nil)
        let order = Locked<[Int]>([])
        let start = clock.now
        // Scheduled out of order, with an earlier one arriving after a later one is set.
        timers.schedule(at: start + .milliseconds(60)) { order.withLock { $0.append(3) } }
        let cancelled = timers.schedule(at: start + .milliseconds(20)) { order.withLock { $0.append(99) } }
        timers.schedule(at: start + .milliseconds(40)) { order.withLock { $0.append(2) } }
        timers.schedule(at: start + .milliseconds(10)) { order.withLock { $0.append(1) } }
        timers.cancel(cancelled)
        // A bounded wait for the events, not a timing assertion.
        let giveUp = ContinuousClock.now + .seconds(10)
        while order.withLock({ $0.count }) < 3, ContinuousClock.now < giveUp {
            try await Task.sleep(for: .milliseconds(5))
        }
        try await Task.sleep(for: .milliseconds(30))
        #expect(order.withLock { $0 } == [1, 2, 3])
        #expect(timers.count == 0)
    }
}
