/// The engine's timers: attempt timeouts and backoff wake-ups, all driven by one task.
///
/// Why one driver and not a sleeping child task per attempt: a `Task.sleep` raced against the
/// transport costs two child tasks and a system timer per attempt (about 6 µs measured here,
/// most of the engine's overhead), and the sleeping timers hold memory until they would have
/// fired. Here scheduling is a heap insert under a lock, cancelling is a dictionary removal, and
/// one driver task sleeps on the clock until the earliest deadline.
///
/// Concurrency contract: `schedule` and `cancel` may be called from any thread; actions run on
/// the driver task, outside the lock, in deadline order (ties in scheduling order), and must be
/// quick and non-blocking. A cancelled timer's action never runs; an action that has started is
/// not affected by `cancel`. The driver holds the service weakly, so an engine that is released
/// releases its timers and the driver ends.
final class TimerService: Sendable {
    private struct Entry: Comparable {
        let deadline: Duration
        let id: UInt64
        static func < (a: Entry, b: Entry) -> Bool { (a.deadline, a.id) < (b.deadline, b.id) }
    }

    private struct State {
        /// A binary min-heap; entries whose action was cancelled are dropped when they surface.
        var heap: [Entry] = []
        var actions: [UInt64: @Sendable () -> Void] = [:]
        var nextID: UInt64 = 0
        var driverRunning = false
        /// The driver's current sleep, cancelled when an earlier deadline is scheduled.
        var sleep: (until: Duration, task: Task<Void, Never>)?
        var parked: CheckedContinuation<Void, Never>?
    }

    private enum Step {
        case fire([@Sendable () -> Void])
        case sleep(Task<Void, Never>)
        case park
        case stop
    }

    private let clock: any PolicyClock
    private let executor: (any TaskExecutor)?
    private let state = Locked(State())

    init(clock: any PolicyClock, executor: (any TaskExecutor)?) {
        self.clock = clock
        self.executor = executor
    }

    deinit {
        let (parked, sleep) = state.withLock { state in
            let taken = (state.parked, state.sleep?.task)
            state.parked = nil
            state.sleep = nil
            return taken
        }
        sleep?.cancel()
        parked?.resume()
    }

    /// Runs `action` at `deadline` unless cancelled first. Returns the timer's id.
    @discardableResult
    func schedule(at deadline: Duration, _ action: @escaping @Sendable () -> Void) -> UInt64 {
        let (id, start, wake, interrupt) = state.withLock {
            state -> (UInt64, Bool, CheckedContinuation<Void, Never>?, Task<Void, Never>?) in
            state.nextID += 1
            let id = state.nextID
            state.actions[id] = action
            Self.push(Entry(deadline: deadline, id: id), into: &state.heap)
            let start = !state.driverRunning
            state.driverRunning = true
            let wake = state.parked
            state.parked = nil
            var interrupt: Task<Void, Never>?
            if let sleep = state.sleep, deadline < sleep.until {
                interrupt = sleep.task
                state.sleep = nil
            }
            return (id, start, wake, interrupt)
        }
        interrupt?.cancel()
        wake?.resume()
        if start { startDriver() }
        return id
    }

    func cancel(_ id: UInt64) {
        _ = state.withLock { $0.actions.removeValue(forKey: id) }
    }

    private func startDriver() {
        let weakSelf = WeakReference(self)
        Task(executorPreference: executor) {
            while true {
                switch weakSelf.value?.nextStep() ?? .stop {
                case .fire(let actions): for action in actions { action() }
                case .sleep(let task): await task.value
                case .park:
                    await withCheckedContinuation { continuation in
                        if weakSelf.value?.park(continuation) != true { continuation.resume() }
                    }
                case .stop: return
                }
            }
        }
    }

    /// What the driver does next: fire what is due, sleep until the earliest deadline, or park.
    private func nextStep() -> Step {
        let now = clock.now
        return state.withLock { state in
            var due: [@Sendable () -> Void] = []
            while let first = state.heap.first {
                guard let action = state.actions[first.id] else {
                    Self.popMin(&state.heap)
                    continue
                }
                guard first.deadline <= now else { break }
                Self.popMin(&state.heap)
                state.actions.removeValue(forKey: first.id)
                due.append(action)
            }
            if !due.isEmpty { return .fire(due) }
            guard let earliest = state.heap.first else { return .park }
            let clock = self.clock
            let task = Task(executorPreference: executor) { _ = try? await clock.sleep(until: earliest.deadline) }
            state.sleep = (earliest.deadline, task)
            return .sleep(task)
        }
    }

    /// Parks the driver until a timer is scheduled; false when one already is (do not park).
    private func park(_ continuation: CheckedContinuation<Void, Never>) -> Bool {
        state.withLock { state in
            if !state.actions.isEmpty { return false }
            state.parked = continuation
            return true
        }
    }

    private static func push(_ entry: Entry, into heap: inout [Entry]) {
        heap.append(entry)
        var child = heap.count - 1
        while child > 0 {
            let parent = (child - 1) / 2
            guard heap[child] < heap[parent] else { break }
            heap.swapAt(child, parent)
            child = parent
        }
    }

    private static func popMin(_ heap: inout [Entry]) {
        guard !heap.isEmpty else { return }
        heap.swapAt(0, heap.count - 1)
        heap.removeLast()
        var parent = 0
        while true {
            let left = 2 * parent + 1
            let right = left + 1
            var smallest = parent
            if left < heap.count, heap[left] < heap[smallest] { smallest = left }
            if right < heap.count, heap[right] < heap[smallest] { smallest = right }
            if smallest == parent { return }
            heap.swapAt(parent, smallest)
            parent = smallest
        }
    }
}

/// A weak reference that can cross into a task.
final class WeakReference<T: AnyObject & Sendable>: Sendable {
    // @unchecked is not needed: a `weak let` to a Sendable class is itself safe to share.
    weak let value: T?
    init(_ value: T) { self.value = value }
}
