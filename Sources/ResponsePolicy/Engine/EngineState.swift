import Foundation

/// The engine's mutable state, all of it, behind one `Locked` pthread mutex (see `PolicyEngine`).
/// The fields of each ``RequestMachine`` marked "under the engine's lock" belong to it too.
struct EngineState {
    /// Why a request was ended from outside its own loop.
    enum EndReason { case loggedOut, cancelled }

    /// What a refresh waiter finds when it wakes.
    enum FlightResult: Sendable {
        case ok
        case failed(RefreshFailure)
        case loggedOut
        case cancelled
        /// The refresh ended after a logout or a sign-in began a new session: its token was
        /// discarded, so the waiter decides again (retry with the signed-in token, or refresh).
        case superseded
    }

    /// The refresh in progress and the requests waiting for it.
    ///
    /// A class so that a waiter holds a reference and reads the result once: the result (which
    /// may carry the refresh endpoint's response) is stored once, not in every waiter.
    ///
    /// Concurrency contract: every field is read and written under the engine's lock.
    final class Flight: @unchecked Sendable {
        /// In the order they began waiting; a waiter that left (cancelled, logged out) stays
        /// listed but no longer names this flight as the one it awaits.
        var waiters: [RequestMachine] = []
        let sessionEpoch: UInt64
        /// The coordinator's generation of the credentials being replaced.
        let sharedGeneration: UInt64
        var result: FlightResult?

        init(sessionEpoch: UInt64, sharedGeneration: UInt64) {
            self.sessionEpoch = sessionEpoch
            self.sharedGeneration = sharedGeneration
        }

        /// The waiters still waiting.
        var live: [RequestMachine] { waiters.filter { $0.awaitedFlight === self } }
    }

    var runtime: PolicyRuntime
    /// Boxed: every attempt reads the credentials under the lock, and copying the box out is one
    /// retain where copying the struct is one per string in it.
    var credentialsBox: CredentialsBox?
    var credentials: Credentials? {
        get { credentialsBox?.credentials }
        set { credentialsBox = newValue.map(CredentialsBox.init) }
    }
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
    /// Why the session in its cooldown ended.
    var logoutReason: LogoutReason?
    /// Bumped by every logout and sign-in: a refresh that started before either does not
    /// replace the credentials of the session that followed.
    var sessionEpoch: UInt64 = 0
    /// The requests in flight, oldest first: an intrusive list through `RequestMachine.next` and
    /// `previous`, so registering and removing one costs no allocation and no hashing. The back
    /// links are `unowned` (checked, not `unowned(unsafe)`): each machine in the list is held by
    /// its predecessor's `next` or by `firstRequest`, so they never dangle, and a bug that broke
    /// that would trap instead of reading freed memory.
    var firstRequest: RequestMachine?
    unowned var lastRequest: RequestMachine?
    var requestCount = 0
    var nextRequest: UInt64 = 0
    var budget = RetryBudgetWindow()
    /// The per-host queue of `dispatch:`.
    var dispatcher = Dispatcher()
    /// The generation of the credentials held, as the ``SessionCoordinator`` numbers them (0:
    /// none shared yet). Compared with what the coordinator publishes; the local `generation`
    /// keeps counting every change for the requests' own bookkeeping.
    var sharedGeneration: UInt64 = 0
    /// Logout calls running in the background, for `waitForBackgroundWork`.
    var background: [UInt64: Task<Void, Never>] = [:]
    var nextBackground: UInt64 = 0
    var finishedBackground: Set<UInt64> = []

    /// The cooldown's end and reason, as a refused request reports them.
    var cooldown: (Date, LogoutReason)? {
        guard let until = loggedOutUntilDate else { return nil }
        return (until, logoutReason ?? .host("logged out"))
    }

    func isLoggedOut(at now: Duration) -> Bool {
        guard let until = loggedOutUntil else { return false }
        return now < until
    }

    /// Registers `machine` as waiting for `flight`.
    func join(insideLock flight: Flight, _ machine: RequestMachine) {
        flight.waiters.append(machine)
        machine.awaitedFlight = flight
        machine.phase = .awaitingRefresh
    }

    /// Wakes the requests waiting for `flight` (its result set) and lets queued requests out.
    /// Returns the continuations to resume after unlocking.
    ///
    /// In request order, so a simulation's output is the same every run. A waiter that has been
    /// on the wire before gets a dispatch slot now when one is free, ahead of the requests still
    /// waiting for their first attempt; then the queues move, signed with the new token.
    mutating func endWaits(insideLock flight: Flight) -> [UnsafeContinuation<Void, Never>] {
        var woken: [UnsafeContinuation<Void, Never>] = []
        for machine in flight.live.sorted(by: { $0.context.number < $1.context.number }) {
            machine.awaitedFlight = nil
            machine.wake = .flight(flight)
            if let host = machine.host, machine.attempt > 0 {
                dispatcher.reserve(insideLock: machine, host: host)
            }
            if let parked = machine.parked.take() { woken.append(parked) }
        }
        flight.waiters = []
        dispatcher.promoteAll(insideLock: self.flight != nil, into: &woken)
        return woken
    }

    mutating func register(_ machine: RequestMachine) {
        guard !machine.registered else { return }
        machine.registered = true
        machine.previous = lastRequest
        machine.next = nil
        if let last = lastRequest { last.next = machine } else { firstRequest = machine }
        lastRequest = machine
        requestCount += 1
    }

    mutating func unregister(_ machine: RequestMachine) {
        guard machine.registered else { return }
        machine.registered = false
        let next = machine.next
        if let previous = machine.previous { previous.next = next } else { firstRequest = next }
        if let next { next.previous = machine.previous } else { lastRequest = machine.previous }
        machine.next = nil
        machine.previous = nil
        requestCount -= 1
    }

    /// The requests in flight, oldest (lowest number) first.
    var requests: [RequestMachine] {
        var all: [RequestMachine] = []
        all.reserveCapacity(requestCount)
        var current = firstRequest
        while let machine = current {
            all.append(machine)
            current = machine.next
        }
        return all
    }

    /// Requests still registered or waiting on a refresh: zero once every `send` has returned.
    var leftovers: Int { requestCount + (flight?.live.count ?? 0) + dispatcher.inFlight + dispatcher.queued }
}

/// Immutable credentials behind one reference (see `EngineState.credentialsBox`).
final class CredentialsBox: Sendable {
    let credentials: Credentials
    init(_ credentials: Credentials) { self.credentials = credentials }
}
