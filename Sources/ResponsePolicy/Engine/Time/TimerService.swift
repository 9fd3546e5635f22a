import Dispatch

/// Something ``TimerService`` can schedule: a node of its heap.
///
/// Why nodes and not closures: the engine arms an attempt timeout for every attempt and cancels
/// it almost always. With a closure per timer and lazy deletion, every attempt cost an
/// allocation and two dictionary operations, and cancelled entries stayed in the heap until their
/// deadline (ten seconds of traffic). A node knows its heap position, so cancelling removes it at
/// once and the heap only ever holds live timers; a request has one `RequestTimer` node (at most
/// one timer at a time: its attempt timeout, its backoff wake or the deadline of a wait).
///
/// Concurrency contract: the scheduling fields belong to the service's lock; subclasses guard
/// their own state. `fire(token:)` runs on the service's driver task, outside its lock.
package class TimerNode: @unchecked Sendable {
    // @unchecked: the fields below are only read or written under the owning service's lock.
    fileprivate(set) var heapIndex = -1
    fileprivate(set) var timerDeadline: Duration = .zero
    fileprivate(set) var timerOrder: UInt64 = 0
    fileprivate(set) var timerToken: UInt64 = 0

    /// The timer is due. `token` is the one it was scheduled with: a node rescheduled while its
    /// earlier firing was on its way can tell the stale call from the current one.
    func fire(token: UInt64) {}
}

/// A request's timer: its attempt timeout, its backoff's end, or the deadline of a wait. It
/// knows only the request's number; what firing does is ``EngineState/timerFired(insideLock:token:)``.
final class RequestTimer: TimerNode, @unchecked Sendable {
    // @unchecked: the inherited fields are the service's (under its lock); these are immutable.
    let engine: PolicyEngine
    let id: UInt64

    init(engine: PolicyEngine, id: UInt64) {
        self.engine = engine
        self.id = id
    }

    override func fire(token: UInt64) { engine.timerFired(id, token: token) }
}

/// A timer that runs a closure (for the rare timers: the refresh timeout).
final class ClosureTimer: TimerNode, @unchecked Sendable {
    private let action: @Sendable () -> Void
    init(_ action: @escaping @Sendable () -> Void) { self.action = action }
    override func fire(token: UInt64) { action() }

    #if DEBUG
        /// The service's count of closure timers alive (debug builds only, for the tests that
        /// check that no timer outlives what it bounds).
        var alive: Locked<Int>? {
            didSet { alive?.withLock { $0 += 1 } }
        }
        deinit { alive?.withLock { $0 -= 1 } }
    #endif
}

/// The engine's timers: attempt timeouts, backoff wake-ups and refresh timeouts, in one heap.
///
/// Why one heap and not a sleeping child task per attempt: a `Task.sleep` raced against the
/// transport costs two child tasks and a system timer per attempt (about 6 µs measured here,
/// most of the engine's overhead), and the sleeping timers hold memory until they would have
/// fired. Here scheduling is a heap insert under a lock and cancelling a heap removal.
///
/// Two drivers take due nodes off the heap and fire them:
/// - **Real time** (``SystemPolicyClock``): a Dispatch timer on a private serial queue. Dispatch
///   runs it on a thread of its own, outside Swift's cooperative pool, so an attempt timeout, a
///   backoff or a refresh timeout fires on time even while thousands of tasks keep the pool busy.
///   A driver task on the pool fired 300 ms timeouts more than a second late while a storm ran
///   (`EngineIntegrationTests.aStallingServerTimesOutEachAttempt` failed 1 run in 4 under TSan).
///   Firing only resumes continuations and cancels attempts: it never waits for the pool.
/// - **Any other clock** (a ``VirtualClock`` in tests and `policy simulate`): one driver task
///   that sleeps on the clock until the earliest deadline, on the engine's executor, so a
///   deterministic scheduler sees every wake-up. A cancelled timer does not wake the driver: it
///   finds the heap changed when its sleep ends.
///
/// Concurrency contract: `schedule` and `cancel` may be called from any thread; nodes fire
/// outside the lock, in deadline order (ties in scheduling order), and `fire` must be quick and
/// non-blocking (it may run on the Dispatch timer's thread). A timer cancelled before it is taken
/// off the heap never fires; one already taken may still fire (hence the token). Both drivers
/// hold the service weakly, so an engine that is released releases its timers and the driver ends.
package final class TimerService: Sendable {
    private struct State {
        var heap = TimerHeap()
        var nextOrder: UInt64 = 0
        // The driver task's state (clocks other than real time).
        var driverRunning = false
        /// The driver's current sleep, cancelled when an earlier deadline is scheduled.
        var sleep: (until: Duration, task: Task<Void, Never>)?
        var parked: CheckedContinuation<Void, Never>?
        // The Dispatch timer's state (real time).
        /// The deadline the Dispatch timer is set for; nil when it is idle.
        var armedAt: Duration?

        /// Takes every node due at `now` off the heap, in firing order, with its token.
        mutating func popDue(now: Duration) -> [(TimerNode, UInt64)] {
            var due: [(TimerNode, UInt64)] = []
            while let first = heap.first, first.timerDeadline <= now {
                heap.remove(first)
                due.append((first, first.timerToken))
            }
            return due
        }
    }

    private enum Step {
        case fire([(TimerNode, UInt64)])
        case sleep(Task<Void, Never>)
        case park
        case stop
    }

    /// The serial queue every real-time engine's timer fires on. Dispatch gives it threads of
    /// its own: it never waits for a slot in Swift's cooperative pool.
    private static let realTimeQueue = DispatchQueue(label: "ResponsePolicy.timers", qos: .userInitiated)

    private let clock: any PolicyClock
    private let executor: (any TaskExecutor)?
    private let state = Locked(State())
    /// Set for real-time clocks only.
    private let dispatchTimer: DispatchTimerBox?

    package init(clock: any PolicyClock, executor: (any TaskExecutor)?) {
        self.clock = clock
        self.executor = executor
        guard clock is any RealTimeClock else {
            dispatchTimer = nil
            return
        }
        let box = DispatchTimerBox(DispatchSource.makeTimerSource(queue: Self.realTimeQueue))
        dispatchTimer = box
        let weakSelf = WeakReference(self)
        box.timer.setEventHandler { weakSelf.value?.fireDue() }
        box.timer.activate()
    }

    deinit {
        dispatchTimer?.timer.cancel()
        let (parked, sleep) = state.withLock { state in
            let taken = (state.parked, state.sleep?.task)
            state.parked = nil
            state.sleep = nil
            return taken
        }
        sleep?.cancel()
        parked?.resume()
    }

    /// Timers scheduled and not yet fired or cancelled.
    package var count: Int { state.withLock { $0.heap.count } }

    /// The clock's time, which deadlines are given in.
    package var now: Duration { clock.now }

    /// Fires `node` at `deadline` with `token`, unless cancelled first. A node already scheduled
    /// is moved.
    func schedule(_ node: TimerNode, at deadline: Duration, token: UInt64 = 0) {
        if let dispatchTimer {
            // The usual case (the timer is set for an earlier deadline) touches only the heap.
            state.withLock { state in
                state.nextOrder += 1
                state.heap.schedule(node, deadline: deadline, order: state.nextOrder, token: token)
                if let armed = state.armedAt, armed <= deadline { return }
                arm(dispatchTimer, at: deadline, insideLock: &state)
            }
            return
        }
        // The usual case (the driver sleeps until an earlier deadline) touches nothing but the
        // heap: no continuation or task is copied out.
        var start = false
        var wake: CheckedContinuation<Void, Never>?
        var interrupt: Task<Void, Never>?
        state.withLock { state in
            state.nextOrder += 1
            state.heap.schedule(node, deadline: deadline, order: state.nextOrder, token: token)
            if !state.driverRunning {
                state.driverRunning = true
                start = true
            }
            if state.parked != nil { wake = state.parked.take() }
            if let until = state.sleep?.until, deadline < until { interrupt = state.sleep.take()?.task }
        }
        if let interrupt { interrupt.cancel() }
        if let wake { wake.resume() }
        if start { startDriver() }
    }

    /// Runs `action` at `deadline` unless the returned timer is cancelled first.
    @discardableResult
    package func schedule(at deadline: Duration, _ action: @escaping @Sendable () -> Void) -> TimerNode {
        let node = ClosureTimer(action)
        #if DEBUG
            node.alive = closureTimersAlive
        #endif
        schedule(node, at: deadline)
        return node
    }

    #if DEBUG
        /// Closure timers made by this service and not yet released, fired, cancelled or not
        /// (debug builds only): a timer kept after its work ended holds what its closure holds.
        let closureTimersAlive = Locked(0)
    #endif

    package func cancel(_ node: TimerNode) {
        state.withLock { $0.heap.remove(node) }
    }

    // MARK: - Real time: the Dispatch timer

    /// Sets the Dispatch timer for `deadline`. Called under the lock, so the last setting always
    /// matches the heap as the lock leaves it.
    private func arm(_ box: DispatchTimerBox, at deadline: Duration, insideLock state: inout State) {
        state.armedAt = deadline
        box.timer.schedule(
            deadline: .now() + Self.dispatchInterval(deadline - clock.now), repeating: .never,
            leeway: .milliseconds(1))
    }

    /// The Dispatch timer's handler: fires what is due and sets the timer for the next deadline.
    private func fireDue() {
        guard let dispatchTimer else { return }
        let now = clock.now
        let due = state.withLock { state in
            state.armedAt = nil
            let due = state.popDue(now: now)
            if let earliest = state.heap.first?.timerDeadline { arm(dispatchTimer, at: earliest, insideLock: &state) }
            return due
        }
        for (node, token) in due { node.fire(token: token) }
    }

    private static func dispatchInterval(_ duration: Duration) -> DispatchTimeInterval {
        let (seconds, attoseconds) = duration.components
        guard seconds >= 0 else { return .nanoseconds(0) }
        guard seconds < 1_000_000_000 else { return .seconds(1_000_000_000) }
        return .nanoseconds(Int(seconds) * 1_000_000_000 + Int(attoseconds / 1_000_000_000))
    }

    // MARK: - Other clocks: the driver task

    private func startDriver() {
        let weakSelf = WeakReference(self)
        Task(executorPreference: executor) {
            while true {
                switch weakSelf.value?.nextStep() ?? .stop {
                case .fire(let due): for (node, token) in due { node.fire(token: token) }
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
            let due = state.popDue(now: now)
            if !due.isEmpty { return .fire(due) }
            guard let earliest = state.heap.first?.timerDeadline else { return .park }
            let clock = self.clock
            let task = Task(executorPreference: executor) { _ = try? await clock.sleep(until: earliest) }
            state.sleep = (earliest, task)
            return .sleep(task)
        }
    }

    /// Parks the driver until a timer is scheduled; false when one already is (do not park).
    private func park(_ continuation: CheckedContinuation<Void, Never>) -> Bool {
        state.withLock { state in
            if !state.heap.isEmpty { return false }
            state.parked = continuation
            return true
        }
    }
}

/// A clock whose time flows by itself, so timers can wait for it on a thread outside the
/// cooperative pool. ``SystemPolicyClock`` is one; a ``VirtualClock`` is not (its time moves only
/// when a driver advances it, so its timers must sleep on the clock).
protocol RealTimeClock: PolicyClock {}

extension SystemPolicyClock: RealTimeClock {}

/// The Dispatch timer source, made shareable.
private final class DispatchTimerBox: @unchecked Sendable {
    // @unchecked: a Dispatch source is thread-safe (libdispatch serialises `schedule`, `cancel`
    // and handler delivery); the reference itself never changes.
    let timer: any DispatchSourceTimer
    init(_ timer: any DispatchSourceTimer) { self.timer = timer }
}

/// A binary min-heap of timer nodes by (deadline, order), each node knowing its index, so any
/// node is removed in O(log n).
///
/// Concurrency contract: a plain value; `TimerService` keeps it under its lock.
struct TimerHeap {
    private(set) var nodes: [TimerNode] = []

    var count: Int { nodes.count }
    var isEmpty: Bool { nodes.isEmpty }
    var first: TimerNode? { nodes.first }

    /// Inserts `node` with these keys, moving it when it is already in.
    mutating func schedule(_ node: TimerNode, deadline: Duration, order: UInt64, token: UInt64) {
        remove(node)
        node.timerDeadline = deadline
        node.timerOrder = order
        node.timerToken = token
        node.heapIndex = nodes.count
        nodes.append(node)
        siftUp(node.heapIndex)
    }

    /// Removes `node` if it is in.
    mutating func remove(_ node: TimerNode) {
        let index = node.heapIndex
        guard index >= 0, index < nodes.count, nodes[index] === node else { return }
        let last = nodes.count - 1
        if index != last {
            nodes.swapAt(index, last)
            nodes[index].heapIndex = index
        }
        nodes.removeLast()
        node.heapIndex = -1
        if index < nodes.count {
            // The last node, moved into the hole, may belong lower or higher.
            let moved = nodes[index]
            siftDown(index)
            if moved.heapIndex == index { siftUp(index) }
        }
    }

    private static func before(_ a: TimerNode, _ b: TimerNode) -> Bool {
        a.timerDeadline < b.timerDeadline || (a.timerDeadline == b.timerDeadline && a.timerOrder < b.timerOrder)
    }

    private mutating func siftUp(_ start: Int) {
        var child = start
        while child > 0 {
            let parent = (child - 1) / 2
            guard Self.before(nodes[child], nodes[parent]) else { break }
            swap(child, parent)
            child = parent
        }
    }

    private mutating func siftDown(_ start: Int) {
        var parent = start
        while true {
            let left = 2 * parent + 1
            let right = left + 1
            var smallest = parent
            if left < nodes.count, Self.before(nodes[left], nodes[smallest]) { smallest = left }
            if right < nodes.count, Self.before(nodes[right], nodes[smallest]) { smallest = right }
            if smallest == parent { return }
            swap(parent, smallest)
            parent = smallest
        }
    }

    private mutating func swap(_ i: Int, _ j: Int) {
        nodes.swapAt(i, j)
        nodes[i].heapIndex = i
        nodes[j].heapIndex = j
    }
}

/// A weak reference that can cross into a task.
final class WeakReference<T: AnyObject & Sendable>: Sendable {
    // @unchecked is not needed: a `weak let` to a Sendable class is itself safe to share.
    weak let value: T?
    init(_ value: T) { self.value = value }
}
