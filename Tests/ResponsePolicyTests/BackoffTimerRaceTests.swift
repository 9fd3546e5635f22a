import Foundation
import Testing

@testable import ResponsePolicy

/// A logout that ends a request in the instant between its backoff starting and its timer being
/// scheduled must not leave that timer in the heap (it held the finished request until the
/// backoff's end). Real threads, so the window opens by chance: 500 rounds of 64 requests left
/// timers behind in nearly every run before the fix.
@Suite struct BackoffTimerRaceTests {
    static let policy = """
        policy: 1
        name: leak
        classify: { code: body.status }
        rules:
          - { name: revoked, when: { code: [202] }, then: logout }
          - { name: busy, when: { status: [503] }, then: retry }
        logout: { cooldown: 1h, cancel-in-flight: true }
        retry:
          max-retries: 1
          backoff: constant
          initial: 1h
          max-delay: none
          deadline: none
          attempt-timeout: none
          budget: none
        """

    /// Holds every attempt until `count` have arrived, then answers them all at once: 503 for
    /// all but the revoker, which logs the session out while the others start their backoff.
    final class BarrierTransport: CancellableTransport {
        let count: Int
        let revokerDelay: Int
        private let state = Locked<(arrived: Int, waiters: [CheckedContinuation<Void, Never>])>((0, []))
        init(count: Int, revokerDelay: Int) {
            self.count = count
            self.revokerDelay = revokerDelay
        }
        func send(_ request: HTTPRequest) async throws -> HTTPResponse {
            try await send(request, cancellation: AttemptCancellation())
        }
        func send(_ request: HTTPRequest, cancellation: AttemptCancellation) async throws -> HTTPResponse {
            await withCheckedContinuation { continuation in
                let release = state.withLock { state -> [CheckedContinuation<Void, Never>] in
                    state.arrived += 1
                    state.waiters.append(continuation)
                    guard state.arrived == count else { return [] }
                    defer { state.waiters = [] }
                    return state.waiters
                }
                for waiter in release { waiter.resume() }
            }
            if request.id == "revoker" {
                for _ in 0..<revokerDelay { await Task.yield() }
                return HTTPResponse(status: 200, body: Data(#"{"status":202}"#.utf8))
            }
            return HTTPResponse(status: 503)
        }
    }

    /// A logout takes a request that has just entered its backoff (phase `.backoff` set under
    /// the lock, timer not yet scheduled) and cancels its timer before `startBackoff` schedules
    /// it: the timer then sits in the heap for the whole backoff, holding the finished request.
    @Test func aBackoffEndedByALogoutLeavesNoTimer() async throws {
        let width = 64
        var leakedRounds = 0
        var leakedTimers = 0
        for round in 0..<500 {
            let transport = BarrierTransport(count: width, revokerDelay: round % 8)
            let engine = PolicyEngine(policy: try Policy.load(yaml: Self.policy), transport: transport)
            await withTaskGroup(of: Void.self) { group in
                for index in 0..<width {
                    let id = index == width / 2 ? "revoker" : "r\(index)"
                    group.addTask { _ = try? await engine.send(HTTPRequest(url: testURL, id: id)) }
                }
            }
            #expect(engine.debugSnapshot.leftovers == 0)
            let left = engine.debugSnapshot.timers
            if left > 0 {
                leakedRounds += 1
                leakedTimers += left
            }
        }
        #expect(leakedTimers == 0, "\(leakedTimers) backoff timers left in the heap in \(leakedRounds) of 500 rounds")
    }
}
