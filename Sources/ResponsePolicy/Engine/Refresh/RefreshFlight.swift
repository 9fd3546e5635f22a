import Foundation

/// The session's refresh, from trigger to end, as a value: which trigger starts a token call and
/// which waits, joins or fails without one; the plugin's calls, the transient backoff against
/// `refresh.timeout` and `Retry-After`, the coordinator's turns and the publication of the pair;
/// the remembered definitive answer and `refresh.limit`.
///
/// Every event is a `mutating func` that takes the time (and what it needs of the session,
/// ``SessionFacts``) and returns what to do next (``Step``, or the trigger's ``TriggerDecision``);
/// it never awaits, locks or reads a clock. ``EngineState`` runs it under the engine's lock, applies
/// an ending to the session and wakes the waiters in the same transition
/// (`EngineState.flightStep(_:now:date:)`), and the shell (`PolicyEngine+Refresh.swift`) only
/// performs the work it names: call the plugin, ask the coordinator, publish, arm a timer. So the
/// whole refresh is tested as a value with random event sequences (`RefreshFlightModelTests`).
///
/// What it guarantees (SPEC "The refresh token is irreplaceable"):
/// - one token call at a time for the session, and none while a call is out (a call that outlived
///   `refresh.timeout` runs on: its waiters fail, a trigger meanwhile waits for it, and a pair it
///   brings is kept);
/// - a definitive answer is not asked again within `refresh.timeout`, and each further definitive
///   answer for the same credentials holds four times longer, up to an hour: a wrong password is
///   not tried in a loop;
/// - no token call before a `Retry-After` ends, from any request (and, with a coordinator, from
///   any process: a holder's wait is stored and announced, ``heardRetryAfter(until:reason:now:)``,
///   and a turn answered ``RefreshTurn/retryAfter(until:reason:)`` waits for it);
/// - `refresh.limit` counts a refresh only when the token it issued was refused before any
///   response accepted it (a loop), and reaching it fails the requests, never the session;
/// - a 2xx answer with an access token is a pair kept, even when its access token cannot be used.
struct RefreshFlight {
    /// What the flight reads of the session it refreshes (owned by ``EngineState``).
    struct SessionFacts {
        var generation: UInt64
        var acceptedGeneration: UInt64
        var sessionEpoch: UInt64
        var signInEpoch: UInt64
        var sharedGeneration: UInt64
        var credentials: Credentials?
        var loggedOut: Bool
    }

    /// The request that started a flight: its context (for events; its runtime's plugins) and its
    /// scope (whose rules judge the token endpoint's answers, as if they answered it).
    struct Starter: Sendable {
        let context: RequestContext
        let scopeIndex: Int
    }

    /// How the session is shared (`coordination:`).
    enum Coordination: Sendable, Equatable {
        /// Only this engine: no turns, no publication.
        case local
        /// A coordinator: `waits` (`on-unavailable: wait`) asks again while it is unavailable;
        /// `unavailable`: it could not be made at all, so asking again cannot help.
        case shared(waits: Bool, unavailable: Bool)
    }

    /// What a flight is doing.
    enum Phase: Sendable {
        /// A refresh turn is asked of the coordinator.
        case asking
        /// The coordinator was unavailable: the turn is asked again at the flight's timer.
        case pausing
        /// Plugin call number n is out.
        case calling(Int)
        /// Between calls (a transient answer's backoff or `Retry-After`), or before the first one
        /// (a `Retry-After` another flight was given): the next call at the flight's timer.
        case waiting
    }

    /// A refresh in progress and the requests waiting for it.
    ///
    /// The waiter list lives in the state's copy; each waiter finds the result in its wake.
    struct Flight: Sendable {
        let id: UInt64
        let sessionEpoch: UInt64
        /// ``EngineState/signInEpoch`` when the refresh started.
        let signInEpoch: UInt64
        /// The coordinator's generation of the credentials being replaced.
        let sharedGeneration: UInt64
        /// The engine's generation of the credentials being replaced.
        let generation: UInt64
        /// The credentials being replaced: their refresh token is the one every call presents.
        let credentials: Credentials?
        let settings: RefreshSettings
        let coordination: Coordination
        /// ``RefreshContext/reason``: the rule, `ahead` or `sign-in`.
        let reason: String
        let starter: Starter
        /// The token it replaces was refused before any response accepted it: `refresh.limit`
        /// counts this refresh across the fleet too.
        let countsTowardLimit: Bool
        /// A trigger on a token this engine saw refused and never accepted (no refresh ahead):
        /// its turn asks with `refresh.limit`, and the store counts the generation when no process
        /// saw it accepted and a refresh made it (``CoordinationRecord``).
        var refusedToken = false
        /// Request numbers, in the order they began waiting; a waiter that left (cancelled,
        /// logged out) stays listed but its slot no longer names this flight.
        var waiters: [UInt64] = []
        var phase: Phase
        /// When its waiters stop waiting: `refresh.timeout` after it started (or after a trigger
        /// joined it once its first waiters were released).
        var deadline: Duration
        var calls = 0
        var turns = 0
        /// The shared generation the next turn asks past.
        var askedPast: UInt64
        var lease: RefreshLease?
        /// When the lease's term ends by this engine's clock (when its turn answered, plus the term
        /// the coordinator handed over); nil when the coordinator does not say.
        var leaseEnd: Duration?
        /// The last transient trouble, for the reason its waiters fail with.
        var last: RefreshFailure?
        var reportedUnavailable = false
        /// Its waiters were released at the deadline while a call was out: the call runs on, and a
        /// pair it brings is kept.
        var released = false
        /// Another process's credentials answered it while a call or publication of its own was
        /// out: it makes no new call, and ends when that returns.
        var detached = false
        /// The token of its timer that counts (a stale firing carries an older one).
        var timer: UInt64 = 0

        /// Whether it has a call or a turn out (its timer is then its deadline).
        var isOut: Bool {
            switch phase {
            case .asking, .calling: return true
            case .pausing, .waiting: return false
            }
        }
    }

    /// A call of the refresh plugin the shell makes: the flight, the call's number, the
    /// credentials whose refresh token it presents, and when the shell stops waiting for an answer
    /// (two timeouts: an answer after the first is still kept; with a coordinator, never past the
    /// lease's term, so no other process is granted a lease while this call may still be answered).
    struct Call: Sendable {
        let flight: UInt64
        let number: Int
        let credentials: Credentials?
        let reason: String
        let starter: Starter
        var giveUpAt: Duration
        /// The last moment the refresh token may be presented (the lease's term, less a margin):
        /// a call that could not leave before it (the process was frozen, starved) presents
        /// nothing (issue 30). `nil`: no lease bounds it.
        var presentBy: Duration? = nil
    }

    /// A timer of a flight (its deadline, its backoff, a pause before asking the coordinator again).
    struct Timer: Sendable, Equatable {
        let flight: UInt64
        let at: Duration
        let token: UInt64
    }

    /// A `refresh-retry` event: call `call` got transient trouble, the next is in `delay`.
    struct RetryNote: Sendable {
        let call: Int
        let delay: Duration
        let failure: RefreshFailure
    }

    /// What the plugin's call came to, judged by the shell outside the lock (the policy's rules
    /// on the token endpoint's answer: ``TokenAnswer/judged(_:ruleAction:)``).
    enum Answer: Sendable {
        /// A pair: the access token, the refresh token, the lifetime as issued (seconds; `nil`
        /// unknown).
        case pair(Credentials, lifetime: Double?)
        /// No pair. `logsOut`: the answer matches a `logout` rule.
        case failed(RefreshFailure, logsOut: Bool)
    }

    /// How a flight ended, for the session (``EngineState/flightEnded(_:_:now:date:)``).
    struct Ending: Sendable {
        var flight: Flight
        var outcome: Result<Credentials, RefreshFailure>
        /// The coordinator's generation of the credentials.
        var shared: UInt64?
        /// Coordination trouble, not the server's answer: its waiters fail and nobody is logged out.
        var trouble = false
        /// The fleet's credentials, taken without a token call of this engine.
        var adopted = false
        /// Credentials from this engine's own token call (what `refresh.limit` judges later).
        var issued = false
        /// The pair was read at or past the flight's deadline: the process was frozen (SIGSTOP, a
        /// VM pause, an app suspended) or starved while the answer waited, so its access token may
        /// have expired before it could be sent. Its waiters' re-send does not spend one of their
        /// refreshes (``EngineState/FlightResult/late``).
        var late = false
        /// The new access token's lifetime as issued, in seconds.
        var lifetime: Double?
        /// The token endpoint's answer matches a `logout` rule.
        var answerLogsOut = false
        /// Credentials the token endpoint returned with an answer the refresh could not use: their
        /// refresh token is kept.
        var kept: Credentials?
        /// The pair is published under this lease after the session took it (and saved it): a
        /// pair in hand never waits for the store, and survives the store's trouble.
        var unpublished: RefreshLease?
        /// Tell the coordinator that the turn failed.
        var endTurn: RefreshLease?
        /// Something to report as a `problem` event.
        var problem: String?
    }

    /// What the shell does for a flight next.
    enum Step: Sendable {
        /// Nothing (a stale event: an older timer, a flight already ended).
        case none
        /// Calls the plugin, its deadline timer armed (`nil`: none, the waiters were released).
        case call(Call, deadline: Timer?, problem: String?)
        /// Asks the coordinator for a turn, its deadline timer armed.
        case ask(flight: UInt64, RefreshTurnRequest, deadline: Timer?)
        /// Arms the flight's timer: the next call or turn is then. `retry`: the `refresh-retry`
        /// event of a transient answer.
        case wait(Timer, retry: RetryNote?, problem: String?)
        /// The deadline passed with a call or a turn out: the waiters fail with `failure` (the
        /// session goes on); the flight runs on, and a pair its call brings is kept.
        case release(flight: UInt64, RefreshFailure)
        /// The flight is over: the session takes the ending and its waiters are woken.
        case end(Ending)
    }

    /// A definitive answer remembered for the credentials it was given for.
    struct Remembered: Sendable {
        let generation: UInt64
        let failure: RefreshFailure
        let at: Duration
        /// How long it is answered from memory.
        let hold: Duration
        /// How many definitive answers in a row these credentials got.
        let count: Int
    }

    /// Why a trigger fails without a call.
    enum Refusal: String, Sendable {
        /// `refresh.limit`: refreshes whose tokens were refused at once.
        case limit
        /// The last answer for these credentials was definitive, a moment ago.
        case remembered
        /// The token endpoint asked to wait (`Retry-After`) past this request's `refresh.timeout`.
        case retryAfter = "retry-after"
    }

    /// What a refresh trigger leads to (``trigger(_:_:now:)``).
    enum TriggerDecision {
        /// The session is in its cooldown.
        case loggedOut
        /// A newer token exists (or one within `share-window`): retry with it now.
        case retryNow
        /// Wait for the refresh in flight (`rearm`: its deadline, armed again for a flight whose
        /// first waiters were released).
        case join(UInt64, rearm: Timer?)
        /// This trigger starts a refresh: the flight, and its first step.
        case start(Flight, Step)
        /// A failed refresh without a call.
        case refused(RefreshFailure, Refusal)
    }

    /// A refresh trigger: the generation the request's token had, the settings it runs under.
    struct Trigger {
        let failedGeneration: UInt64
        let settings: RefreshSettings
        /// Ahead of expiry, before sending, or signing in: never counted by `refresh.limit`.
        let proactive: Bool
        let reason: String
        let starter: Starter
        let coordination: Coordination
    }

    // MARK: - State

    /// The refresh in progress.
    private(set) var current: Flight?
    /// Flights that another process's credentials answered while a call or publication of theirs
    /// was out (``detach(_:)``): each ends when that returns.
    private(set) var detached: [Flight] = []
    private var nextID: UInt64 = 0
    private var nextTimer: UInt64 = 0
    /// When the last successful refresh ended (for `share-window`).
    var lastRefresh: Duration?
    /// The generation this engine's last token call issued (not adopted, not the initial token).
    var issuedGeneration: UInt64 = 0
    /// The last generation counted by `refresh.limit` (each is counted once).
    private var countedGeneration: UInt64 = 0
    /// When refreshes that did not help were found out (a trigger on the token they issued before
    /// any response accepted it), oldest first: what `refresh.limit` counts.
    private(set) var unhelped: [Duration] = []
    /// The last definitive answer, for the credentials it was given for.
    var remembered: Remembered?
    /// The coordinator's answers to this engine's refresh turns, by ``RefreshTurn/metricName``
    /// (for ``PolicyMetrics``): counted since the engine started.
    private(set) var turnAnswers: [String: UInt64] = [:]
    /// The end of the longest `Retry-After` the token endpoint asked for, and that answer.
    private(set) var embargo: (until: Duration, failure: RefreshFailure)?
    /// A pair this engine's refresh produced, taken and saved, not yet stored by the coordinator
    /// (published right after the refresh; while the coordinator is unavailable, kept and used here
    /// and published when it is back).
    var unpublished: (credentials: Credentials, lease: RefreshLease)? {
        didSet { if unpublished?.lease != oldValue?.lease { unpublishedReported = false } }
    }
    /// The coordinator's unavailability was reported for the pair not yet published.
    var unpublishedReported = false

    /// Nothing in progress: no flight, no call out.
    var isIdle: Bool { current == nil && detached.isEmpty }

    /// The longest a definitive answer is held: `1h`.
    static let longestHold = Duration.seconds(3600)

    // MARK: - Trigger

    /// Decides what a refresh trigger does. In order: the cooldown refuses it; a request whose
    /// token is older than the current one retries at once; a refresh in flight is joined; within
    /// `share-window` after a refresh it retries without one; a definitive answer for these
    /// credentials a moment ago is answered from memory; `refresh.limit` (refreshes whose token was
    /// refused before any response accepted it) fails it; a `Retry-After` that ends past its
    /// `refresh.timeout` fails it; otherwise a refresh starts (its first call after a `Retry-After`
    /// that ends within its timeout).
    mutating func trigger(_ t: Trigger, _ session: SessionFacts, now: Duration) -> TriggerDecision {
        if session.loggedOut { return .loggedOut }
        if session.generation > t.failedGeneration { return .retryNow }
        if var flight = current {
            guard flight.released else { return .join(flight.id, rearm: nil) }
            // Its first waiters gave up at its deadline while its call ran on: the new ones get a
            // timeout of their own, and still no second call.
            flight.released = false
            flight.deadline = now + t.settings.timeout
            var rearm: Timer?
            if flight.isOut { rearm = arm(&flight, at: flight.deadline) }
            current = flight
            return .join(flight.id, rearm: rearm)
        }
        if !t.proactive, let last = lastRefresh, now - last < t.settings.shareWindow { return .retryNow }
        if let memory = remembered, memory.generation == session.generation {
            if now - memory.at < memory.hold {
                var again = memory.failure
                again.kind = .transient
                again.keeping = nil
                again.reason +=
                    " (the last answer for these credentials; not asked again within \(memory.hold.policyText))"
                return .refused(again, .remembered)
            }
        }
        // A refresh that did not help: the token this engine's last call issued was refused
        // before any response accepted it. Counted once, when it is found out.
        let unhelpedNow =
            !t.proactive && session.generation == issuedGeneration && session.generation > 0
            && session.acceptedGeneration < session.generation
        if let limit = t.settings.limit {
            unhelped.removeAll { now - $0 >= limit.per }
            if unhelpedNow, countedGeneration != session.generation {
                countedGeneration = session.generation
                unhelped.append(now)
            }
            if unhelpedNow, unhelped.count >= limit.count {
                return .refused(
                    RefreshFailure(
                        "refresh.limit: \(unhelped.count) refreshes in \(limit.per.policyText) issued tokens the server"
                            + " refused at once; none is asked again until the window allows (the session goes on)",
                        kind: .transient), .limit)
            }
        }
        if let embargo, now < embargo.until, embargo.until >= now + t.settings.timeout {
            let wait = embargo.until - now
            return .refused(
                RefreshFailure(
                    "\(embargo.failure.reason); the token endpoint asked to wait \(wait.policyText) more"
                        + " (Retry-After), past refresh.timeout (\(t.settings.timeout.policyText))",
                    response: embargo.failure.response, kind: .transient), .retryAfter)
        }
        nextID += 1
        var flight = Flight(
            id: nextID, sessionEpoch: session.sessionEpoch, signInEpoch: session.signInEpoch,
            sharedGeneration: session.sharedGeneration, generation: session.generation,
            credentials: session.credentials, settings: t.settings, coordination: t.coordination, reason: t.reason,
            starter: t.starter, countsTowardLimit: unhelpedNow, phase: .waiting, deadline: now + t.settings.timeout,
            askedPast: session.sharedGeneration)
        flight.refusedToken = !t.proactive && session.acceptedGeneration < session.generation
        let step: Step
        if let embargo, now < embargo.until {
            // No call before the wait the token endpoint asked for ends, from any request.
            step = .wait(arm(&flight, at: embargo.until), retry: nil, problem: nil)
        } else {
            step = begin(&flight, now: now)
        }
        current = flight
        return .start(flight, step)
    }

    /// The first call or turn of `flight`.
    private mutating func begin(_ flight: inout Flight, now: Duration) -> Step {
        guard case .shared = flight.coordination, flight.lease == nil else { return call(&flight, now: now) }
        return ask(&flight, now: now)
    }

    private mutating func call(_ flight: inout Flight, now: Duration, problem: String? = nil) -> Step {
        flight.calls += 1
        flight.phase = .calling(flight.calls)
        let deadline = flight.released ? nil : arm(&flight, at: flight.deadline)
        var call = Call(
            flight: flight.id, number: flight.calls, credentials: flight.credentials, reason: flight.reason,
            starter: flight.starter, giveUpAt: now + flight.settings.timeout * 2)
        if let leaseEnd = flight.leaseEnd {
            // The lease's term, less the publication's margin: a call given up on before another
            // process can be granted a lease (issue 30: a late pair is kept, never presented twice).
            let bound = leaseEnd - min(flight.settings.timeout / 10, .seconds(1))
            call.giveUpAt = min(call.giveUpAt, max(now, bound))
            call.presentBy = max(now, bound)
        }
        return .call(call, deadline: deadline, problem: problem)
    }

    private mutating func ask(_ flight: inout Flight, now: Duration) -> Step {
        flight.turns += 1
        flight.phase = .asking
        // The store judges the generation fleet-wide (made by a refresh, accepted nowhere).
        let limit =
            flight.countsTowardLimit || flight.refusedToken ? flight.settings.limit.map { ($0.count, $0.per) } : nil
        let request = RefreshTurnRequest(
            failedGeneration: flight.askedPast, timeout: max(flight.deadline - now, .milliseconds(1)), limit: limit)
        return .ask(flight: flight.id, request, deadline: flight.released ? nil : arm(&flight, at: flight.deadline))
    }

    private mutating func arm(_ flight: inout Flight, at: Duration) -> Timer {
        nextTimer += 1
        flight.timer = nextTimer
        return Timer(flight: flight.id, at: at, token: nextTimer)
    }

    // MARK: - Events of a flight

    /// Flight `id`, the current one or a detached one; `nil` when it has ended.
    private func find(_ id: UInt64) -> Flight? {
        if current?.id == id { return current }
        return detached.first { $0.id == id }
    }

    /// Puts `flight` back after an event changed it, and removes it when `step` ends it.
    private mutating func put(_ flight: Flight, _ step: Step) -> Step {
        if current?.id == flight.id {
            current = flight
        } else if let index = detached.firstIndex(where: { $0.id == flight.id }) {
            detached[index] = flight
        }
        return settle(step)
    }

    /// An ending leaves the state in the same transition.
    private mutating func settle(_ step: Step) -> Step {
        guard case .end(let ending) = step else { return step }
        if current?.id == ending.flight.id { current = nil }
        detached.removeAll { $0.id == ending.flight.id }
        return step
    }

    /// The plugin's call `number` of flight `id` answered (or the shell gave up waiting for it).
    mutating func answered(
        _ id: UInt64, call number: Int, _ answer: Answer, _ session: SessionFacts, now: Duration, date: Date
    ) -> Step {
        guard var flight = find(id) else { return .none }
        let step = answered(&flight, call: number, answer, now: now, date: date)
        return put(flight, step)
    }

    private mutating func answered(
        _ flight: inout Flight, call number: Int, _ answer: Answer, now: Duration, date: Date
    ) -> Step {
        do {
            guard case .calling(number) = flight.phase else { return .none }
            switch answer {
            case .pair(let credentials, let lifetime):
                if let reason = TokenAnswer.unsendable(credentials.accessToken) {
                    // The server issued (and with rotation spent the old refresh token for) this
                    // pair: its refresh token is kept, and the refresh fails with the reason.
                    let failure = RefreshFailure(
                        "the token endpoint's answer cannot be used: \(reason); its refresh token is kept",
                        kind: .transient, keeping: credentials)
                    return failed(&flight, failure, logsOut: false, now: now, date: date)
                }
                // The session takes the pair now (and saves it); with a coordinator it is published
                // under the lease after that.
                var ending = Ending(flight: flight, outcome: .success(credentials), issued: true, lifetime: lifetime)
                ending.late = now >= flight.deadline
                if case .shared = flight.coordination { ending.unpublished = flight.lease }
                return .end(ending)
            case .failed(let failure, let logsOut):
                return failed(&flight, failure, logsOut: logsOut, now: now, date: date)
            }
        }
    }

    /// A call of `flight` brought no pair: a definitive answer ends it; transient trouble is
    /// asked again after the backoff or the `Retry-After` (obeyed in full), when that ends within
    /// the flight's timeout; otherwise it ends with the trouble's reason.
    private mutating func failed(
        _ flight: inout Flight, _ failure: RefreshFailure, logsOut: Bool, now: Duration, date: Date
    ) -> Step {
        var ending = Ending(flight: flight, outcome: .failure(failure), answerLogsOut: logsOut)
        // (A token answer over its size limit, `endsRefresh`, would be the same answer again.)
        if failure.isDefinitive || failure.keeping != nil || failure.endsRefresh {
            ending.kept = failure.keeping
            ending.endTurn = flight.lease
            return .end(ending)
        }
        let requested = TokenAnswer.requestedWait(failure, date: date)
        if let requested, requested > .zero, flight.settings.transient?.honorRetryAfter ?? true {
            let until = now + requested
            if embargo.map({ until > $0.until }) ?? true { embargo = (until, failure) }
        }
        flight.last = failure
        guard let transient = flight.settings.transient, !flight.released, !flight.detached else {
            ending.outcome = .failure(outlasted(flight, failure, now: now))
            ending.endTurn = flight.lease
            return .end(ending)
        }
        let delay = transient.delay(afterCall: flight.calls, requested: requested)
        guard now + delay < flight.deadline else {
            var reason = outlasted(flight, failure, now: now)
            if let requested, transient.honorRetryAfter, requested >= delay {
                reason.reason =
                    "\(failure.reason); the token endpoint asked to wait \(requested.policyText) (Retry-After), past"
                    + " refresh.timeout (\(flight.settings.timeout.policyText)); no token call before it ends"
            }
            ending.outcome = .failure(reason)
            ending.endTurn = flight.lease
            return .end(ending)
        }
        flight.phase = .waiting
        return .wait(
            arm(&flight, at: now + delay), retry: RetryNote(call: flight.calls, delay: delay, failure: failure),
            problem: nil)
    }

    /// What `flight` does instead of a call while a `Retry-After` runs (nil: none runs): past its
    /// deadline its requests fail with the reason (its lease given back with the wait); within it,
    /// the call waits for the end, under its lease when the lease outlasts the wait, else asking
    /// for a turn again then (the lease lapses meanwhile; the store grants none before the end).
    private mutating func heldBack(_ flight: inout Flight, now: Duration) -> Step? {
        guard let embargo, now < embargo.until else { return nil }
        guard embargo.until < flight.deadline, !flight.detached else {
            let failure = RefreshFailure(
                "\(embargo.failure.reason); the token endpoint asked to wait \((embargo.until - now).policyText) more"
                    + " (Retry-After), past refresh.timeout (\(flight.settings.timeout.policyText))", kind: .transient)
            return .end(Ending(flight: flight, outcome: .failure(failure), endTurn: flight.lease))
        }
        flight.last = RefreshFailure(embargo.failure.reason, kind: .transient)
        if let leaseEnd = flight.leaseEnd, embargo.until >= leaseEnd - min(flight.settings.timeout / 10, .seconds(1)) {
            flight.lease = nil
            flight.leaseEnd = nil
            flight.phase = .pausing
        } else {
            flight.phase = .waiting
        }
        return .wait(arm(&flight, at: embargo.until), retry: nil, problem: nil)
    }

    /// `failure` as the reason transient trouble outlasted the flight's timeout.
    private func outlasted(_ flight: Flight, _ failure: RefreshFailure, now: Duration) -> RefreshFailure {
        var outlasted = failure
        outlasted.kind = .transient
        if case .pausing = flight.phase { return outlasted }
        if flight.calls > 1 || now < flight.deadline {
            outlasted.reason =
                "\(failure.reason); transient trouble outlasted refresh.timeout"
                + " (\(flight.settings.timeout.policyText), \(flight.calls) call\(flight.calls == 1 ? "" : "s"))"
        }
        return outlasted
    }

    /// The coordinator answered flight `id`'s turn (`date`: the wall clock at `now`, to read a
    /// ``RefreshTurn/retryAfter(until:reason:)``'s end).
    mutating func turn(_ id: UInt64, _ turn: RefreshTurn, now: Duration, date: Date) -> Step {
        guard var flight = find(id) else { return .none }
        turnAnswers[turn.metricName, default: 0] += 1
        let step = turned(&flight, turn, now: now, date: date)
        return put(flight, step)
    }

    /// Another process's token call was asked to wait (`Retry-After`) until `until` (this
    /// engine's clock): no call from here before it ends either, as if this engine had been asked.
    mutating func heardRetryAfter(until: Duration, reason: String, now: Duration) {
        guard until > now, embargo.map({ until > $0.until }) ?? true else { return }
        embargo = (until, RefreshFailure(reason, kind: .transient))
    }

    /// `until` (a wall-clock time) on this engine's clock, never more than the longest wait the
    /// engine obeys from `now`.
    static func engineTime(_ until: Date, now: Duration, date: Date) -> Duration {
        let left = max(0, min(until.timeIntervalSince(date), TokenAnswer.maxRequestedWait.seconds))
        return now + .milliseconds(Int64((left * 1000).rounded(.up)))
    }

    private mutating func turned(_ flight: inout Flight, _ turn: RefreshTurn, now: Duration, date: Date) -> Step {
        do {
            guard case .asking = flight.phase, case .shared(let waits, let unavailable) = flight.coordination else {
                return .none
            }
            switch turn {
            case .newer(let session)
            where session.credentials?.sameTokens(as: flight.credentials) == true
                && session.generation > flight.askedPast && flight.turns < 4:
                // A "newer" session holding the very credentials that failed only numbers them (a
                // store that seeded the coordinator learns its generation this way): ask again.
                flight.askedPast = session.generation
                return ask(&flight, now: now)
            case .newer(let session), .published(let session):
                var ending = Ending(
                    flight: flight, outcome: .success(session.credentials ?? Credentials(accessToken: "")))
                guard let credentials = session.credentials, !credentials.sameTokens(as: flight.credentials) else {
                    ending.outcome = .failure(
                        RefreshFailure("the shared session holds no newer credentials", kind: .transient))
                    ending.trouble = true
                    return .end(ending)
                }
                ending.outcome = .success(credentials)
                ending.shared = session.generation
                // `.newer`: the fleet held these before this refresh asked (no token call for it).
                if case .newer = turn { ending.adopted = true }
                return .end(ending)
            case .failedElsewhere(let reason):
                // The holder's own failure (a definitive one logs it out, and that logout is
                // published); here it only fails the requests that waited for it.
                var ending = Ending(
                    flight: flight,
                    outcome: .failure(
                        RefreshFailure("the refresh failed in another process: \(reason)", kind: .transient)))
                ending.trouble = true
                return .end(ending)
            case .limited:
                var ending = Ending(
                    flight: flight,
                    outcome: .failure(
                        RefreshFailure(
                            "refresh.limit is used up across the processes sharing the session", kind: .transient)))
                ending.trouble = true
                return .end(ending)
            case .retryAfter(let until, let reason):
                // A holder in another process was asked to wait: no call before it ends, from here
                // either. Within refresh.timeout the turn is asked again then; past it the
                // requests fail with the reason (coordination's answer, never a logout).
                let end = Self.engineTime(until, now: now, date: date)
                heardRetryAfter(until: end, reason: reason, now: now)
                let wait = end - now
                let failure = RefreshFailure(
                    "\(reason); the token endpoint asked to wait \(wait.policyText) more (Retry-After, another"
                        + " process was told), past refresh.timeout (\(flight.settings.timeout.policyText)); no token"
                        + " call before it ends", kind: .transient)
                guard end < flight.deadline, !flight.detached else {
                    var ending = Ending(flight: flight, outcome: .failure(failure))
                    ending.trouble = true
                    return .end(ending)
                }
                flight.last = failure
                flight.phase = .pausing
                return .wait(arm(&flight, at: end), retry: nil, problem: nil)
            case .lease(let lease):
                flight.lease = lease
                flight.leaseEnd = lease.term.map { now + $0 }
                // Granted before the store held a wait this engine has heard of since: no call yet.
                if let held = heldBack(&flight, now: now) { return held }
                return call(&flight, now: now)
            case .unavailable(let reason):
                guard waits else {
                    return call(
                        &flight, now: now,
                        problem: "coordination unavailable (\(reason)); refreshing in this process alone"
                            + " (on-unavailable: local)")
                }
                let left = flight.deadline - now
                flight.last = RefreshFailure(
                    "coordination unavailable for refresh.timeout (\(flight.settings.timeout.policyText)): \(reason);"
                        + " the request fails and the session stays (on-unavailable: wait)", kind: .transient)
                guard !unavailable, left > .zero, !flight.detached else {
                    var ending = Ending(
                        flight: flight,
                        outcome: .failure(
                            RefreshFailure(
                                unavailable
                                    ? "coordination unavailable: \(reason)"
                                    : "coordination unavailable for refresh.timeout"
                                        + " (\(flight.settings.timeout.policyText)): \(reason); the request fails and the"
                                        + " session stays (on-unavailable: wait)", kind: .transient)))
                    ending.trouble = true
                    return .end(ending)
                }
                var problem: String?
                if !flight.reportedUnavailable {
                    flight.reportedUnavailable = true
                    problem =
                        "coordination unavailable (\(reason)); the refresh waits up to"
                        + " \(flight.settings.timeout.policyText) for it (on-unavailable: wait)"
                }
                let pause = min(left, .milliseconds(min(1000, 50 << min(flight.turns - 1, 5))))
                flight.phase = .pausing
                return .wait(arm(&flight, at: now + pause), retry: nil, problem: problem)
            }
        }
    }

    /// Flight `id`'s timer fired: a backoff's or a pause's end (the next call or turn), or its
    /// deadline with a call or turn out (its waiters are released; the flight runs on).
    mutating func timerFired(_ id: UInt64, token: UInt64, _ session: SessionFacts, now: Duration) -> Step {
        guard var flight = find(id) else { return .none }
        let step = fired(&flight, token: token, session, now: now)
        return put(flight, step)
    }

    private mutating func fired(_ flight: inout Flight, token: UInt64, _ session: SessionFacts, now: Duration) -> Step {
        do {
            guard token == flight.timer else { return .none }
            flight.timer = 0
            switch flight.phase {
            case .asking, .calling:
                guard !flight.released else { return .none }
                flight.released = true
                var failure = RefreshFailure(
                    "the refresh took longer than \(flight.settings.timeout.policyText)", kind: .transient)
                if case .asking = flight.phase {
                    failure.reason += " (no refresh turn from the coordinator in that time)"
                } else if let last = flight.last {
                    // The call cut short says less than the trouble before it.
                    failure = outlasted(flight, last, now: now)
                }
                return .release(flight: flight.id, failure)
            case .waiting, .pausing:
                if now >= flight.deadline {
                    // (A pause never ends past the deadline but may end on it.)
                    var ending = Ending(
                        flight: flight,
                        outcome: .failure(
                            flight.last.map { outlasted(flight, $0, now: now) }
                                ?? RefreshFailure(
                                    "the refresh took longer than \(flight.settings.timeout.policyText)",
                                    kind: .transient)),
                        endTurn: flight.lease)
                    if case .pausing = flight.phase { ending.trouble = true }
                    return .end(ending)
                }
                // The session this refresh was for has ended (a logout, a sign-in): no more calls.
                guard flight.sessionEpoch == session.sessionEpoch, !flight.detached else {
                    return .end(
                        Ending(
                            flight: flight,
                            outcome: .failure(
                                flight.last
                                    ?? RefreshFailure("the session ended during the refresh", kind: .transient)),
                            endTurn: flight.lease))
                }
                if case .pausing = flight.phase { return ask(&flight, now: now) }
                // A wait heard since this backoff was armed (another process was asked).
                if let held = heldBack(&flight, now: now) { return held }
                return begin(&flight, now: now)
            }
        }
    }

    /// Another process's credentials answer the refresh in flight: its waiters go on with them (the
    /// caller wakes them). A flight with a call or publication out is kept, detached, until that
    /// returns (a pair it brings is still judged against what is held then); one between calls
    /// ends here. Returns the flight whose waiters to wake.
    mutating func detach() -> Flight? {
        guard let flight = current else { return nil }
        current = nil
        if flight.isOut {
            var kept = flight
            kept.detached = true
            kept.waiters = []
            detached.append(kept)
        }
        return flight
    }

    /// Adds request `id` to the waiters of the flight in progress.
    mutating func wait(_ id: UInt64) {
        current?.waiters.append(id)
    }

    /// Drops every waiter of the flight in progress but `keep` (a logout ended them).
    mutating func dropWaiters(keeping keep: UInt64?) {
        current?.waiters.removeAll { $0 != keep }
    }

    /// Its waiters were released at the deadline (``Step/release(flight:_:)``).
    mutating func released(_ id: UInt64) {
        if current?.id == id { current?.waiters = [] }
    }

    /// Records what the session took from a flight's ending: a definitive answer is remembered for
    /// `generation` (the credentials it was given for, or those a kept pair made), four times
    /// longer each time the same credentials get one again; a success is a new generation
    /// (`issued`: by this engine's own call, which `refresh.limit` judges later).
    mutating func ended(
        _ ending: Ending, generation: UInt64, tookCredentials: Bool, remember: Bool, now: Duration
    ) {
        if tookCredentials, case .success = ending.outcome {
            lastRefresh = now
            if ending.issued { issuedGeneration = generation }
            remembered = nil
        }
        guard remember, case .failure(let failure) = ending.outcome else { return }
        let again = remembered.map { $0.generation == ending.flight.generation || $0.generation == generation } ?? false
        let count = again ? (remembered?.count ?? 0) + 1 : 1
        var hold = ending.flight.settings.timeout
        for _ in 1..<count where hold < Self.longestHold { hold = hold * 4 }
        remembered = Remembered(
            generation: generation, failure: failure, at: now, hold: min(hold, Self.longestHold), count: count)
    }

}

extension RefreshTurn {
    /// The answer's name in metrics: `lease` (this process calls the token endpoint), `adopted`
    /// (the fleet already held newer credentials), `published` (another process's refresh
    /// answered the wait), `failed_elsewhere`, `limited`, `unavailable`, `retry_after` (the token
    /// endpoint asked the fleet to wait).
    var metricName: String {
        switch self {
        case .lease: "lease"
        case .newer: "adopted"
        case .published: "published"
        case .failedElsewhere: "failed_elsewhere"
        case .limited: "limited"
        case .unavailable: "unavailable"
        case .retryAfter: "retry_after"
        }
    }
}
