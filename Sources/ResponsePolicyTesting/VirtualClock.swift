import Foundation
import ResponsePolicy

/// A `PolicyClock` whose time only moves when a driver calls `advance(to:)`.
///
/// Used by tests and `policy simulate` (through `SimulationScheduler`) so that backoffs, cooldowns and token
/// expiry are exercised without real sleeping and with the same result on every run.
///
/// ## Time
/// ``now`` starts at `.zero` and never goes backwards. ``date`` is the fixed epoch
/// `2026-01-01T00:00:00Z` (`Date(timeIntervalSince1970: 1_767_225_600)`) plus ``now``.
///
/// ## Concurrency contract
/// - All members may be called from any thread or task; the state is protected by a `Locked` (pthread) lock, and no lock is
///   held while a continuation is resumed.
/// - ``sleep(until:)`` returns at once if `deadline <= now` (after a cancellation check, like `Task.sleep`);
///   otherwise it registers a timer and suspends until a driver's `advance(to:)` reaches the deadline.
/// - Cancellation: a sleeping task that is cancelled throws `CancellationError` promptly, at the virtual time of
///   the cancellation; the clock does not move. Cancellation that races with timer registration is handled:
///   the task's cancelled flag is checked under the same lock the cancellation handler takes.
/// - Ordering: timers fire in (deadline, registration) order. `advance(to:)` resumes the continuations in
///   that order, so on a FIFO executor such as `SimulationScheduler` the woken tasks also *run* in that order.
/// - The driver API (`advance(to:)`, `nextDeadline`, `pendingTimers`) is meant for one driver at a time;
///   concurrent advances are memory-safe but their interleaving is, naturally, not deterministic.
public final class VirtualClock: PolicyClock {
    /// The wall-clock instant that corresponds to `now == .zero`: 2026-01-01T00:00:00Z.
    public static let epoch = Date(timeIntervalSince1970: 1_767_225_600)

    private struct SleepTimer {
        let deadline: Duration
        let sequence: UInt64
        let continuation: CheckedContinuation<Void, any Error>
    }

    private struct State {
        var now: Duration = .zero
        var nextSequence: UInt64 = 0
        /// Pending timers by sequence number; the heap below orders them.
        var timers: [UInt64: SleepTimer] = [:]
        /// (deadline, sequence) of pending timers; may contain stale entries of cancelled timers (lazy delete).
        var heap = TimerHeap()

        /// Drops stale heap entries and returns the earliest live deadline, if any.
        mutating func earliestDeadline() -> Duration? {
            while let top = heap.peek {
                if timers[top.sequence] != nil { return top.deadline }
                _ = heap.pop()
            }
            return nil
        }
    }

    private let state = Locked(State())

    /// Creates a clock at virtual time `.zero` with no timers.
    public init() {}

    /// Virtual time elapsed since the clock was created.
    public var now: Duration {
        state.withLock { $0.now }
    }

    /// ``epoch`` + ``now``.
    public var date: Date {
        let elapsed = now.components
        let seconds = Double(elapsed.seconds) + Double(elapsed.attoseconds) * 1e-18
        return Self.epoch.addingTimeInterval(seconds)
    }

    /// Suspends the calling task until virtual time reaches `deadline`.
    ///
    /// Returns immediately if `deadline` is not in the future (throwing `CancellationError` first if the task is
    /// already cancelled, as `Task.sleep` does). Throws `CancellationError` promptly, without advancing time,
    /// when the task is cancelled while sleeping.
    public func sleep(until deadline: Duration) async throws {
        let sequence: UInt64? = state.withLock { state in
            guard deadline > state.now else { return nil }
            defer { state.nextSequence += 1 }
            return state.nextSequence
        }
        guard let sequence else {
            try Task.checkCancellation()
            return
        }
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                enum Outcome { case registered, fired, cancelled }
                let outcome: Outcome = state.withLock { state in
                    // The task's cancelled flag is set before cancellation handlers run, and the handler takes this
                    // lock; so either the handler already ran (and found nothing) and we see the flag here, or we
                    // register first and the handler finds the timer.
                    if Task.isCancelled { return .cancelled }
                    // Time may have moved between taking the sequence number and getting here.
                    if deadline <= state.now { return .fired }
                    state.timers[sequence] = SleepTimer(
                        deadline: deadline, sequence: sequence, continuation: continuation)
                    state.heap.push(TimerHeap.Entry(deadline: deadline, sequence: sequence))
                    return .registered
                }
                switch outcome {
                case .registered: break
                case .fired: continuation.resume()
                case .cancelled: continuation.resume(throwing: CancellationError())
                }
            }
        } onCancel: {
            // Runs synchronously on whichever thread calls `cancel()`; the resumed task is enqueued on its executor.
            let timer = state.withLock { $0.timers.removeValue(forKey: sequence) }
            timer?.continuation.resume(throwing: CancellationError())
        }
    }

    // MARK: - Driver API

    /// The earliest deadline among pending timers, or `nil` if no task is sleeping.
    package var nextDeadline: Duration? {
        state.withLock { $0.earliestDeadline() }
    }

    /// The number of tasks currently sleeping on this clock.
    package var pendingTimers: Int {
        state.withLock { $0.timers.count }
    }

    /// Sets ``now`` to `time` and resumes every timer whose deadline is `<= time`, in (deadline, registration)
    /// order. Woken tasks observe ``now == time``; to have each sleeper wake at exactly its own deadline, advance
    /// to `nextDeadline` repeatedly (as `SimulationScheduler` does).
    ///
    /// Resuming only enqueues the woken tasks on their executors; none of their code runs inside this call.
    /// - Precondition: `time >= now` (virtual time is monotonic).
    package func advance(to time: Duration) {
        let due: [SleepTimer] = state.withLock { state in
            precondition(time >= state.now, "VirtualClock cannot go backwards (now \(state.now), asked \(time))")
            state.now = time
            var due: [SleepTimer] = []
            while let top = state.heap.peek, top.deadline <= time {
                _ = state.heap.pop()
                if let timer = state.timers.removeValue(forKey: top.sequence) {
                    due.append(timer)
                }
            }
            return due
        }
        for timer in due {
            timer.continuation.resume()
        }
    }

    /// A binary min-heap of (deadline, sequence) pairs; ties on deadline are broken by sequence (registration order).
    private struct TimerHeap {
        struct Entry {
            let deadline: Duration
            let sequence: UInt64

            func precedes(_ other: Entry) -> Bool {
                deadline != other.deadline ? deadline < other.deadline : sequence < other.sequence
            }
        }

        private var storage: [Entry] = []

        var peek: Entry? { storage.first }

        mutating func push(_ entry: Entry) {
            storage.append(entry)
            var child = storage.count - 1
            while child > 0 {
                let parent = (child - 1) / 2
                guard storage[child].precedes(storage[parent]) else { break }
                storage.swapAt(child, parent)
                child = parent
            }
        }

        mutating func pop() -> Entry? {
            guard !storage.isEmpty else { return nil }
            storage.swapAt(0, storage.count - 1)
            let top = storage.removeLast()
            var parent = 0
            while true {
                let left = 2 * parent + 1
                let right = left + 1
                var smallest = parent
                if left < storage.count, storage[left].precedes(storage[smallest]) { smallest = left }
                if right < storage.count, storage[right].precedes(storage[smallest]) { smallest = right }
                if smallest == parent { break }
                storage.swapAt(parent, smallest)
                parent = smallest
            }
            return top
        }
    }
}
