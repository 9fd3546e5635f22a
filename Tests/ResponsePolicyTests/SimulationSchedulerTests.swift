import Foundation
import TestGate
import TestSupport
import Testing

@testable import ResponsePolicy

/// Tests for ``VirtualClock`` driven by ``SimulationScheduler``.
///
/// Every simulation is started with `runDetached`, which drives it on a dedicated thread, so these async tests never
/// block a cooperative pool thread.
struct SimulationSchedulerTests {
    // MARK: - Virtual time

    @Test func sleepsWakeAtExactVirtualTimes() async throws {
        let clock = VirtualClock()
        let scheduler = SimulationScheduler(clock: clock)
        let (times, date) = try await scheduler.runDetached { () async throws -> ([Duration], Date) in
            var times: [Duration] = []
            try await clock.sleep(until: .seconds(1))
            times.append(clock.now)
            try await clock.sleep(until: clock.now + .milliseconds(250))
            times.append(clock.now)
            try await clock.sleep(until: .seconds(90))
            times.append(clock.now)
            try await clock.sleep(until: .seconds(3))  // In the past: returns at once.
            times.append(clock.now)
            return (times, clock.date)
        }
        #expect(times == [.seconds(1), .milliseconds(1250), .seconds(90), .seconds(90)])
        #expect(date == Date(timeIntervalSince1970: 1_767_225_600 + 90))
        #expect(clock.pendingTimers == 0)
        #expect(clock.nextDeadline == nil)
    }

    @Test func tenThousandConcurrentSleepersFinishAtTheMaximumDeadline() async throws {
        let clock = VirtualClock()
        let scheduler = SimulationScheduler(clock: clock)
        var generator = SeededGenerator(seed: 0x5EED)
        let deadlines = (0..<10_000).map { _ in Duration.milliseconds(Int64(generator.next() % 3_600_000) + 1) }
        let latest = deadlines.max() ?? .zero
        let realStart = ContinuousClock.now

        let (lateWakeUps, end) = try await scheduler.runDetached { () async throws -> (Int, Duration) in
            let lateWakeUps = try await withThrowingTaskGroup(of: Bool.self) { group in
                for deadline in deadlines {
                    group.addTask {
                        try await clock.sleep(until: deadline)
                        return clock.now == deadline
                    }
                }
                return try await group.reduce(0) { count, exact in exact ? count : count + 1 }
            }
            return (lateWakeUps, clock.now)
        }

        #expect(lateWakeUps == 0)
        #expect(end == latest)
        #expect(clock.pendingTimers == 0)
        // An hour of virtual time; the bound is far from it, and far from what two busy cores need.
        #expect(ContinuousClock.now - realStart < .seconds(300), "simulating an hour must not take real time")
    }

    @Test func timersAtTheSameDeadlineFireInRegistrationOrder() async throws {
        let clock = VirtualClock()
        let scheduler = SimulationScheduler(clock: clock)
        let log = EventLog()
        try await scheduler.runDetached {
            await withTaskGroup(of: Void.self) { group in
                for worker in 0..<5 {
                    group.addTask {
                        // Worker 4 registers first, worker 0 last.
                        for _ in 0..<(4 - worker) {
                            await Task.yield()
                        }
                        try? await clock.sleep(until: .seconds(10))
                        log.append("w\(worker)@\(clock.now)")
                    }
                }
            }
        }
        #expect(
            log.entries == [
                "w4@10.0 seconds", "w3@10.0 seconds", "w2@10.0 seconds", "w1@10.0 seconds",
                "w0@10.0 seconds",
            ])
    }

    @Test func orderingIsIdenticalAcrossRuns() async throws {
        let first = try await Self.simulateBusyScenario(seed: 42)
        let second = try await Self.simulateBusyScenario(seed: 42)
        #expect(first.count == 166)  // 40 workers × 4 steps, 5 background rounds, 1 handoff.
        #expect(first == second)
    }

    // MARK: - Cancellation

    @Test func cancellingASleepingTaskThrowsAtTheVirtualTimeOfCancellation() async throws {
        let clock = VirtualClock()
        let scheduler = SimulationScheduler(clock: clock)
        let (outcome, pendingAfterCancel, end) = try await scheduler.runDetached {
            () async throws -> (String, Int, Duration) in
            let sleeper = Task(executorPreference: scheduler.executor) { () -> String in
                do {
                    try await clock.sleep(until: .seconds(3600))
                    return "woke at \(clock.now)"
                } catch is CancellationError {
                    return "cancelled at \(clock.now)"
                } catch {
                    return "unexpected \(error)"
                }
            }
            try await clock.sleep(until: .seconds(5))
            sleeper.cancel()
            let outcome = await sleeper.value
            return (outcome, clock.pendingTimers, clock.now)
        }
        #expect(outcome == "cancelled at 5.0 seconds")
        #expect(pendingAfterCancel == 0)
        #expect(end == .seconds(5), "the hour-long timer must not have been fired")
    }

    @Test func sleepingInAnAlreadyCancelledTaskThrowsWithoutRegisteringATimer() async throws {
        let clock = VirtualClock()
        let scheduler = SimulationScheduler(clock: clock)
        let results = try await scheduler.runDetached { () async throws -> [String] in
            let task = Task(executorPreference: scheduler.executor) { () -> [String] in
                withUnsafeCurrentTask { $0?.cancel() }
                var results: [String] = []
                for deadline in [Duration.seconds(10), .zero] {
                    do {
                        try await clock.sleep(until: deadline)
                        results.append("returned")
                    } catch {
                        results.append(error is CancellationError ? "cancelled" : "other")
                    }
                }
                return results
            }
            return await task.value
        }
        #expect(results == ["cancelled", "cancelled"])
        #expect(clock.pendingTimers == 0)
        #expect(clock.now == .zero)
    }

    @Test func cancellingTheAwaitingTestTaskCancelsTheSimulation() async throws {
        let clock = VirtualClock()
        // A long grace period: the driver must be woken by the cancellation, not by the timeout. The
        // bound below is half of it, far above what a pool kept busy by the rest of the suite needs.
        let scheduler = SimulationScheduler(clock: clock, externalWorkGracePeriod: .seconds(600))
        let realStart = ContinuousClock.now
        let outer = Task {
            try await scheduler.runDetached {
                let box = ContinuationBox<Void>()
                try await withTaskCancellationHandler {
                    try await withCheckedThrowingContinuation { box.store($0) }
                } onCancel: {
                    box.resume(throwing: CancellationError())
                }
            }
        }
        try await Task.sleep(for: .milliseconds(50))  // Real time: let the driver reach quiescence and block.
        outer.cancel()
        await #expect(throws: CancellationError.self) { try await outer.value }
        #expect(ContinuousClock.now - realStart < .seconds(300))
    }

    // MARK: - Continuations, unstructured tasks

    @Test func continuationResumedByAnotherTaskAfterASleep() async throws {
        let clock = VirtualClock()
        let scheduler = SimulationScheduler(clock: clock)
        let (value, time) = try await scheduler.runDetached { () async throws -> (String, Duration) in
            let box = ContinuationBox<String>()
            async let resumer: Void = {
                try await clock.sleep(until: .seconds(7))
                box.resume(returning: "token-1")
            }()
            let value = try await withCheckedThrowingContinuation { box.store($0) }
            let time = clock.now
            try await resumer
            return (value, time)
        }
        #expect(value == "token-1")
        #expect(time == .seconds(7))
    }

    @Test func unstructuredTaskWithExecutorPreferenceParticipates() async throws {
        let clock = VirtualClock()
        let scheduler = SimulationScheduler(clock: clock)
        let log = EventLog()
        try await scheduler.runDetached {
            // Fire-and-forget, like an engine's shared refresh task.
            let background = Task(executorPreference: scheduler.executor) {
                for _ in 0..<3 {
                    try? await clock.sleep(until: clock.now + .seconds(2))
                    log.append("background@\(clock.now) onDriver=\(scheduler.isOnDriverThread)")
                }
            }
            for _ in 0..<2 {
                try await clock.sleep(until: clock.now + .seconds(3))
                log.append("body@\(clock.now) onDriver=\(scheduler.isOnDriverThread)")
            }
            await background.value
            log.append("done@\(clock.now)")
        }
        #expect(
            log.entries == [
                "background@2.0 seconds onDriver=true",
                "body@3.0 seconds onDriver=true",
                "background@4.0 seconds onDriver=true",
                // Both wake at 6 s; the body registered its timer (at 3 s) before the background task (at 4 s).
                "body@6.0 seconds onDriver=true",
                "background@6.0 seconds onDriver=true",
                "done@6.0 seconds",
            ])
    }

    /// Pins the executor-inheritance facts the engine design relies on (see ``SimulationScheduler``).
    ///
    /// Real time matters here: `Task {}` must get a slot in the global pool within the grace
    /// period, so the test never runs beside the suites that saturate the pool.
    @Test(.loadGate(.realTime)) func executorInheritance() async throws {
        let clock = VirtualClock()
        // `Task {}` and `Task.detached` run on the global pool; the body awaiting them is resumed from there, so give
        // that pool time before quiescence counts as a deadlock. Generous: the test is about executors, not time, and
        // the full suite keeps the pool's two CI threads busy for longer than 10 s (it failed here under load). The
        // wait ends as soon as the job arrives; only a real deadlock waits it out.
        let scheduler = SimulationScheduler(clock: clock, externalWorkGracePeriod: .seconds(120))
        let facts = try await scheduler.runDetached { () async throws -> [String: Bool] in
            let facts = Facts(scheduler)
            facts.record("body")
            await withTaskGroup(of: Void.self) { group in
                group.addTask { facts.record("task group child") }
            }
            async let child: Void = facts.record("async let")
            await child
            let box = ContinuationBox<Void>()
            async let resumer: Void = {
                try await clock.sleep(until: .seconds(1))
                box.resume(returning: ())
            }()
            try await withCheckedThrowingContinuation { box.store($0) }
            facts.record("after continuation resumption")
            try await resumer
            await Task.yield()
            facts.record("after Task.yield")
            let actor = Recorder(facts: facts, clock: clock)
            await actor.record("default actor")
            try await actor.recordAfterSleep("default actor after a sleep")
            await Task(executorPreference: scheduler.executor) { facts.record("Task(executorPreference:)") }.value
            await Task { facts.record("Task {}") }.value
            await Task.detached { facts.record("Task.detached") }.value
            facts.record("body after unstructured tasks")
            return facts.values
        }
        #expect(
            facts == [
                "body": true,
                "task group child": true,
                "async let": true,
                "after continuation resumption": true,
                "after Task.yield": true,
                "default actor": true,
                "default actor after a sleep": true,
                "Task(executorPreference:)": true,
                "Task {}": false,
                "Task.detached": false,
                "body after unstructured tasks": true,
            ])
    }

    // MARK: - Deadlock, errors

    @Test func aContinuationNeverResumedIsReportedAsDeadlock() async throws {
        let clock = VirtualClock()
        let scheduler = SimulationScheduler(clock: clock, externalWorkGracePeriod: .zero)
        let box = ContinuationBox<Void>()
        await #expect(throws: SimulationError.deadlock(virtualTime: .seconds(2))) {
            try await scheduler.runDetached {
                try await clock.sleep(until: .seconds(2))
                try await withCheckedThrowingContinuation { box.store($0) }
            }
        }
        // Nobody else will resume it; resume it to avoid a "leaked continuation" report. The task was cancelled
        // and its scheduler is no longer driven, so nothing runs.
        box.resume(throwing: CancellationError())
    }

    @Test func deadlockCancelsTheBodyAndDrainsBeforeThrowing() async throws {
        let clock = VirtualClock()
        let scheduler = SimulationScheduler(clock: clock)  // Default grace period.
        let log = EventLog()
        await #expect(throws: SimulationError.deadlock(virtualTime: .seconds(1))) {
            try await scheduler.runDetached {
                try await clock.sleep(until: .seconds(1))
                let box = ContinuationBox<Void>()
                do {
                    try await withTaskCancellationHandler {
                        try await withCheckedThrowingContinuation { box.store($0) }
                    } onCancel: {
                        log.append("onCancel")
                        box.resume(throwing: CancellationError())
                    }
                } catch {
                    log.append("body saw \(error is CancellationError ? "CancellationError" : "\(error)")")
                    throw error
                }
            }
        }
        #expect(log.entries == ["onCancel", "body saw CancellationError"])
    }

    @Test func bodyErrorsAreRethrown() async throws {
        struct Boom: Error, Equatable {}
        let clock = VirtualClock()
        let scheduler = SimulationScheduler(clock: clock)
        await #expect(throws: Boom()) {
            try await scheduler.runDetached {
                try await clock.sleep(until: .seconds(1))
                throw Boom()
            }
        }
        #expect(clock.now == .seconds(1))
    }

    @Test func runBlocksAPlainThreadAndSchedulerIsReusable() async throws {
        let clock = VirtualClock()
        let scheduler = SimulationScheduler(clock: clock)
        let first = try await Self.onPlainThread {
            try scheduler.run {
                try await clock.sleep(until: .seconds(4))
                return clock.now
            }
        }
        let second = try await scheduler.runDetached {
            try await clock.sleep(until: clock.now + .seconds(4))
            return clock.now
        }
        #expect(first == .seconds(4))
        #expect(second == .seconds(8))
    }

    // MARK: - Helpers

    /// Many workers with seeded random sleeps (with ties), an actor, yields and continuation handoffs.
    private static func simulateBusyScenario(seed: UInt64) async throws -> [String] {
        let clock = VirtualClock()
        let scheduler = SimulationScheduler(clock: clock)
        let log = EventLog()
        var generator = SeededGenerator(seed: seed)
        let plans = (0..<40).map { _ in (0..<4).map { _ in Duration.milliseconds(Int64(generator.next() % 5) * 100) } }
        try await scheduler.runDetached {
            let counter = Counter()
            let handoff = ContinuationBox<Int>()
            let background = Task(executorPreference: scheduler.executor) {
                for round in 0..<5 {
                    await Task.yield()
                    try? await clock.sleep(until: clock.now + .milliseconds(150))
                    log.append("\(clock.now) background round \(round)")
                }
                handoff.resume(returning: await counter.value)
            }
            await withTaskGroup(of: Void.self) { group in
                for (worker, plan) in plans.enumerated() {
                    group.addTask {
                        for (step, pause) in plan.enumerated() {
                            try? await clock.sleep(until: clock.now + pause)
                            let count = await counter.increment()
                            log.append("\(clock.now) w\(worker) s\(step) count \(count)")
                            if step % 2 == 0 {
                                await Task.yield()
                            }
                        }
                    }
                }
            }
            let seen = try await withCheckedThrowingContinuation { handoff.store($0) }
            log.append("\(clock.now) handoff \(seen)")
            await background.value
        }
        return log.entries
    }

    private static func onPlainThread<T: Sendable>(_ work: @escaping @Sendable () throws -> T) async throws -> T {
        try await withCheckedThrowingContinuation { continuation in
            Thread { continuation.resume(with: Result { try work() }) }.start()
        }
    }
}

extension SimulationSchedulerTests {
    // MARK: - Test doubles

    /// An append-only, thread-safe list of events.
    fileprivate final class EventLog: Sendable {
        private let storage = Locked<[String]>([])

        var entries: [String] { storage.withLock { $0 } }

        func append(_ entry: String) {
            storage.withLock { $0.append(entry) }
        }
    }

    /// Holds a continuation for another task to resume; resuming before `store` is handled.
    fileprivate final class ContinuationBox<Value: Sendable>: Sendable {
        private enum State {
            case empty
            case waiting(CheckedContinuation<Value, any Error>)
            case resolved(Result<Value, any Error>)
            case done
        }

        private let state = Locked(State.empty)

        func store(_ continuation: CheckedContinuation<Value, any Error>) {
            let early: Result<Value, any Error>? = state.withLock { state in
                switch state {
                case .resolved(let result):
                    state = .done
                    return result
                case .empty, .waiting, .done:
                    state = .waiting(continuation)
                    return nil
                }
            }
            if let early {
                continuation.resume(with: early)
            }
        }

        func resume(returning value: Value) {
            resume(with: .success(value))
        }

        func resume(throwing error: any Error) {
            resume(with: .failure(error))
        }

        private func resume(with result: Result<Value, any Error>) {
            let waiting: CheckedContinuation<Value, any Error>? = state.withLock { state in
                switch state {
                case .waiting(let continuation):
                    state = .done
                    return continuation
                case .empty:
                    state = .resolved(result)
                    return nil
                case .resolved, .done:
                    return nil
                }
            }
            waiting?.resume(with: result)
        }
    }

    fileprivate actor Counter {
        private(set) var value = 0

        func increment() -> Int {
            value += 1
            return value
        }
    }

    /// Records whether each labelled point ran on the simulation's driver thread.
    fileprivate final class Facts: Sendable {
        private let scheduler: SimulationScheduler
        private let storage = Locked<[String: Bool]>([:])

        init(_ scheduler: SimulationScheduler) { self.scheduler = scheduler }

        var values: [String: Bool] { storage.withLock { $0 } }

        func record(_ label: String) {
            let onDriver = scheduler.isOnDriverThread
            storage.withLock { $0[label] = onDriver }
        }
    }

    fileprivate actor Recorder {
        private let facts: Facts
        private let clock: VirtualClock
        private var calls = 0

        init(facts: Facts, clock: VirtualClock) {
            self.facts = facts
            self.clock = clock
        }

        func record(_ label: String) {
            calls += 1
            facts.record(label)
        }

        func recordAfterSleep(_ label: String) async throws {
            try await clock.sleep(until: clock.now + .seconds(1))
            calls += 1
            facts.record(label)
        }
    }
}
