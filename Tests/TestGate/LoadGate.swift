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

/// Suites whose assertions bound wall time (a coordinator answering within its connect timeout,
/// a logout heard within a second, a timer firing within 50 ms), or that start a server taking a
/// core of its own, fail on a loaded machine: beside the rest of the suite on two cores, CPU-bound
/// tests keep the cooperative pool busy for seconds, and another build beside `swift test` makes
/// it worse. So a plain `swift test` (README's set-up command) skips them, saying how to run
/// them; they run only when asked, with `POLICY_TESTS_REALTIME=1`, alone:
///
/// ```sh
/// POLICY_TESTS_REALTIME=1 swift test --filter FleetLogoutTests
/// ```
///
/// `.ci/run` runs every one of them that way, in its real-time step.
public enum RealTimeSuites {
    /// The environment variable that asks for them.
    public static let variable = "POLICY_TESTS_REALTIME"

    /// Whether this run asked for them (`POLICY_TESTS_REALTIME=1`).
    public static var requested: Bool { ProcessInfo.processInfo.environment[variable] == "1" }

    /// What a skipped one says: why, and the command that runs it.
    public static func skipReason(filter: String) -> String {
        "measures real time, so it runs only when asked, alone: \(variable)=1 swift test --filter '\(filter)'"
    }
}

extension Trait where Self == ConditionTrait {
    /// Runs the suite (or test) only when asked with `POLICY_TESTS_REALTIME=1` (see
    /// ``RealTimeSuites``); `filter` is what `swift test --filter` takes to run it alone: the
    /// suite's name, or `Suite/test` for one test.
    public static func measuresRealTime(filter: String) -> Self {
        .enabled(if: RealTimeSuites.requested, Comment(rawValue: RealTimeSuites.skipReason(filter: filter)))
    }
}
