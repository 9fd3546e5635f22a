import Foundation
import TestGate
import TestSupport
import Testing

@testable import ResponsePolicy

/// Every kind of response, failure, stall, refresh, logout and caller cancellation at once, on
/// the real pool and the real clock, through both transport paths. Which request meets what is
/// seeded; the interleaving is whatever the threads make of it. Nothing here asserts on time:
/// only what must hold under any interleaving (every call returns once, nothing stays
/// registered, no timer outlives its work). `.ci/run` repeats it under the thread sanitizer.
///
/// The attempt timeout is 250 ms, not a few: timers fire on time even when the pool is backed up
/// (they run outside it), so under ThreadSanitizer on a loaded machine a 20 ms timeout ended the
/// revoking requests' attempts before they were answered, and no logout happened.
@Suite(.loadGate(.saturating)) struct EngineChaosTests {
    static let policy = """
        policy: 1
        name: chaos
        classify: { code: body.status }
        rules:
          - { name: expired, when: { code: [1401] }, then: refresh }
          - { name: revoked, when: { code: [202] }, then: logout }
          - { name: busy, when: { status: [503], error: [timeout, connection] }, then: retry }
        refresh:
          use: oauth2
          with: { token-url: "https://auth.example.com/t", client-id: app }
          share-window: 0ms
          max-per-request: 2
          on-exhausted: fail
          on-failure: fail
          limit: none
          timeout: 50ms
        logout: { cooldown: 5ms, cancel-in-flight: true }
        retry:
          max-retries: 2
          backoff: constant
          initial: 1ms
          attempt-timeout: 250ms
          deadline: 2s
          budget: none
        """

    enum Answer: CaseIterable { case ok, expired, revoked, busy, dropped, stall }

    /// Picks an answer per attempt from a seeded sequence; a stall waits for a cancellation.
    final class ChaosTransport: CancellableTransport {
        private let random = Locked(SeededGenerator(seed: 0xC4A05))
        let stalls = Counter()

        /// The session is revoked by these requests only (a logout ends everything in flight, so
        /// a random one would end nearly every call the same way).
        static let revokers: Set<String> = ["x750", "x1750", "x2750"]

        func answer(_ request: HTTPRequest) -> Answer {
            if let id = request.id, Self.revokers.contains(id) { return .revoked }
            let roll = random.withLock { Int.random(in: 0..<100, using: &$0) }
            switch roll {
            case 0..<52: return .ok
            case 52..<70: return .expired
            case 70..<80: return .busy
            case 80..<90: return .dropped
            default: return .stall
            }
        }

        func send(_ request: HTTPRequest) async throws -> HTTPResponse {
            try await respond(request, cancellation: nil)
        }

        func send(_ request: HTTPRequest, cancellation: AttemptCancellation) async throws -> HTTPResponse {
            try await respond(request, cancellation: cancellation)
        }

        private func respond(_ request: HTTPRequest, cancellation: AttemptCancellation?) async throws -> HTTPResponse {
            let answer = answer(request)
            // A revoker answers at once: the logout must happen however busy the pool is.
            if answer != .revoked { await Task.yield() }
            switch answer {
            case .ok: return HTTPResponse(status: 200, body: Data(#"{"status":0}"#.utf8))
            case .expired: return HTTPResponse(status: 200, body: Data(#"{"status":1401}"#.utf8))
            case .revoked: return HTTPResponse(status: 200, body: Data(#"{"status":202}"#.utf8))
            case .busy: return HTTPResponse(status: 503)
            case .dropped: throw TransportError(.connection, "dropped")
            case .stall:
                stalls.increment()
                // Until the attempt timeout, a logout or the caller ends it.
                let gate = Gate()
                cancellation?.onCancel { gate.open() }
                await withTaskCancellationHandler {
                    await gate.wait()
                } onCancel: {
                    gate.open()
                }
                throw CancellationError()
            }
        }
    }

    /// Opens once; a waiter before that suspends, one after returns at once.
    final class Gate: Sendable {
        private let state = Locked<(open: Bool, waiters: [CheckedContinuation<Void, Never>])>((false, []))
        func open() {
            let waiters = state.withLock { state in
                state.open = true
                defer { state.waiters = [] }
                return state.waiters
            }
            for waiter in waiters { waiter.resume() }
        }
        func wait() async {
            await withCheckedContinuation { continuation in
                let now = state.withLock { state in
                    if state.open { return true }
                    state.waiters.append(continuation)
                    return false
                }
                if now { continuation.resume() }
            }
        }
    }

    /// Plain: a task per attempt. Inline: the transport adopts `CancellableTransport`.
    struct PlainTransport: Transport {
        let inner: ChaosTransport
        func send(_ request: HTTPRequest) async throws -> HTTPResponse { try await inner.send(request) }
    }

    @Test(arguments: [false, true])
    func everyCallReturnsOnceAndNothingOutlivesItsWork(inline: Bool) async throws {
        let chaos = ChaosTransport()
        let refreshes = Counter()
        let refresh = CountingRefresh {
            refreshes.increment()
            for _ in 0..<5 { await Task.yield() }
        }
        var options = PolicyEngine.Options()
        options.refreshPlugin = refresh
        options.random = SeededRandomSource(seed: 11)
        let log = EventLog()
        options.observers = [log]
        let engine = PolicyEngine(
            policy: try Policy.load(yaml: Self.policy), transport: inline ? chaos : PlainTransport(inner: chaos),
            credentials: MemoryCredentialStore(Credentials(accessToken: "token-0")), options: options)
        // Six waves of 500 at once; waves 1, 3 and 5 each hold one request that logs out.
        let count = 3_000
        let returned = Counter()
        for wave in 0..<6 {
            await withTaskGroup(of: Void.self) { group in
                for index in (wave * 500)..<((wave + 1) * 500) {
                    let task = Task {
                        _ = try? await engine.send(HTTPRequest(url: testURL, id: "x\(index)"))
                        returned.increment()
                    }
                    group.addTask {
                        if index % 10 == 3 {
                            for _ in 0..<(index % 7) { await Task.yield() }
                            task.cancel()
                        }
                        await task.value
                    }
                }
            }
        }
        #expect(returned.value == count)
        // One outcome event per call, and the chaos reached every kind of ending.
        let outcomes = log.events.filter { $0.kind == .outcome }
        #expect(outcomes.count == count)
        #expect(Set(outcomes.compactMap(\.request)).count == count)
        let results = Set(outcomes.compactMap(\.result))
        #expect(results == [.delivered, .failed, .loggedOut, .cancelled], "\(results)")
        #expect(chaos.stalls.value > 0 && refresh.calls > 0)
        #expect(log.events.contains { $0.kind == .logout })
        await engine.waitForBackgroundWork()
        #expect(engine.debugSnapshot.leftovers == 0, "requests or refresh waiters left registered")
        // A refresh whose waiters all left may still be running; its timeout timer goes with it.
        var spins = 0
        while engine.debugSnapshot.refreshing || engine.debugSnapshot.timers > 0, spins < 100_000 {
            await Task.yield()
            spins += 1
        }
        #expect(engine.debugSnapshot.timers == 0, "a timer outlived the work it times")
        #expect(!engine.debugSnapshot.refreshing)
    }
}
