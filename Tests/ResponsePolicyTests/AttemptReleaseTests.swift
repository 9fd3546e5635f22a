import Foundation
import Testing

@testable import ResponsePolicy

/// An attempt's state is released when the attempt ends, whatever ended it.
///
/// Both shipped transports keep per-attempt state (`CurlTransport`'s transfer, the
/// `URLSessionTransport` call's slot) that holds the attempt's ``AttemptCancellation`` (to call
/// `responseArriving()`), and register a cancellation handler that holds that state: a cycle.
/// Until the engine released the handlers at the end of each attempt, every request through
/// either transport kept about 1.7 KB for the life of the process (`policy-bench --only
/// transport-http-get-c16`: 105 MB of RSS after 40,000 requests, 36 MB after 2,000). The
/// transport here makes the same cycle for every attempt and counts the states still alive.
@Suite struct AttemptReleaseTests {
    /// What a transport keeps for one attempt: the cancellation, as the real transports do.
    final class AttemptState: @unchecked Sendable {
        let cancellation: AttemptCancellation
        let live: Locked<Int>
        init(_ cancellation: AttemptCancellation, live: Locked<Int>) {
            self.cancellation = cancellation
            self.live = live
            live.withLock { $0 += 1 }
        }
        deinit { live.withLock { $0 -= 1 } }
    }

    /// Answers by path: `/ok` 200, `/busy` 503 (retried), `/broken` a connection error,
    /// `/revoked` a logout code, `/hangs` nothing until the attempt is cancelled (its timeout, a
    /// logout, the caller).
    final class CyclingTransport: CancellableTransport {
        let live = Locked(0)
        let attempts = Locked(0)
        private let started = Locked<Set<String>>([])

        func hasStarted(_ url: URL) -> Bool { started.withLock { $0.contains(url.path) } }

        func send(_ request: HTTPRequest) async throws -> HTTPResponse {
            try await send(request, cancellation: AttemptCancellation())
        }

        func send(_ request: HTTPRequest, cancellation: AttemptCancellation) async throws -> HTTPResponse {
            attempts.withLock { $0 += 1 }
            started.withLock { _ = $0.insert(request.url.path) }
            let state = AttemptState(cancellation, live: live)
            let cancelled = Locked<CheckedContinuation<Void, Never>?>(nil)
            let wasCancelled = Locked(false)
            // The handler holds the state, and the state holds the cancellation: the cycle.
            cancellation.onCancel {
                _ = state
                wasCancelled.withLock { $0 = true }
                cancelled.withLock { $0.take() }?.resume()
            }
            switch request.url.lastPathComponent {
            case "ok":
                state.cancellation.responseArriving()
                return HTTPResponse(status: 200, body: Data(#"{"status":0}"#.utf8))
            case "busy":
                return HTTPResponse(status: 503)
            case "broken":
                throw TransportError(.connection, "refused")
            case "revoked":
                return HTTPResponse(status: 200, body: Data(#"{"status":202}"#.utf8))
            default:
                await withTaskCancellationHandler {
                    await withCheckedContinuation { continuation in
                        let already = wasCancelled.withLock { done -> Bool in
                            if !done { cancelled.withLock { $0 = continuation } }
                            return done
                        }
                        if already { continuation.resume() }
                    }
                } onCancel: {
                    wasCancelled.withLock { $0 = true }
                    cancelled.withLock { $0.take() }?.resume()
                }
                throw CancellationError()
            }
        }
    }

    static let policy = """
        policy: 1
        name: release
        classify: { code: body.status }
        rules:
          - { name: revoked, when: { code: [202] }, then: logout }
          - { name: transient, when: { status: [503], error: [timeout, connection] }, then: retry }
        logout: { cooldown: 1s, cancel-in-flight: true }
        retry:
          max-retries: 2
          backoff: constant
          initial: 100ms
          attempt-timeout: 2s
          budget: none
        """

    /// Random mixes of every way an attempt ends, many at once, on the simulated clock: when
    /// every request has its outcome, no attempt's state is alive and no handler is kept.
    @Test(arguments: [1, 2, 3, 4, 5, 6])
    func noAttemptOutlivesItsEndWhateverEndedIt(_ seed: UInt64) async throws {
        let transport = CyclingTransport()
        let simulated = try SimulatedEngine(Self.policy, transport: transport)
        let clock = simulated.clock
        let random = SeededRandomSource(seed: seed)
        let paths = ["ok", "ok", "ok", "busy", "broken", "hangs", "hangs-cancelled", "revoked"]
        // Five waves of ten at once, each after the last one's logout cooldown.
        let waves = (0..<5).map { _ in (0..<10).map { _ in paths[Int(random.nextBits() % UInt64(paths.count))] } }
        let outcomes = try await simulated.run { engine in
            var count = 0
            for (wave, picks) in waves.enumerated() {
                count += await withTaskGroup(of: Bool.self) { group in
                    for (index, path) in picks.enumerated() {
                        let url = URL(string: "https://api.example.com/\(wave)/\(index)/\(path)")!
                        group.addTask {
                            guard path == "hangs-cancelled" else { return await Self.send(engine, url) }
                            // Its caller gives up once it is on the wire (or ends first, refused).
                            return await withTaskGroup(of: Bool?.self) { caller in
                                caller.addTask { await Self.send(engine, url) }
                                caller.addTask {
                                    while !transport.hasStarted(url), !Task.isCancelled { await Task.yield() }
                                    return nil
                                }
                                var delivered = false
                                for await result in caller {
                                    if let result { delivered = result }
                                    caller.cancelAll()
                                }
                                return delivered
                            }
                        }
                    }
                    var count = 0
                    for await _ in group { count += 1 }
                    return count
                }
                try await clock.sleep(until: clock.now + .seconds(2))
            }
            return count
        }
        #expect(outcomes == 50, "every request has its outcome")
        #expect(transport.attempts.withLock { $0 } >= 10, "attempts went out in every wave")
        #expect(transport.live.withLock { $0 } == 0, "attempts' states still alive after every request ended")
    }

    static func send(_ engine: PolicyEngine, _ url: URL) async -> Bool {
        (try? await engine.send(HTTPRequest(url: url))) != nil
    }

    /// Answers each path's first attempt with a token-expired code, its second with 200.
    final class ExpiringTransport: CancellableTransport {
        private let attempts = Locked<[String: Int]>([:])

        func send(_ request: HTTPRequest) async throws -> HTTPResponse {
            try await send(request, cancellation: AttemptCancellation())
        }

        func send(_ request: HTTPRequest, cancellation: AttemptCancellation) async throws -> HTTPResponse {
            let attempt = attempts.withLock { attempts -> Int in
                attempts[request.url.path, default: 0] += 1
                return attempts[request.url.path] ?? 0
            }
            return HTTPResponse(status: 200, body: Data((attempt == 1 ? #"{"status":1401}"# : #"{"status":0}"#).utf8))
        }
    }

    /// A token call's give-up timer is released with the call. Its closure held the call's bound,
    /// and the bound held the timer: each refresh kept its task and closures (about 6 KB) for the
    /// life of the process (heaptrack, 1,500 refreshes of `policy simulate`: 10 MB left at the end).
    @Test func aTokenCallsTimerIsReleasedWithTheCall() async throws {
        let refresh = CountingRefresh()
        let simulated = try SimulatedEngine(basePolicy, transport: ExpiringTransport(), refresh: refresh)
        let clock = simulated.clock
        let delivered = try await simulated.run { engine in
            var delivered = 0
            for index in 0..<12 {
                let url = URL(string: "https://api.example.com/items/\(index)")!
                if (try? await engine.send(HTTPRequest(url: url))) != nil { delivered += 1 }
                // Past refresh.limit's window, so that every request refreshes.
                try await clock.sleep(until: clock.now + .seconds(10))
            }
            return delivered
        }
        #expect(delivered == 12)
        #expect(refresh.calls == 12, "a token call per request")
        let engine = simulated.engine
        #expect(engine.timers.count == 0, "no timer left on the heap")
        #expect(engine.timers.closureTimersAlive.withLock { $0 } == 0, "timers still alive after their calls ended")
    }

    /// The contract a transport author reads: handlers are released when the attempt ends, and
    /// one registered after that is neither kept nor run.
    @Test func handlersAreReleasedWhenTheAttemptEndsAndNotRunAfter() {
        let live = Locked(0)
        let cancellation = AttemptCancellation()
        var state: AttemptState? = AttemptState(cancellation, live: live)
        let ran = Locked(0)
        cancellation.onCancel { [state] in
            _ = state
            ran.withLock { $0 += 1 }
        }
        state = nil
        #expect(live.withLock { $0 } == 1, "the handler keeps the state while the attempt runs")
        #expect(cancellation.handlerCount == 1)
        cancellation.attemptEnded()
        #expect(live.withLock { $0 } == 0, "the handler and its captures are released at the end")
        #expect(cancellation.handlerCount == 0)
        cancellation.onCancel { ran.withLock { $0 += 1 } }
        cancellation.cancel()
        #expect(ran.withLock { $0 } == 0, "nothing runs for an attempt that ended")
        #expect(cancellation.handlerCount == 0)
    }
}
