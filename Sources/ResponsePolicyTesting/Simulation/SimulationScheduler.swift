import Dispatch
import Foundation
import ResponsePolicy

/// Why a simulation stopped without a result.
package enum SimulationError: Error, Equatable {
    /// Nothing could make progress: no job was queued, no timer was pending and the body had not finished
    /// (for example, it awaits a continuation that nobody will resume). `virtualTime` is the clock's time then.
    case deadlock(virtualTime: Duration)
}

/// A deterministic, single-threaded driver for code that sleeps on a ``VirtualClock``.
///
/// The scheduler is an SE-0417 `TaskExecutor` with a FIFO job queue. ``run(_:)`` starts the body as a task that
/// prefers this executor and then, on the calling thread: runs queued jobs until the queue is empty; if the body
/// has not finished, advances the clock to its next deadline (which resumes the due sleepers, in (deadline,
/// registration) order, and so enqueues their jobs) and repeats. Every job runs on that one thread, one at a
/// time, in enqueue order, so for a given input the interleaving — and the output — is the same on every run,
/// and no real time passes while virtual time jumps from deadline to deadline.
///
/// ## What runs on this executor (verified experimentally on Swift 6.3.1, Linux x86_64)
/// Code runs here only if its task has this executor as its *task executor preference* (SE-0417). Checked by
/// recording, after each suspension point, whether the code runs on the driver thread:
///
/// Runs here (inside a task that prefers this scheduler):
/// - the body of ``run(_:)``, and its code after every `await`;
/// - child tasks of `withTaskGroup`, `withThrowingTaskGroup`, `withDiscardingTaskGroup` (`group.addTask { }`) and
///   `async let`: they inherit the preference (unless given `addTask(executorPreference:)` explicitly);
/// - resumption after `with{Checked,Unsafe}{Throwing}Continuation`, whoever resumes it and from whatever thread
///   (another simulated task, ``VirtualClock/advance(to:)``, a `DispatchQueue.global()` thread): the resumed task
///   is enqueued here; so is `for await` over an `AsyncStream` fed by a simulated task;
/// - `Task.yield()`: the task is re-enqueued at the back of the FIFO;
/// - methods of a *default* actor (no custom executor) awaited from such a task — also when the actor is contended,
///   when it is resumed on the actor after a sleep, and for actor-to-actor calls and nonisolated async functions
///   called from the actor: a default actor runs on the task executor preferred by the task it runs for;
/// - `Task(executorPreference: scheduler.executor) { }` and `Task.detached(executorPreference:) { }`;
/// - the synchronous prefix of `Task.immediate { }` (it runs inline in the caller's job).
///
/// Does NOT run here:
/// - `Task { }` (unstructured): it does not inherit the preference, even when created inside a
///   `Task(executorPreference:)`; it runs on the global concurrent pool. Created inside a default actor method it
///   may *start* here (the actor is handed over by the driver thread), but after its first suspension it resumes
///   on the global pool. Likewise `Task.detached { }`, and `Task.immediate { }` after its first suspension;
/// - `@MainActor` code and actors with custom executors: they run on their own executor (the main thread must be
///   serviced, and must not be the thread blocked in ``run(_:)``); the task comes back here afterwards;
/// - `withTaskCancellationHandler`'s `onCancel`: it runs synchronously on the thread that calls `cancel()` — the
///   driver thread if a simulated job cancels, a foreign thread otherwise — and is not a job; the cancelled task's
///   resumption is then enqueued here;
/// - `Task.sleep` / `ContinuousClock.sleep`: these sleep in REAL time on a runtime timer and then resume here.
///
/// So the engine must create every unstructured task it owns with `Task(executorPreference:)` (the executor
/// injected next to the clock: ``executor`` in simulation, `globalConcurrentExecutor` in production), must not
/// rely on `@MainActor`/custom executors, and must sleep only through ``PolicyClock``. A task retains its
/// preferred executor: a task left suspended after ``run(_:)`` returns keeps the scheduler alive (no dangling
/// executor, but a leak if it never completes).
///
/// ## Concurrency contract
/// - ``run(_:)`` blocks the calling thread. Call it from a plain thread (a test's `Thread`, the CLI's main
///   thread), never from a Swift concurrency pool thread — blocking a cooperative thread can starve the pool
///   (there are only 2 on a 2-core machine). From async code use ``runDetached(_:)``.
/// - ``run(_:)`` is not reentrant: calling it from inside a simulated job, or while another `run` of the same
///   scheduler is in progress on another thread, is a precondition failure. Sequential runs are fine.
/// - ``enqueue(_:)`` may be called from any thread (the queue is behind a `Locked` (pthread) lock); a job enqueued from a foreign
///   thread is run by the driver like any other. Determinism is only guaranteed while all work runs on this
///   executor: a job that arrives from outside races with the driver's decision to advance the clock.
/// - Quiescence: when the queue is empty, no timer is pending and the body has not finished, the driver blocks
///   (no spinning) for at most `externalWorkGracePeriod` waiting for a job from another thread, and reports
///   ``SimulationError/deadlock(virtualTime:)`` if none arrives. The grace period is not what makes simulations
///   correct — fully simulated code never needs it (pass `.zero` for strict, immediate deadlock detection); it
///   only keeps code that leaves the executor (e.g. `Task.detached`) from being reported as deadlocked.
/// - Cancellation: on deadlock the body's task is cancelled and the queue drained before throwing (tasks stuck on
///   continuations that ignore cancellation stay suspended and are leaked). ``runDetached(_:)`` forwards
///   cancellation of the awaiting task to the body's task.
/// - ``run(_:)`` returns as soon as the body has finished and the queue is empty; tasks the body left behind
///   (still sleeping, or waiting) are not driven further, and remaining timers are not fired.
package final class SimulationScheduler: TaskExecutor {
    // Checked Sendable: every stored property is an immutable reference to a Sendable value.

    private struct State {
        var queue: [UnownedJob] = []
        /// The driver is blocked on `wakeUp` waiting for a job from another thread.
        var driverWaiting = false
        /// The thread currently inside `run`, if any.
        var driverThread: ObjectIdentifier?
        var jobsRun = 0
    }

    /// The clock the driver advances.
    package let clock: VirtualClock
    /// How long the driver waits, at quiescence, for a job enqueued from another thread before reporting a deadlock.
    package let externalWorkGracePeriod: Duration
    private let state = Locked(State())
    private let wakeUp = DispatchSemaphore(value: 0)

    /// Creates a scheduler driving `clock`.
    /// - Parameter externalWorkGracePeriod: at quiescence, how long to wait (blocked, in real time) for a job from
    ///   a thread outside the simulation before declaring a deadlock. `.zero` makes deadlock detection immediate.
    package init(clock: VirtualClock, externalWorkGracePeriod: Duration = .milliseconds(50)) {
        self.clock = clock
        self.externalWorkGracePeriod = max(externalWorkGracePeriod, .zero)
    }

    /// This scheduler as an executor preference, for tasks the engine spawns itself:
    /// `Task(executorPreference: scheduler.executor) { ... }`.
    package var executor: any TaskExecutor { self }

    /// The number of jobs run so far, across runs (diagnostics).
    package var jobsRun: Int {
        state.withLock { $0.jobsRun }
    }

    /// Whether the caller is running on the thread currently driving this scheduler, i.e. inside a simulated job.
    /// Callable from any context.
    package var isOnDriverThread: Bool {
        let current = ObjectIdentifier(Thread.current)
        return state.withLock { $0.driverThread == current }
    }

    // MARK: - TaskExecutor

    /// Appends `job` to the FIFO queue. Thread-safe; never runs the job inline.
    package func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        let wake = state.withLock { state in
            state.queue.append(job)
            guard state.driverWaiting else { return false }
            state.driverWaiting = false
            return true
        }
        if wake {
            wakeUp.signal()
        }
    }

    // MARK: - Driving

    /// Runs `body` to completion in virtual time on the calling thread and returns its result (or rethrows its
    /// error). See the type's documentation for the algorithm and the concurrency contract.
    /// - Throws: `body`'s error, or ``SimulationError/deadlock(virtualTime:)``.
    package func run<T: Sendable>(_ body: @escaping @Sendable () async throws -> T) throws -> T {
        try run(body, cancellation: RunCancellation())
    }

    /// Runs ``run(_:)`` on a dedicated thread and awaits its result, so that async callers (Swift Testing tests)
    /// never block a cooperative pool thread. Cancelling the awaiting task cancels the body's task.
    package func runDetached<T: Sendable>(_ body: @escaping @Sendable () async throws -> T) async throws -> T {
        let cancellation = RunCancellation()
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<T, any Error>) in
                let thread = Thread {
                    continuation.resume(with: Result { try self.run(body, cancellation: cancellation) })
                }
                thread.name = "SimulationScheduler"
                thread.start()
            }
        } onCancel: {
            cancellation.cancel()
        }
    }

    private func run<T: Sendable>(
        _ body: @escaping @Sendable () async throws -> T,
        cancellation: RunCancellation
    ) throws -> T {
        let thread = ObjectIdentifier(Thread.current)
        state.withLock { state in
            precondition(state.driverThread == nil, "SimulationScheduler.run is not reentrant")
            state.driverThread = thread
        }
        defer { state.withLock { $0.driverThread = nil } }

        let outcome = Outcome<T>()
        // Created from a plain thread: the task's first job is enqueued here, nothing runs until `drain()`.
        let root = Task(executorPreference: self) {
            do {
                outcome.set(.success(try await body()))
            } catch {
                outcome.set(.failure(error))
            }
        }
        cancellation.attach(root)

        while true {
            drain()
            if let result = outcome.take() {
                return try result.get()
            }
            if let deadline = clock.nextDeadline {
                clock.advance(to: deadline)
                continue
            }
            if waitForExternalJob() {
                continue
            }
            root.cancel()
            drain()
            throw SimulationError.deadlock(virtualTime: clock.now)
        }
    }

    /// Runs queued jobs, in FIFO order, until the queue is empty (including jobs enqueued meanwhile).
    private func drain() {
        let executor = asUnownedTaskExecutor()
        var batch: [UnownedJob] = []
        while true {
            state.withLock { swap(&batch, &$0.queue) }
            if batch.isEmpty {
                return
            }
            for job in batch {
                job.runSynchronously(on: executor)
            }
            let count = batch.count
            state.withLock { $0.jobsRun += count }
            batch.removeAll(keepingCapacity: true)
        }
    }

    /// Blocks for at most `externalWorkGracePeriod` until some thread enqueues a job; returns whether one is queued.
    private func waitForExternalJob() -> Bool {
        let armed = state.withLock { state in
            guard state.queue.isEmpty, externalWorkGracePeriod > .zero else { return false }
            state.driverWaiting = true
            return true
        }
        if armed {
            let (seconds, attoseconds) = externalWorkGracePeriod.components
            let (wholeNanoseconds, overflow) = seconds.multipliedReportingOverflow(by: 1_000_000_000)
            let (sum, sumOverflow) = wholeNanoseconds.addingReportingOverflow(attoseconds / 1_000_000_000)
            let nanoseconds = overflow || sumOverflow ? Int64.max : sum
            if wakeUp.wait(timeout: .now() + .nanoseconds(Int(clamping: nanoseconds))) == .timedOut {
                let signalled = state.withLock { state in
                    guard state.driverWaiting else { return true }
                    state.driverWaiting = false
                    return false
                }
                if signalled {
                    // An enqueue signalled between the timeout and the lock: consume it so it cannot leak into the
                    // next wait. It has been (or is about to be) signalled, so this does not block for long.
                    wakeUp.wait()
                }
            }
        }
        return state.withLock { !$0.queue.isEmpty }
    }

    /// The body's result, written by the root task (on the executor) and read by the driver.
    private final class Outcome<T: Sendable>: Sendable {
        private let value = Locked<Result<T, any Error>?>(nil)

        func set(_ result: Result<T, any Error>) {
            value.withLock { $0 = result }
        }

        func take() -> Result<T, any Error>? {
            value.withLock { $0.take() }
        }
    }

    /// Cancellation of one run requested from outside (``SimulationScheduler/runDetached(_:)``), possibly before the
    /// run's root task exists.
    private final class RunCancellation: Sendable {
        private struct State {
            var cancelled = false
            var task: Task<Void, Never>?
        }

        private let state = Locked(State())

        func attach(_ task: Task<Void, Never>) {
            let cancelled = state.withLock { state in
                state.task = task
                return state.cancelled
            }
            if cancelled {
                task.cancel()
            }
        }

        func cancel() {
            let task = state.withLock { state in
                state.cancelled = true
                return state.task
            }
            task?.cancel()
        }
    }
}
