import Foundation

/// The engine's mutable state, all of it, behind one `Locked` pthread mutex (see `PolicyEngine`).
struct EngineState {
    /// Why a request was ended from outside its own loop.
    enum EndReason { case loggedOut, cancelled }

    enum Phase { case onWire, waiting }

    /// One request in flight: what can be interrupted, and why it was.
    struct RequestEntry {
        /// The attempt on the wire, cancelled by a logout, a timeout or the caller.
        var attempt: AttemptCancellation?
        /// Counts attempts, so a late timeout cannot hit a later attempt.
        var attemptNumber = 0
        var timedOut = false
        /// A backoff wait: resumed `true` by its timer, `false` when the request is ended.
        var waiter: CheckedContinuation<Bool, Never>?
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
    /// The cooldown's end on the wall clock, fixed at logout so every refusal reports the same.
    var loggedOutUntilDate: Date?
    /// Bumped by every logout: a refresh that started before a logout does not sign back in.
    var sessionEpoch: UInt64 = 0
    var requests: [UInt64: RequestEntry] = [:]
    var nextRequest: UInt64 = 0
    var budget = RetryBudgetWindow()
    /// Logout calls running in the background, for `waitForBackgroundWork`.
    var background: [UInt64: Task<Void, Never>] = [:]
    var nextBackground: UInt64 = 0
    var finishedBackground: Set<UInt64> = []

    func isLoggedOut(at now: Duration) -> Bool {
        guard let until = loggedOutUntil else { return false }
        return now < until
    }
}
