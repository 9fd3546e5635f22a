/// The engine's mutable state, all of it, behind one `Locked` pthread mutex (see `PolicyEngine`).
struct EngineState {
    /// Why another party ended a request; read when its task sees `CancellationError`.
    enum EndReason { case loggedOut }

    enum Phase { case onWire, waiting }

    struct RequestEntry {
        var cancel: (@Sendable () -> Void)?
        var phase: Phase = .onWire
        var endReason: EndReason?
    }

    /// What a refresh waiter is resumed with.
    enum FlightResult: Sendable {
        case ok
        case failed(RefreshFailure)
        case loggedOut
        case cancelled
    }

    /// A request waiting for the refresh in flight; resumed with `nil` when the refresh ended
    /// before it could wait (it then decides again).
    typealias Waiter = CheckedContinuation<FlightResult?, Never>

    /// The refresh in progress: its waiters, by request number.
    struct Flight {
        var waiters: [UInt64: Waiter] = [:]
        let sessionEpoch: UInt64
    }

    var runtime: PolicyRuntime
    var credentials: Credentials?
    /// Bumped by every successful refresh and sign-in: a request signed with an older
    /// generation that hits a trigger retries at once with the newer token.
    var generation: UInt64 = 0
    var flight: Flight?
    /// When the last successful refresh ended (for `share-window`).
    var lastRefresh: Duration?
    /// When refresh calls started (for `limit`), oldest first.
    var refreshCalls: [Duration] = []
    var loggedOutUntil: Duration?
    /// Bumped by every logout: a refresh that started before a logout does not sign back in.
    var sessionEpoch: UInt64 = 0
    var requests: [UInt64: RequestEntry] = [:]
    var nextRequest: UInt64 = 0
    var budget = RetryBudgetWindow()

    func isLoggedOut(at now: Duration) -> Bool {
        guard let until = loggedOutUntil else { return false }
        return now < until
    }
}
