import Foundation

/// The engine's mutable state, all of it, behind one `Locked` pthread mutex (see `PolicyEngine`):
/// the session (credentials, generations, the refresh in flight, the cooldown), one ``Slot`` per
/// request in flight (what others reach it by), the dispatcher's queues and the retry budget.
/// A request's loop keeps only its own fields on its ``RequestMachine``.
struct EngineState {
    /// One request's part of the shared state: what a logout, a timer, the refresh it waits for,
    /// the dispatcher and its caller's cancellation reach it by.
    struct Slot {
        /// Where the request is, with what that phase needs (its attempt, the timer that counts,
        /// the refresh it waits for, why it was woken).
        var phase = Phase.running
        var endReason: EndReason?
        /// The park in progress, resumed by whoever wakes or ends the request.
        var parked: UnsafeContinuation<Void, Never>?
        /// The last timer token handed out: each timer the request arms takes the next one, so a
        /// stale firing (of an attempt that ended, a wait that ended) carries an older one.
        var timerTokens: UInt64 = 0
        /// Its timer node may be on the timer heap (armed, not yet fired or taken off): the
        /// request's own task takes it off when the wait or the attempt ends some other way.
        var timerScheduled = false
        /// Holds one of its host's dispatch slots (see ``Dispatcher``).
        var holdsSlot = false
        /// Has been on the wire (it leaves a dispatch queue ahead of those that have not).
        var sent = false
        /// The host whose dispatch slots it takes; `nil` when dispatch is unlimited.
        let host: String?
        let dispatchLimit: Int
        /// Its scope's `refresh.hold-new-requests`.
        let holdsNewRequests: Bool
        /// When it must have its outcome (its scope's `deadline` from its start): every wait is
        /// bounded by it.
        let deadline: Duration?

        /// Takes the next timer token: the timer armed with it is the one that counts.
        mutating func nextTimer() -> UInt64 {
            timerTokens &+= 1
            timerScheduled = true
            return timerTokens
        }

        /// The timer token that counts in the current phase (0: none).
        var armedTimer: UInt64 { phase.timer }

        /// The id of the refresh this request waits for, while it does.
        var awaitedFlight: UInt64? {
            switch phase {
            case .held(let wait), .awaitingRefresh(let wait): return wait.flight
            default: return nil
            }
        }

        /// Where a failure of the refresh it waits for leads it.
        var refreshRoute: RefreshRoute? {
            switch phase {
            case .held(let wait), .awaitingRefresh(let wait): return wait.route
            default: return nil
            }
        }
    }

    /// Where a request is. Each case carries what others reach it by in that phase; the timer
    /// token in each is the one a firing must carry to count (0: none armed).
    enum Phase {
        /// Its own task runs its loop (deciding, signing): nothing outside waits on it.
        case running
        /// On the wire: its attempt (cancelled by a logout, its timeout or its caller), its
        /// timeout's token, and whether the timeout fired.
        case onWire(AttemptCancellation, timer: UInt64, timedOut: Bool)
        /// Waiting for its backoff's timer.
        case backoff(timer: UInt64)
        /// About to go out, held until the refresh in flight ends (`hold-new-requests`).
        case held(RefreshWait)
        /// Waiting for a refresh it started or joined (a trigger, ahead of expiry, signing in).
        case awaitingRefresh(RefreshWait)
        /// In its host's dispatch queue, with its deadline's token.
        case queued(timer: UInt64)
        /// Woken (`Wake` says by what) and not yet running: its own task picks the wake up. The
        /// token of a deadline timer still armed (its firing now finds nothing to do).
        case woken(Wake, timer: UInt64)

        /// The timer token that counts (0: none).
        var timer: UInt64 {
            switch self {
            case .onWire(_, let timer, _), .backoff(let timer), .queued(let timer): return timer
            case .held(let wait), .awaitingRefresh(let wait): return wait.timer
            case .running, .woken: return 0
            }
        }

        /// The same phase with its timer disarmed (a firing then does nothing).
        var disarmed: Phase {
            switch self {
            case .onWire(let attempt, _, let timedOut): return .onWire(attempt, timer: 0, timedOut: timedOut)
            case .backoff: return .backoff(timer: 0)
            case .queued: return .queued(timer: 0)
            case .held(var wait):
                wait.timer = 0
                return .held(wait)
            case .awaitingRefresh(var wait):
                wait.timer = 0
                return .awaitingRefresh(wait)
            case .running, .woken: return self
            }
        }

        var isOnWire: Bool { if case .onWire = self { true } else { false } }
        var isQueued: Bool { if case .queued = self { true } else { false } }
        var isBackoff: Bool { if case .backoff = self { true } else { false } }
        var isWoken: Bool { if case .woken = self { true } else { false } }
        var isRunning: Bool { if case .running = self { true } else { false } }
    }

    /// A wait for the refresh in flight: its id, where its failure leads the request, and the
    /// token of the request's deadline timer (0: none).
    struct RefreshWait {
        let flight: UInt64
        /// Where a failure of the refresh leads it (``RefreshRoute``); `nil` when the failure
        /// cannot end the session through it (held with a token still valid).
        let route: RefreshRoute?
        var timer: UInt64 = 0
    }

    /// Why a park ended, set by whoever ends it.
    enum Wake {
        /// Its timer fired (a backoff's end, or the deadline of a wait).
        case timer
        /// The refresh it waited for ended. `logout`: the logout its failure led to, decided and
        /// started (cooldown, the other requests ended) in the transition that ended the refresh;
        /// this request performs its effects (the event, the logout plugin).
        case flight(FlightResult, logout: DecidedLogout?)
        /// A dispatch slot is its own now.
        case dispatched

        /// Whether both are the same kind of wake (a flight's result aside).
        func sameKind(as other: Wake) -> Bool {
            switch (self, other) {
            case (.timer, .timer), (.dispatched, .dispatched), (.flight, .flight): return true
            default: return false
            }
        }
    }

    /// A logout decided for a request (see ``Slot/decidedLogout``), boxed: every slot carries the
    /// field, and an escalation inline (edge texts, logout settings) would grow each by ~100 bytes.
    final class DecidedLogout: Sendable {
        let escalation: RuleGraph.Escalation
        init(_ escalation: RuleGraph.Escalation) { self.escalation = escalation }
    }

    /// Which compiled edges a waiter follows when the refresh it waits for fails: its rule's
    /// `on-failure` (or the `refresh-answer` edge, when the token endpoint's answer matches a
    /// logout rule), or the scope's before-sending `on-failure` (`rule == nil`: signing in, or
    /// held with no usable token). A reference and an index: a waiting slot stays small.
    struct RefreshRoute {
        let scope: RuleGraph.Scope
        let rule: Int?

        /// The escalation a failed refresh takes for this waiter.
        func escalation(answerLogsOut: Bool) -> RuleGraph.Escalation? {
            guard let rule else { return scope.beforeSendingFailure }
            let flow = scope.compiled[rule]
            if answerLogsOut, let answer = flow.refreshAnswer { return answer }
            return flow.onFailure
        }
    }

    /// Why a request was ended from outside its own loop.
    enum EndReason { case loggedOut, cancelled }

    /// What a refresh waiter finds when it wakes.
    enum FlightResult: Sendable {
        case ok
        /// The coordinator answered the refresh with credentials the fleet already held, newer
        /// than those that failed (no token call was made for it): the waiters are re-sent with
        /// them, and that re-send is the generation rule's, not one of their refreshes (SPEC "When
        /// a session ends"; issue 19, invariant d).
        case adopted
        /// This engine's own token call answered, but the pair was read at or past the refresh's
        /// deadline (``RefreshFlight/Ending/late``): a process frozen or starved while the answer
        /// waited. Its access token may have expired meanwhile, so the waiters' re-send with it is
        /// not one of their refreshes either: a refusal of it leads to another refresh (with the
        /// refresh token the server has just issued), not to `on-exhausted`, so a freeze never
        /// ends the session (SPEC "When a session ends": only the server does).
        case late
        case failed(RefreshFailure)
        case loggedOut
        case cancelled
        /// The refresh ended after a logout or a sign-in began a new session: its token was
        /// discarded, so the waiter decides again (retry with the signed-in token, or refresh).
        case superseded
        /// The refresh could not be coordinated with the fleet (the store unavailable past
        /// `refresh.timeout`, another holder that never reported back): the request fails with the
        /// reason, and the session goes on. Never an `on-failure` edge: coordination trouble is
        /// not the server's answer, so it never logs anyone out (issue 19, invariant b).
        case unavailable(RefreshFailure)
    }

    /// The refresh in progress and the requests waiting for it (see ``RefreshFlight/Flight``).
    typealias Flight = RefreshFlight.Flight

    var runtime: PolicyRuntime
    /// Boxed: every attempt reads the credentials under the lock, and copying the box out is one
    /// retain where copying the struct is one per string in it.
    var credentialsBox: CredentialsBox?
    var credentials: Credentials? {
        get { credentialsBox?.credentials }
        set { credentialsBox = newValue.map { CredentialsBox($0) } }
    }
    /// Bumped by every successful refresh and sign-in: a request signed with an older
    /// generation that hits a trigger retries at once with the newer token.
    var generation: UInt64 = 0
    /// The refresh: the flight in progress, the remembered definitive answer, `refresh.limit`'s
    /// window, the token endpoint's `Retry-After`, a pair not yet published (see ``RefreshFlight``).
    var refresh = RefreshFlight()
    /// The flight in progress.
    var flight: Flight? { refresh.current }
    /// The newest token generation a server accepted (a response to a request signed with it that
    /// was not a refresh or logout trigger): a refresh of a token that was accepted is a healthy
    /// rotation; one whose token was refused before any response accepted it did not help, and
    /// `refresh.limit` counts it.
    var acceptedGeneration: UInt64 = 0
    var loggedOutUntil: Duration?
    /// The cooldown's end on the wall clock, fixed at logout so every refusal reports the same.
    var loggedOutUntilDate: Date?
    /// Why the session in its cooldown ended.
    var logoutReason: LogoutReason?
    /// Bumped by every logout and sign-in: a refresh that started before either does not
    /// replace the credentials of the session that followed.
    var sessionEpoch: UInt64 = 0
    /// Bumped by every sign-in only: a refresh that ends after a logout, but with no sign-in since
    /// it started, still holds the newest tokens the server issued (a rotated refresh token the
    /// old one no longer replaces), so they are kept; the session stays logged out.
    var signInEpoch: UInt64 = 0
    /// ``generation`` right after the last sign-in (0 before any): an attempt signed with an
    /// older generation carried the previous session's token (or none), so a logout code in its
    /// answer ends that session, which is already over, and not the one signed in since.
    var signInGeneration: UInt64 = 0
    /// One slot per request in flight, by request number.
    var slots: [UInt64: Slot] = [:]
    var nextRequest: UInt64 = 0
    var budget = RetryBudgetWindow()
    /// The per-host queue of `dispatch:`.
    var dispatcher = Dispatcher()
    /// The generation of the credentials held, as the ``SessionCoordinator`` numbers them (0:
    /// none shared yet). Compared with what the coordinator publishes; the local `generation`
    /// keeps counting every change for the requests' own bookkeeping.
    var sharedGeneration: UInt64 = 0
    /// The last shared generation the coordinator was told a response accepted.
    var reportedAcceptance: UInt64 = 0
    /// The session epoch of the credentials held, as the coordinator numbers it (the shared
    /// generation of the sign-in they descend from; 0: none known): what a logout decided on them
    /// is published in (``SessionCoordinator/publishLogout(until:reason:epoch:)``).
    var sharedEpoch: UInt64 = 0
    /// What the coordinator reported and has not recovered from (``PolicyEngine/problems``).
    var coordinationProblem: PluginError?
    /// Callers of `waitForBackgroundWork` waiting for the refresh to settle (no flight, no call out).
    var refreshSettled: [UnsafeContinuation<Void, Never>] = []
    /// Refreshes and logout calls running in the background, for `waitForBackgroundWork`.
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

    /// The requests still waiting for `flight`, oldest first.
    func live(_ flight: Flight) -> [UInt64] {
        flight.waiters.filter { slots[$0]?.awaitedFlight == flight.id }.sorted()
    }

    /// Runs `body` on request `id`'s slot in place (one lookup); `nil` when it has none.
    @inline(__always)
    mutating func modifySlot<R>(_ id: UInt64, _ body: (inout Slot) -> R) -> R? {
        guard let index = slots.index(forKey: id) else { return nil }
        return body(&slots.values[index])
    }

    /// Registers request `id` as waiting for the refresh in flight (`held`: before it goes out,
    /// under `hold-new-requests`), with a timer at its deadline. Returns the timer to arm.
    mutating func join(_ id: UInt64, route: RefreshRoute?, held: Bool = false) -> Actions {
        guard let current = flight?.id else { return [] }
        refresh.wait(id)
        var actions: Actions = []
        modifySlot(id) { slot in
            var wait = RefreshWait(flight: current, route: route)
            if let deadline = slot.deadline, slot.endReason == nil {
                wait.timer = slot.nextTimer()
                actions.append(.arm(at: deadline, token: wait.timer))
            }
            slot.phase = held ? .held(wait) : .awaitingRefresh(wait)
        }
        return actions
    }

    /// Wakes the requests waiting for `flight` with `result` and lets queued requests out; the
    /// continuations to resume are appended to `actions`. `logout`: the waiter whose edge the
    /// refresh's failure took into a logout, and that logout (see
    /// ``logOutForFailedRefresh(_:_:answerLogsOut:now:date:)``).
    ///
    /// In request order, so a simulation's output is the same every run. A waiter that has been
    /// on the wire before gets a dispatch slot now when one is free, ahead of the requests still
    /// waiting for their first attempt; then the queues move, signed with the new token.
    mutating func endWaits(
        _ flight: Flight, _ result: FlightResult, logout: (UInt64, DecidedLogout)? = nil,
        into actions: inout Actions
    ) {
        for id in live(flight) {
            let sent = modifySlot(id) { slot -> Bool in
                let decided = logout.flatMap { $0.0 == id ? $0.1 : nil }
                slot.phase = .woken(.flight(result, logout: decided), timer: slot.phase.timer)
                if let parked = slot.parked.take() { actions.append(.resume(parked)) }
                return slot.sent && slot.host != nil
            }
            if sent == true { reserveDispatchSlot(id) }
        }
        promoteAll(&actions)
    }

    /// Gives request `id` its slot, once.
    mutating func register(
        _ id: UInt64, host: String?, dispatchLimit: Int, holdsNewRequests: Bool, deadline: Duration? = nil
    ) {
        guard slots[id] == nil else { return }
        slots[id] = Slot(
            host: host, dispatchLimit: dispatchLimit, holdsNewRequests: holdsNewRequests, deadline: deadline)
    }

    /// The request numbers in flight, oldest first.
    var requestNumbers: [UInt64] { slots.keys.sorted() }

    /// Requests still registered or waiting on a refresh: zero once every `send` has returned.
    var leftovers: Int { slots.count + (flight.map { live($0).count } ?? 0) + dispatcher.inFlight + queuedCount }
}

/// Immutable credentials behind one reference (see `EngineState.credentialsBox`).
final class CredentialsBox: Sendable {
    let credentials: Credentials
    /// Seconds the access token was valid for when it was issued (`nil`: unknown): `ahead` never
    /// exceeds half of it. Given by a refresh of this engine, or read from the credentials'
    /// ``Credentials/issuedAt`` (adopted from the fleet, or stored), so a process that adopts a
    /// short-lived token does not refresh it before every request (issue 30, case 7).
    let lifetime: Double?

    init(_ credentials: Credentials, lifetime: Double? = nil) {
        self.credentials = credentials
        self.lifetime = lifetime ?? credentials.lifetimeAsIssued
    }

    /// How long before expiry to refresh ahead: `ahead`, but at most half the lifetime as issued,
    /// and never for a token issued already expired (it is sent; the server's answer decides).
    func effectiveAhead(_ ahead: Duration?) -> Double? {
        guard let seconds = ahead?.seconds else { return nil }
        guard let lifetime else { return seconds }
        return lifetime > 0 ? min(seconds, lifetime / 2) : nil
    }
}
