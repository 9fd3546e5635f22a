import Foundation
import Testing

/// Keeps tests that measure real time apart from tests that saturate the machine.
///
/// Why: a test that checks a 300 ms attempt timeout against a server stalling 1.5 s is right only
/// if the process gets the CPU when the timeout is due. Swift Testing runs suites in parallel, and
/// a storm test (10,000 tasks on the cooperative pool, or a benchmark child process) running at the
/// same time made such checks fail about one run in four under ThreadSanitizer. The engine's timers
/// now fire outside the pool, but a real-time test should still not share two cores with a storm.
///
/// Tests of one kind run together; tests of the two kinds never overlap. Waiters are admitted in
/// arrival order, so neither kind starves.
///
/// ```swift
/// @Suite(.loadGate(.realTime)) struct EngineIntegrationTests { … }
/// @Suite(.loadGate(.saturating)) struct EngineConcurrencyTests { … }
/// ```
public struct LoadGateTrait: SuiteTrait, TestTrait, TestScoping {
    public enum Kind: Sendable { case realTime, saturating }

    let kind: Kind

    public var isRecursive: Bool { true }

    public func provideScope(
        for test: Test, testCase: Test.Case?, performing function: @Sendable () async throws -> Void
    ) async throws {
        // The suite itself is not gated, only each test in it.
        guard !test.isSuite else { return try await function() }
        await LoadGate.shared.enter(kind)
        defer { LoadGate.shared.leave(kind) }
        try await function()
    }
}

extension Trait where Self == LoadGateTrait {
    /// Runs each test of the suite (or the test) only while no test of the other kind runs.
    public static func loadGate(_ kind: LoadGateTrait.Kind) -> Self { LoadGateTrait(kind: kind) }
}

/// The process-wide gate behind ``LoadGateTrait``.
///
/// Concurrency contract: `enter` and `leave` may be called from any task; the state lives behind
/// one `NSLock` and continuations are resumed outside it.
final class LoadGate: @unchecked Sendable {
    // @unchecked: `state` is only touched while `lock` is held.
    static let shared = LoadGate()

    private struct State {
        var holders: [LoadGateTrait.Kind: Int] = [:]
        var waiting: [(kind: LoadGateTrait.Kind, continuation: CheckedContinuation<Void, Never>)] = []

        func admits(_ kind: LoadGateTrait.Kind) -> Bool {
            holders.allSatisfy { $0.key == kind || $0.value == 0 }
        }
    }

    private let lock = NSLock()
    private var state = State()

    func enter(_ kind: LoadGateTrait.Kind) async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let admitted: Bool = lock.withLock {
                guard state.waiting.isEmpty, state.admits(kind) else {
                    state.waiting.append((kind, continuation))
                    return false
                }
                state.holders[kind, default: 0] += 1
                return true
            }
            if admitted { continuation.resume() }
        }
    }

    func leave(_ kind: LoadGateTrait.Kind) {
        let woken: [CheckedContinuation<Void, Never>] = lock.withLock {
            state.holders[kind, default: 1] -= 1
            var woken: [CheckedContinuation<Void, Never>] = []
            // In arrival order, as many as can run together with those running now.
            while let next = state.waiting.first, state.admits(next.kind) {
                state.waiting.removeFirst()
                state.holders[next.kind, default: 0] += 1
                woken.append(next.continuation)
            }
            return woken
        }
        for continuation in woken { continuation.resume() }
    }
}

/// Suites whose assertions bound wall time across the cooperative pool (a coordinator answering
/// within its connect timeout, a logout heard within a second) cannot share two cores with the
/// rest of the suite: CPU-bound tests keep the pool busy for seconds. `.ci/run` runs them in a
/// step of their own: it sets `POLICY_TESTS_DEFER_REALTIME=1` for the full `swift test`, which
/// then skips them, and runs them alone afterwards. A plain `swift test` runs everything.
public enum RealTimeSuites {
    public static var deferred: Bool {
        ProcessInfo.processInfo.environment["POLICY_TESTS_DEFER_REALTIME"] == "1"
    }
}

extension Trait where Self == ConditionTrait {
    /// Skips the suite when `.ci/run` runs it in a step of its own (see ``RealTimeSuites``).
    public static var realTimeStep: Self {
        .enabled(if: !RealTimeSuites.deferred, "runs in .ci/run's real-time step, alone")
    }
}
