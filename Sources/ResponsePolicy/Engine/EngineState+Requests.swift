import Foundation

/// What the shell does after a transition, once it has unlocked: one list, in order.
///
/// A transition never awaits, locks or reads a clock; what it decides that touches the world
/// outside the state (a parked task, an attempt on the wire, the timer heap) is an action here.
/// `arm` and `disarm` are about the timer of the request the event is about: its own driver
/// performs them (every other request's timer leaves the heap in that request's own task).
enum Action {
    /// Resumes a parked request.
    case resume(UnsafeContinuation<Void, Never>)
    /// Cancels an attempt on the wire.
    case cancel(AttemptCancellation)
    /// Schedules the request's timer at `at` with `token` (the token that counts in its phase).
    case arm(at: Duration, token: UInt64)
    /// Takes the request's timer off the heap: the wait or the attempt it bounded ended first.
    case disarm
    /// Hands an event to the observers (made only when someone observes: a transition builds
    /// none for an engine nobody watches, so the request path allocates nothing for it).
    indirect case emit(PolicyEvent)
    /// Saves the credentials now held to the credential store (a refresh, an adoption).
    case save
    /// Work of the refresh flight for the shell (``RefreshWork``): a plugin call, a coordinator
    /// turn or publication, a timer, a problem to report.
    indirect case refresh(RefreshWork)
    /// Tells the fleet and the logout plugin that the session ended: the coordinator first (the
    /// other processes stop sending), then the plugin, in the background.
    indirect case publish(LogoutNotice)
}

/// What the shell does for the refresh flight (``Action/refresh(_:)``); each result comes back as
/// an event of the flight (`PolicyEngine+Refresh.swift`).
enum RefreshWork {
    /// Calls the refresh plugin; its answer is ``RefreshFlight/answered(_:call:_:_:now:date:)``.
    case call(RefreshFlight.Call)
    /// Asks the coordinator for a refresh turn (publishing a pair kept through an outage first);
    /// its answer is ``RefreshFlight/turn(_:_:now:)``.
    case ask(UInt64, RefreshTurnRequest, PolicyRuntime)
    /// Publishes the pair the session took under its lease (``RefreshFlight/unpublished``): at
    /// once after a refresh, again when the coordinator is back after trouble.
    case publishPending(PolicyRuntime)
    /// Tells the coordinator the turn failed, with the reason.
    case endTurn(RefreshLease, String)
    /// Arms the flight's timer (one at a time: a newer one replaces it).
    case arm(RefreshFlight.Timer)
    /// Takes the timer of a flight that ended off the heap.
    case disarm(UInt64)
    /// Reports a `problem` event.
    case problem(String, PolicyRuntime)
}

/// A logout a transition decided, for the world outside (``Action/publish(_:)``): its cooldown's
/// end and reason, the ended session's credentials (read with the cooldown's start, so a sign-in
/// right after is not the session the plugin ends), and whether the plugin is called and the
/// coordinator told (not for news from another process).
struct LogoutNotice {
    let until: Date
    let reason: LogoutReason
    let credentials: Credentials?
    let requestID: String?
    let plugin: (any LogoutPlugin)?
    let publishes: Bool
}

/// The ordered list of ``Action``s a transition returns. The first two are kept inline: most
/// transitions return at most a timer to arm or disarm and one request to resume, and a list on
/// the heap for each would cost an allocation per event on every request's path.
struct Actions: Sequence, ExpressibleByArrayLiteral {
    private var first: Action?
    private var second: Action?
    private var more: [Action] = []
    private(set) var count = 0

    init() {}

    init(arrayLiteral elements: Action...) {
        for element in elements { append(element) }
    }

    var isEmpty: Bool { count == 0 }

    mutating func append(_ action: Action) {
        switch count {
        case 0: first = action
        case 1: second = action
        default: more.append(action)
        }
        count += 1
    }

    static func += (list: inout Actions, other: Actions) {
        for action in other { list.append(action) }
    }

    static func + (list: Actions, other: Actions) -> Actions {
        var joined = list
        joined += other
        return joined
    }

    struct Iterator: IteratorProtocol {
        let actions: Actions
        var index = 0

        mutating func next() -> Action? {
            defer { index += 1 }
            switch index {
            case actions.count...: return nil
            case 0: return actions.first
            case 1: return actions.second
            default: return actions.more[index - 2]
            }
        }
    }

    func makeIterator() -> Iterator { Iterator(actions: self) }
}

/// The transitions of a request's slot: the top of its loop, its attempt's begin and end, its
/// park and wake, its backoff, its timer, its caller's cancellation, a logout's sweep. Each runs
/// under the engine's lock and returns what the shell performs after unlocking (``Action``).
extension EngineState {
    /// What the top of a request's loop may do (``gate(insideLock:_:now:date:)``).
    enum Gate { case go, ended, loggedOut, held, queued, refreshFirst }

    /// What the gate needs to know of a request about to go out besides its slot: its loop's own
    /// state and its scope's settings.
    struct Departure {
        /// Its caller's task is cancelled.
        var cancelled = false
        /// It has not waited for a refresh before this attempt yet (it is held at most once).
        var mayHold = true
        /// Where a failure of a refresh it is held for leads it when it has no usable token.
        var beforeSending: RefreshRoute?
        /// It may refresh ahead of expiry or sign in first (it has not just done so).
        var mayRefreshFirst = true
        /// Its scope's refresh plugin can sign in (get the first token).
        var signsIn = false
        /// Its scope has a refresh plugin.
        var refreshes = false
        /// Its scope's `refresh.ahead`.
        var ahead: Duration?
        /// The token generation a refresh ahead of expiry of this request failed for: while it is
        /// current, the request does not refresh ahead again (one failure is one failure).
        var failedAheadGeneration: UInt64?
        /// Its scope's `attempt-timeout`.
        var attemptTimeout: Duration?
        /// What the attempt is cancelled by, if it goes out now.
        var attempt = AttemptCancellation()
        /// How the session is shared, for a refresh it starts.
        var coordination = RefreshFlight.Coordination.local
    }

    /// The top of request `id`'s loop, one transition: it goes out now (its attempt begins, with
    /// the credentials and generation returned and its timeout armed), or it was ended, or the
    /// session is in its cooldown, or it waits, or it refreshes first.
    ///
    /// It waits for the refresh in flight when its scope holds new requests (it has not gone out
    /// yet, so it waits for the fresh token rather than going out with one already known to be
    /// stale), and in its host's dispatch queue when the host's slots are taken. A request is held
    /// at most once before each attempt (`mayHold`), so every attempt waits for at most one
    /// refresh before it goes out: the bound ``WorstCase`` states. Held with no usable token
    /// (none, or expired at `date`), a failure of the refresh leads it along `beforeSending` (the
    /// scope's `on-failure`); with a valid one it is sent with it.
    ///
    /// It refreshes first when it has no credentials and its plugin can sign in (rather than
    /// going out unsigned), or when its token expires within `ahead` (at most half the token's
    /// lifetime as issued).
    ///
    /// Its attempt times out after `attempt-timeout`, and never past its deadline.
    mutating func gate(insideLock id: UInt64, _ departure: Departure, now: Duration, date: Date) -> GateResult {
        guard let slot = slots[id], !departure.cancelled, slot.endReason == nil else { return GateResult(.ended) }
        if isLoggedOut(at: now) { return GateResult(.loggedOut) }
        if departure.mayHold, slot.holdsNewRequests, let flight, !flight.released {
            let usable = credentials.map { credentials in credentials.expiresAt.map { $0 > date } ?? true } ?? false
            return GateResult(
                .held, actions: join(insideLock: id, route: usable ? nil : departure.beforeSending, held: true))
        }
        if slot.host != nil, !acquireDispatchSlot(insideLock: id) {
            // Queued: its deadline bounds the wait.
            var actions: Actions = []
            modifySlot(id) { slot in
                var token: UInt64 = 0
                if let deadline = slot.deadline {
                    token = slot.nextTimer()
                    actions.append(.arm(at: deadline, token: token))
                }
                slot.phase = .queued(timer: token)
            }
            return GateResult(.queued, actions: actions)
        }
        let credentials = credentialsBox?.credentials
        if departure.mayRefreshFirst {
            if credentials == nil, departure.signsIn {
                var result = GateResult(.refreshFirst, credentialsBox, generation)
                result.signingIn = true
                return result
            }
            if departure.failedAheadGeneration != generation, departure.refreshes,
                let ahead = credentialsBox?.effectiveAhead(departure.ahead), let expiry = credentials?.expiresAt,
                expiry.timeIntervalSince(date) < ahead
            {
                return GateResult(.refreshFirst, credentialsBox, generation)
            }
        }
        // It goes out: the attempt begins here, its timeout armed.
        var timeoutAt = departure.attemptTimeout.map { now + $0 }
        if let deadline = slot.deadline {
            let limit = max(now, deadline)
            timeoutAt = min(timeoutAt ?? limit, limit)
        }
        let actions = attemptBegan(insideLock: id, cancellation: departure.attempt, timeoutAt: timeoutAt) ?? []
        return GateResult(.go, credentialsBox, generation, actions: actions)
    }

    /// What the gate decided, with the credentials and generation to sign with when it goes (or
    /// to refresh), and the timer to arm (its attempt's timeout, or its wait's deadline).
    struct GateResult {
        let gate: Gate
        var credentials: CredentialsBox?
        var generation: UInt64 = 0
        var actions: Actions = []
        /// It refreshes first to get its first credentials.
        var signingIn = false

        init(_ gate: Gate, _ credentials: CredentialsBox? = nil, _ generation: UInt64 = 0, actions: Actions = []) {
            self.gate = gate
            self.credentials = credentials
            self.generation = generation
            self.actions = actions
        }
    }

    /// Request `id` goes on the wire with `cancellation` (what a logout, a timeout or its caller
    /// cancel it by), timing out at `timeoutAt`. `nil` when it was already ended; else the timer
    /// to arm.
    mutating func attemptBegan(insideLock id: UInt64, cancellation: AttemptCancellation, timeoutAt: Duration?)
        -> Actions?
    {
        modifySlot(id) { slot -> Actions? in
            guard slot.endReason == nil else { return nil }
            var actions: Actions = []
            var token: UInt64 = 0
            if let timeoutAt {
                token = slot.nextTimer()
                actions.append(.arm(at: timeoutAt, token: token))
            }
            slot.phase = .onWire(cancellation, timer: token, timedOut: false)
            slot.sent = true
            return actions
        } ?? nil
    }

    /// Request `id` parks with `continuation`, resumed by whoever sets its wake or ends it; a
    /// request that waits gives its dispatch slot to the next one (resumed from `woken` after
    /// unlocking). Returns `true` when there is nothing to wait for (already woken or ended):
    /// the caller resumes the continuation at once.
    mutating func parking(
        insideLock id: UInt64, _ continuation: UnsafeContinuation<Void, Never>,
        into woken: inout Actions
    ) -> Bool {
        let ready =
            modifySlot(id) { slot -> Bool in
                if slot.phase.isWoken || slot.endReason != nil { return true }
                slot.parked = continuation
                return false
            } ?? true
        if !ready, slots[id]?.host != nil { releaseDispatchSlot(insideLock: id, into: &woken) }
        return ready
    }

    /// Request `id`'s park ended: takes why (its wake, `nil` when it was ended), whether it was
    /// ended from outside, and its timer to take off the heap when the wait ended some other way
    /// than by its firing. It runs its loop on.
    mutating func woke(insideLock id: UInt64) -> (Wake?, endedOutside: Bool, Actions) {
        modifySlot(id) { slot in
            var taken: Wake?
            if case .woken(let wake, _) = slot.phase { taken = wake }
            slot.phase = .running
            var actions: Actions = []
            if slot.timerScheduled {
                slot.timerScheduled = false
                actions.append(.disarm)
            }
            return (taken, slot.endReason != nil, actions)
        } ?? (nil, true, [])
    }

    /// Request `id` has its outcome: its dispatch slot goes to the next request (resumed from
    /// `woken` after unlocking) and its slot is removed.
    mutating func finished(insideLock id: UInt64, into woken: inout Actions) {
        if slots[id]?.host != nil { releaseDispatchSlot(insideLock: id, into: &woken) }
        slots.removeValue(forKey: id)
    }

    /// What a retry's backoff start came to (``startBackoff(insideLock:budget:until:deadline:now:)``).
    enum BackoffStart {
        /// The request waits until its timer (armed with the token given) fires.
        case started
        /// The retry budget refused the retry.
        case refused
        /// The wait would end past the request's deadline: it is not started.
        case pastDeadline
        /// The request was ended from outside (a logout, its caller).
        case ended
    }

    /// Request `id` retries after a backoff until `end`: the budget is asked (when the rule has
    /// a budget edge), a wait ending past `deadline` is refused, and otherwise the request is in
    /// its backoff with its timer armed at `end` (the action returned). In the order of the
    /// edges' precedence: budget, then deadline.
    mutating func startBackoff(
        insideLock id: UInt64, budget: RetrySettings.Budget?, until end: Duration, deadline: Duration?, now: Duration
    ) -> (BackoffStart, Actions) {
        guard let slot = slots[id], slot.endReason == nil else { return (.ended, []) }
        if let budget, !self.budget.takeRetry(at: now, budget: budget) { return (.refused, []) }
        if let deadline, end > deadline { return (.pastDeadline, []) }
        let token = modifySlot(id) { slot -> UInt64 in
            let token = slot.nextTimer()
            slot.phase = .backoff(timer: token)
            return token
        }
        return (.started, [.arm(at: end, token: token ?? 0)])
    }

    /// Ends request `id` from outside its loop (its caller, or a logout): marks why, disarms its
    /// timer (a backoff's leaves the heap when the request's park ends, in its own task), and
    /// hands back its attempt and its park.
    mutating func end(insideLock id: UInt64, _ reason: EndReason) -> Actions {
        modifySlot(id) { slot in
            if slot.endReason == nil { slot.endReason = reason }
            // A refresh waiter stays listed (disarmed): a failure of that refresh still decides
            // the session's end through it.
            slot.phase = slot.phase.disarmed
            var actions: Actions = []
            if case .onWire(let attempt, _, _) = slot.phase { actions.append(.cancel(attempt)) }
            if let parked = slot.parked.take() { actions.append(.resume(parked)) }
            return actions
        } ?? []
    }

    /// What a request does with the attempt that just ended (``attemptEnded(insideLock:responseArrived:callerCancelled:)``).
    enum AttemptDisposition: Equatable {
        /// Its result counts (a response, an error, or a timeout when `timedOut`).
        case result(timedOut: Bool)
        /// A response arrived, but a logout was decided while it was on its way in: the
        /// response is still classified, and delivered (or failed) when its rule says so; a
        /// refresh or retry it asks for ends the request logged out.
        case arrivedAfterLogout
        /// The request was ended (its caller, or a logout before any response): the result is dropped.
        case ended
    }

    /// Request `id`'s attempt ended (`responseArrived`: the transport returned a response):
    /// disarms it and says what counts. A response that has arrived is the server's answer,
    /// which a logout decided a moment later does not unsay; only the caller's cancellation
    /// drops it.
    mutating func attemptEnded(insideLock id: UInt64, responseArrived: Bool, callerCancelled: Bool)
        -> (AttemptDisposition, Actions)
    {
        modifySlot(id) { slot in
            var timedOut = false
            if case .onWire(_, _, let timed) = slot.phase { timedOut = timed }
            slot.phase = .running
            var actions: Actions = []
            if slot.timerScheduled {
                slot.timerScheduled = false
                actions.append(.disarm)
            }
            if callerCancelled { return (.ended, actions) }
            switch slot.endReason {
            case nil: return (.result(timedOut: timedOut), actions)
            case .loggedOut? where responseArrived: return (.arrivedAfterLogout, actions)
            default: return (.ended, actions)
            }
        } ?? (.ended, [])
    }

    /// The rule an attempt's result matches in its scope, found by the shell before the lock (a
    /// lookup in the compiled flow; the body's code scan stays outside the lock).
    struct Classified {
        /// The business code read from the response's body.
        var code: String?
        /// The rule matched (`nil`: none). For an attempt that ended with no result, the rule a
        /// timeout matches, which counts only when its timer fired.
        var rule: Int?
        /// The request may be sent again under the rule's retry settings (its method is listed,
        /// or its caller gave it the rule's idempotency key).
        var retryable = false
    }

    /// What the request brings to a retry decision: its own counters and the attempt's answer.
    struct RetryAsk {
        /// Retries already made.
        var retries: Int
        /// The response (for its `Retry-After`); `nil` after an error or a timeout.
        var response: HTTPResponse?
        /// The wall-clock time, for a `Retry-After` date.
        var date: Date
        var random: any RandomSource
    }

    /// What a `retry` rule came to (``attemptEnded(insideLock:responseArrived:gotError:callerCancelled:scope:_:retry:now:)``),
    /// in the order of its edges' precedence.
    enum RetryVerdict {
        /// Out of retries, a method it may not re-send, or no loop edge: the escalation edge
        /// taken (`nil`: none, the request fails with its retries exhausted).
        case notRetried(RuleGraph.Escalation?)
        /// The retry budget refused it.
        case refused
        /// The backoff would end past the deadline: not started.
        case pastDeadline
        /// It is in its backoff for `delay`, its timer armed.
        case started(delay: Duration)

        /// The escalation edge of `flow` this verdict leads along, with the failure it fails with
        /// (`exhausted`: the retries-exhausted error of the attempt's result); `nil` when it
        /// retries or the edge it would take is not compiled (see ``RequestMachine/retryTrigger(_:)``).
        func escalation(of flow: RuleGraph.CompiledRule, exhausted: @autoclosure () -> PolicyEngineError)
            -> (RuleGraph.Escalation, PolicyEngineError)?
        {
            switch self {
            case .notRetried(let edge): return edge.map { ($0, exhausted()) }
            case .refused: return flow.budget.map { ($0, exhausted()) }
            case .pastDeadline: return flow.deadline.map { ($0, .deadlineExceeded) }
            case .started: return nil
            }
        }
    }

    /// Why an attempt's end finished its request (``attemptEnded(insideLock:responseArrived:gotError:callerCancelled:scope:_:retry:now:)``).
    enum Finish: Equatable {
        /// It timed out at its deadline: the request fails with `deadlineExceeded`.
        case deadline
        /// No rule matched, or the matching rule delivers or fails: the driver reports that.
        case rule
    }

    /// Request `id`'s attempt ended, classified as `classified` in `scope`: what counts (see
    /// ``attemptEnded(insideLock:responseArrived:callerCancelled:)``), and whether the request has
    /// its outcome now, decided from the compiled flow: its deadline came (a timeout at it), no
    /// rule matched, or the rule's action is `deliver` or `fail`. Then its slot is removed in the
    /// same transition (its dispatch slot goes to the next request), and the shell reports the
    /// outcome.
    mutating func attemptEnded(
        insideLock id: UInt64, responseArrived: Bool, gotError: Bool, callerCancelled: Bool, scope: RuleGraph.Scope,
        _ classified: Classified, retry ask: RetryAsk?, now: Duration
    ) -> (AttemptDisposition, finished: Finish?, RetryVerdict?, Actions) {
        let deadline = slots[id]?.deadline
        var (disposition, actions) = attemptEnded(
            insideLock: id, responseArrived: responseArrived, callerCancelled: callerCancelled)
        /// The rule's action ends the request here (no rule: the response is delivered, the error fails it).
        func endsHere() -> Bool {
            guard let rule = classified.rule else { return true }
            let action = scope.compiled[rule].action
            return action == .deliver || action == .fail
        }
        let finishes: Finish?
        /// Its rule retries (not after a logout, and not at its deadline).
        var retries = false
        switch disposition {
        case .ended:
            finishes = nil
        case .result(let timedOut) where !responseArrived && !gotError:
            // No result: a timeout (at the deadline, or its rule decides), or a cancellation the
            // request's loop reports.
            if timedOut, let deadline, now >= deadline {
                finishes = .deadline
            } else {
                finishes = timedOut && endsHere() ? .rule : nil
                retries = timedOut
            }
        case .result:
            finishes = endsHere() ? .rule : nil
            retries = true
        case .arrivedAfterLogout:
            finishes = endsHere() ? .rule : nil
        }
        if finishes != nil { finished(insideLock: id, into: &actions) }
        var verdict: RetryVerdict?
        if retries, let ask, let rule = classified.rule, scope.compiled[rule].action == .retry {
            verdict = retry(insideLock: id, scope.compiled[rule], classified, ask, now: now, into: &actions)
        }
        return (disposition, finishes, verdict, actions)
    }

    /// A `retry` rule matched request `id`'s attempt: retries left, then a request that may not
    /// be sent again, then the budget, then the deadline (the order of the edges' precedence);
    /// otherwise its backoff starts, the delay drawn here (`max-delay` caps it after jitter; a
    /// `Retry-After` the rule honours replaces it).
    mutating func retry(
        insideLock id: UInt64, _ flow: RuleGraph.CompiledRule, _ classified: Classified, _ ask: RetryAsk,
        now: Duration, into actions: inout Actions
    ) -> RetryVerdict {
        let settings = flow.retry
        guard ask.retries < settings.maxRetries, flow.again != nil, classified.retryable else {
            return .notRetried(
                ask.retries < settings.maxRetries ? flow.notRetryable ?? flow.onExhausted : flow.onExhausted)
        }
        let delay = RetryTiming.delay(
            forRetry: ask.retries + 1, settings: settings, response: ask.response, now: ask.date, random: ask.random)
        let budget = flow.budget == nil ? nil : settings.budget
        let deadline = flow.deadline == nil ? nil : slots[id]?.deadline
        let (start, timer) = startBackoff(
            insideLock: id, budget: budget, until: now + delay, deadline: deadline, now: now)
        switch start {
        case .refused: return .refused
        case .pastDeadline: return .pastDeadline
        case .ended: return .notRetried(nil)  // (not reached: its attempt's result counts)
        case .started:
            actions += timer
            return .started(delay: delay)
        }
    }

    /// Request `id`'s timer fired: its attempt timed out, its backoff is over, or its deadline
    /// came while it waited for a refresh or a dispatch slot. A stale firing (the attempt ended,
    /// the request was ended, the refresh or the slot came first) finds another token armed, or
    /// a wake already set, and does nothing.
    mutating func timerFired(insideLock id: UInt64, token: UInt64) -> Actions {
        modifySlot(id) { slot in
            // It left the heap to fire: nothing to take off any more (unless it was armed again
            // meanwhile, with a newer token).
            if token == slot.timerTokens { slot.timerScheduled = false }
            // An attempt a logout left to finish (its response was arriving) still times out.
            guard token != 0, slot.phase.timer == token, slot.endReason == nil || slot.phase.isOnWire else {
                return []
            }
            var actions: Actions = []
            switch slot.phase {
            case .onWire(let attempt, _, _):
                slot.phase = .onWire(attempt, timer: 0, timedOut: true)
                actions.append(.cancel(attempt))
            case .backoff, .held, .awaitingRefresh, .queued:
                // A refresh waiter leaves the refresh (its phase no longer names it).
                slot.phase = .woken(.timer, timer: 0)
                if let parked = slot.parked.take() { actions.append(.resume(parked)) }
            case .running, .woken:
                break
            }
            return actions
        } ?? []
    }

    /// A logout (its cooldown just started) ends every request but `trigger`: those waiting for
    /// the refresh in flight first (it runs on; its result is discarded, a new epoch began), then
    /// the others, each in request order so a simulation's output is the same every run. Waiting
    /// requests (a backoff, a dispatch queue) end whatever `cancelInFlight` says. An attempt
    /// whose response is arriving (``AttemptCancellation/responseArriving()``) is not cancelled:
    /// it is marked ended and handled by its rule when its response is in.
    /// The parked requests are resumed first, then the attempts cancelled.
    mutating func endRequests(insideLock trigger: UInt64?, cancelInFlight: Bool) -> Actions {
        var actions: Actions = []
        var cancels: Actions = []
        if let flight {
            for id in live(flight) where id != trigger {
                modifySlot(id) { slot in
                    if slot.endReason == nil { slot.endReason = .loggedOut }
                    // It no longer waits for the refresh; its deadline's timer no longer counts.
                    slot.phase = .running
                    if let continuation = slot.parked.take() { actions.append(.resume(continuation)) }
                }
            }
            refresh.dropWaiters(keeping: trigger)
        }
        for id in requestNumbers where id != trigger {
            modifySlot(id) { slot in
                guard cancelInFlight || slot.phase.isBackoff || slot.phase.isQueued else { return }
                if slot.endReason == nil { slot.endReason = .loggedOut }
                if case .onWire(let attempt, _, _) = slot.phase, attempt.isArriving {
                    // Its response is coming in: the server answered before it knew of the
                    // logout. It is read to the end (its timer stays armed) and handled by its
                    // rule (``attemptEnded(insideLock:responseArrived:callerCancelled:)``).
                    return
                }
                if case .onWire(let attempt, _, _) = slot.phase { cancels.append(.cancel(attempt)) }
                // A backoff's timer is taken off the heap by the request itself, when its park
                // ends; disarmed here, a firing in between does nothing.
                slot.phase = slot.phase.disarmed
                if let continuation = slot.parked.take() { actions.append(.resume(continuation)) }
            }
        }
        return actions + cancels
    }
}

// MARK: - A request's decisions

/// The decisions of a request's loop, each one transition under one lock: the top of its loop
/// (``proceed(insideLock:_:_:into:)``), a refresh trigger, what a refresh it waited for came to,
/// the end of a park, an escalation edge, and carrying out a `logout`. Each takes the event (the
/// request's ``RequestEvent``, read by its driver with the time) and the request's own
/// ``RequestLoop`` (its counters, kept by the driver between events), and returns what the
/// driver does next (``Next``) with the ordered ``Actions`` the shell performs after unlocking.
extension EngineState {
    /// What a request's loop keeps between its events and its decisions read: its counters and
    /// what it waits for. Owned by the request's driver (``RequestMachine``), handed to each
    /// transition `inout`.
    struct RequestLoop {
        /// What a park waits for.
        enum Parked {
            /// A backoff; a refresh this request started or joined (`proactive`: one ahead of
            /// expiry, or one a new request waits for under `hold-new-requests`); a dispatch slot.
            case backoff, refresh(proactive: Bool), dispatch
        }

        var waitingFor = Parked.backoff
        /// The rule whose refresh is awaited (`nil`: the scope's settings), for its failure edges.
        var refreshRule: Int?
        var attempt = 0
        var retries = 0
        /// Re-sends after a refresh this request waited for (`max-per-request` counts them).
        var refreshResends = 0
        /// The token generation the last attempt was signed with.
        var signedGeneration: UInt64 = 0
        /// The proactive refresh for this turn of the loop is done.
        var skipProactive = false
        /// A proactive refresh of this request that failed, and the token generation it failed for:
        /// while that generation is current, the request neither refreshes ahead again nor calls the
        /// refresh plugin for a trigger, but meets this failure (one failure is one failure: the
        /// same dead refresh token is not sent twice). Boxed, to keep waiting requests small.
        var proactiveFailure: ProactiveFailure?
        /// The proactive refresh awaited gets the first credentials (there were none): its failure
        /// follows the failure edges, since there is no token to send instead.
        var signingIn = false
        /// The request has waited for a refresh before the attempt about to go out (held, ahead of
        /// expiry, signing in): it is not held again before that attempt, so each attempt waits for
        /// at most one refresh before it goes out (the bound ``WorstCase`` states).
        var preSendWaited = false
        /// The reason of the refresh that failed, for the outcome and the logout it leads to, and
        /// the token endpoint's answer to it, when it answered.
        var refreshFailureReason: String?
        var refreshFailureResponse: HTTPResponse?
        /// The escalation edge taken after a refresh ended, reported with the outcome.
        var lastEdge: RuleGraph.Edge?
        /// Why a retry was refused (`budget`, `not-retryable`), for the outcome's reason.
        var refusal: RuleGraph.EdgeKind?
        /// The logout its awaited refresh's failure led to, started by the refresh's end (see
        /// ``Wake/flight(_:logout:)``): this request performs its effects.
        var decidedLogout: DecidedLogout?

        /// Why this request asks for a refresh, for the refresh plugin (``RefreshContext/reason``).
        func refreshReason(_ scope: RuleGraph.Scope) -> String {
            if signingIn { return "sign-in" }
            if case .refresh(proactive: true) = waitingFor { return "ahead" }
            return refreshRule.map { scope.rules[$0].name } ?? "refresh"
        }
    }

    /// A refresh ahead of expiry of a request that failed, and the token generation it failed for.
    final class ProactiveFailure {
        let failure: RefreshFailure
        let generation: UInt64

        init(_ failure: RefreshFailure, generation: UInt64) {
            self.failure = failure
            self.generation = generation
        }
    }

    /// What a request's transition knows of it besides its loop: fixed for the request (its number,
    /// scope, context), or read by its driver for this event (the time, the last attempt's answer,
    /// and a departure made ready in case it goes out now).
    struct RequestEvent {
        let id: UInt64
        let scope: RuleGraph.Scope
        let scopeIndex: Int
        let context: RequestContext
        var now: Duration
        var date: Date
        /// What the gate needs if the request goes out in this transition (its attempt's
        /// cancellation made ready).
        var departure: Departure
        /// The last attempt's response (or transport error) and business code, for events and for
        /// delivering it when an edge says so.
        var lastResponse: HTTPResponse?
        var failure: TransportError?
        var code: String?
        /// Whether the token endpoint's answer to a failed refresh matches a `logout` rule of the
        /// request's scope (classified by the shell, outside the lock, when ``Next/judge(_:_:)``
        /// asked for it); `nil`: not classified.
        var answerLogsOut: Bool?

        var observed: Bool { !context.runtime.observers.isEmpty }
    }

    /// What the driver does after a request's transition.
    enum Next {
        /// It goes out: the attempt began (its timeout armed); signed with these credentials.
        case send(CredentialsBox?, generation: UInt64)
        /// It waits (held, queued, a refresh, a backoff) until its park ends.
        case park
        /// It has its outcome; its slot was removed in the same transition.
        case finish(Result<HTTPResponse, PolicyEngineError>)
        /// A refresh it waited for failed definitively with an answer that the rule's
        /// `refresh-answer` edge may take: the shell classifies the answer outside the lock (a code
        /// scan), then ``refreshFailed(insideLock:_:_:rule:_:into:)`` decides.
        case judge(rule: Int, RefreshFailure)
    }

    /// Appends an event about request `r` to `actions` when someone observes.
    @inline(__always)
    func note(
        _ r: RequestEvent, _ kind: PolicyEvent.Kind, into actions: inout Actions, _ fill: (inout PolicyEvent) -> Void
    ) {
        guard r.observed else { return }
        var event = PolicyEvent(kind, time: r.now, context: r.context)
        fill(&event)
        actions.append(.emit(event))
    }

    /// The `response` event of the attempt just classified: the rule that matched and what the
    /// request does now (the rule's action, or where an escalation edge led), with the edge.
    func noteResponse(
        _ r: RequestEvent, _ loop: RequestLoop, rule: Rule?, action: ActionKind? = nil, reason: String? = nil,
        edge: RuleGraph.Edge? = nil, into actions: inout Actions
    ) {
        note(r, .response, into: &actions) { event in
            event.attempt = loop.attempt
            event.status = r.lastResponse?.status
            event.code = r.code
            event.error = r.failure?.errorClass
            event.rule = rule?.name
            event.action = action ?? rule?.action
            event.reason = reason
            event.edge = edge?.id
        }
    }

    /// The request has its outcome: its slot goes (its dispatch slot to the next request).
    mutating func finish(
        insideLock r: RequestEvent, _ result: Result<HTTPResponse, PolicyEngineError>, into actions: inout Actions
    ) -> Next {
        finished(insideLock: r.id, into: &actions)
        return .finish(result)
    }

    /// The error of a request a logout ended: the cooldown's end and reason.
    func loggedOutError(_ date: Date) -> PolicyEngineError {
        let (until, reason) = cooldown ?? (date, .host("logged out"))
        return .loggedOut(until: until, reason: reason)
    }

    /// Ended by a logout while on the wire or waiting: a `cancel` event, then the logged-out
    /// outcome.
    mutating func cancelledByLogout(insideLock r: RequestEvent, into actions: inout Actions) -> Next {
        note(r, .cancel, into: &actions) { $0.reason = "logout" }
        return finish(insideLock: r, .failure(loggedOutError(r.date)), into: &actions)
    }

    /// The request was ended from outside its loop: by a logout, or by its caller.
    mutating func ended(insideLock r: RequestEvent, into actions: inout Actions) -> Next {
        if slots[r.id]?.endReason == .loggedOut { return cancelledByLogout(insideLock: r, into: &actions) }
        note(r, .cancel, into: &actions) { $0.reason = "the caller cancelled the request" }
        return finish(insideLock: r, .failure(.cancelled), into: &actions)
    }

    /// The deadline passed while the request waited for a refresh or a dispatch slot.
    mutating func waitedPastDeadline(insideLock r: RequestEvent, into actions: inout Actions) -> Next {
        note(r, .cancel, into: &actions) { $0.reason = "deadline" }
        return finish(insideLock: r, .failure(.deadlineExceeded), into: &actions)
    }

    /// Delivers the last response, or fails with the transport error when there is none.
    mutating func deliverOrFail(insideLock r: RequestEvent, into actions: inout Actions) -> Next {
        if let response = r.lastResponse { return finish(insideLock: r, .success(response), into: &actions) }
        return finish(insideLock: r, .failure(.transport(r.failure ?? TransportError(.connection))), into: &actions)
    }

    /// Whether the credentials held can still be sent at `date` (present and not expired).
    func tokenUsable(at date: Date) -> Bool {
        guard let credentials else { return false }
        return credentials.expiresAt.map { $0 > date } ?? true
    }

    /// The top of request `r`'s loop: the gate (``gate(insideLock:_:now:date:)``) with what its
    /// loop says (held at most once per attempt, no second refresh ahead in one turn), and what
    /// the gate's answer leads to: it goes out (its attempt numbered, signed with the credentials
    /// returned), it waits (held, queued: an event says so), it refreshes first, or it ends.
    mutating func proceed(insideLock r: RequestEvent, _ loop: inout RequestLoop, into actions: inout Actions) -> Next {
        var departure = r.departure
        departure.mayHold = !loop.preSendWaited
        departure.mayRefreshFirst = !loop.skipProactive
        departure.failedAheadGeneration = loop.proactiveFailure?.generation
        let gated = gate(insideLock: r.id, departure, now: r.now, date: r.date)
        switch gated.gate {
        case .go:
            // Its attempt began in the gate, its timeout armed.
            actions += gated.actions
            loop.signingIn = false
            loop.skipProactive = false
            loop.signedGeneration = gated.generation
            loop.preSendWaited = false
            loop.attempt += 1
            return .send(gated.credentials, generation: gated.generation)
        case .refreshFirst:
            // No credentials and a plugin that can sign in (client_credentials, a login): the
            // first token before the request goes out, rather than sending it unsigned. Or the
            // token expires within `ahead`: a fresh one first.
            loop.signingIn = gated.signingIn
            loop.waitingFor = .refresh(proactive: true)
            loop.refreshRule = nil
            return awaitRefresh(
                insideLock: r, &loop, failedGeneration: gated.generation, proactive: true, into: &actions)
        case .ended:
            return ended(insideLock: r, into: &actions)
        case .loggedOut:
            return cancelledByLogout(insideLock: r, into: &actions)
        case .held:
            // About to go out (a first attempt or a retry) while a refresh is in flight: it waits
            // for the fresh token, and says so.
            let next = loop.attempt + 1
            note(r, .held, into: &actions) { event in
                event.attempt = next
                event.reason = "refresh in flight"
            }
            loop.waitingFor = .refresh(proactive: true)
            loop.refreshRule = nil
            loop.preSendWaited = true
            actions += gated.actions
            return .park
        case .queued:
            loop.waitingFor = .dispatch
            let next = loop.attempt + 1
            note(r, .queued, into: &actions) { $0.attempt = next }
            actions += gated.actions
            return .park
        }
    }

    /// A `refresh` rule matched request `r`'s attempt. The generation first: refused with a token
    /// older than the current one, the request is re-sent with the current one at once, and that
    /// re-send is not counted (no refresh was waited for; the same holds for credentials adopted
    /// from the fleet: issue 19, invariant d). Then `max-per-request` (its `on-exhausted` edge);
    /// then a failure of this request's own refresh ahead of expiry for this very token (met
    /// again, not asked again: the same refresh token is never presented twice); otherwise it
    /// starts or joins the refresh.
    mutating func refreshTrigger(
        insideLock r: RequestEvent, _ loop: inout RequestLoop, _ flow: RuleGraph.CompiledRule,
        into actions: inout Actions
    ) -> Next {
        if generation > loop.signedGeneration {
            noteResponse(r, loop, rule: flow.rule, into: &actions)
            return proceed(insideLock: r, &loop, into: &actions)
        }
        guard loop.refreshResends < flow.refresh.maxPerRequest else {
            let error = PolicyEngineError.refreshFailed(
                reason: "the request was re-sent \(loop.refreshResends) time(s) for refresh triggers")
            guard let exhausted = flow.onExhausted else {
                return finish(insideLock: r, .failure(error), into: &actions)
            }
            return follow(insideLock: r, &loop, exhausted, of: flow, failing: error, into: &actions)
        }
        noteResponse(r, loop, rule: flow.rule, into: &actions)
        loop.refreshResends += 1
        loop.refreshRule = flow.index
        if let earlier = loop.proactiveFailure, earlier.generation == loop.signedGeneration,
            generation == loop.signedGeneration
        {
            // This request's refresh ahead of expiry already failed for this token: that is the
            // refresh's failure, not a reason to send the same refresh token again.
            return afterRefresh(insideLock: r, &loop, .failed(earlier.failure), proactive: false, into: &actions)
        }
        loop.waitingFor = .refresh(proactive: false)
        return awaitRefresh(
            insideLock: r, &loop, failedGeneration: loop.signedGeneration, proactive: false, into: &actions)
    }

    /// Asks for a token newer than `failedGeneration` (``RefreshFlight/trigger(_:_:now:)``):
    /// an answer now, or a wait for the refresh in flight, joined in this transition (its
    /// deadline's timer armed with it), which this may just have started.
    mutating func awaitRefresh(
        insideLock r: RequestEvent, _ loop: inout RequestLoop, failedGeneration: UInt64, proactive: Bool,
        into actions: inout Actions
    ) -> Next {
        // Where this request goes when the refresh fails: its rule's failure edges, or (before
        // sending, with no usable token) the scope's; with a token still valid, nowhere yet (it
        // is sent with it).
        let route: RefreshRoute?
        if !proactive {
            route = RefreshRoute(scope: r.scope, rule: loop.refreshRule)
        } else if loop.signingIn || !tokenUsable(at: r.date) {
            route = RefreshRoute(scope: r.scope, rule: nil)
        } else {
            route = nil
        }
        if slots[r.id]?.endReason != nil {
            return afterRefresh(insideLock: r, &loop, .cancelled, proactive: proactive, into: &actions)
        }
        let settings = loop.refreshRule.map { r.scope.compiled[$0].refresh } ?? r.scope.refresh
        let trigger = RefreshFlight.Trigger(
            failedGeneration: failedGeneration, settings: settings, proactive: proactive,
            reason: loop.refreshReason(r.scope), starter: RefreshFlight.Starter(context: r.context, scopeIndex: r.scopeIndex),
            coordination: r.departure.coordination)
        let failure: RefreshFailure
        let refusal: RefreshFlight.Refusal
        switch refresh.trigger(trigger, sessionFacts(at: r.now), now: r.now) {
        case .loggedOut:
            return afterRefresh(insideLock: r, &loop, .loggedOut, proactive: proactive, into: &actions)
        case .retryNow:
            return afterRefresh(insideLock: r, &loop, .ok, proactive: proactive, into: &actions)
        case .refused(let refused, let why):
            (failure, refusal) = (refused, why)
        case .join(_, let rearm):
            // Parked until the refresh ends, its deadline's timer armed with the wait.
            actions += join(insideLock: r.id, route: route)
            if let rearm { actions.append(.refresh(.arm(rearm))) }
            if proactive { loop.preSendWaited = true }
            return .park
        case .start(_, let step):
            actions += join(insideLock: r.id, route: route)
            note(r, .refreshStart, into: &actions) { _ in }
            actions += flightStep(insideLock: step, now: r.now, date: r.date)
            if proactive { loop.preSendWaited = true }
            return .park
        }
        // A failed refresh without a call: said with a start and an end.
        note(r, .refreshStart, into: &actions) { $0.reason = refusal.rawValue }
        note(r, .refreshEnd, into: &actions) { event in
            event.ok = false
            event.reason = failure.reason
            event.category = refusal.category
        }
        return afterRefresh(insideLock: r, &loop, .failed(failure), proactive: proactive, into: &actions)
    }

    /// What a refresh request `r` waited for (or asked for) came to, and where that leads it: the
    /// logout the refresh's end decided on its edge (its effects), coordination trouble (it fails,
    /// or goes out with a token still valid; nobody is logged out), a superseded refresh (it
    /// decides again), credentials adopted from the fleet (re-sent, not counted), a refresh ahead
    /// of expiry (sent with the token it has, the failure remembered; with none, the failure
    /// edges decide), a transient failure (it fails, the session goes on), or a definitive one:
    /// the rule's `on-failure`, its `refresh-answer` when the token endpoint's answer matches a
    /// `logout` rule, or before sending the scope's own edge.
    mutating func afterRefresh(
        insideLock r: RequestEvent, _ loop: inout RequestLoop, _ result: FlightResult, proactive: Bool,
        into actions: inout Actions
    ) -> Next {
        if let decided = loop.decidedLogout?.escalation, case .failed(let failure) = result {
            // The refresh's end already logged the session out on this request's edge (the
            // cooldown runs, every other request was ended): its effects are this request's.
            loop.decidedLogout = nil
            loop.lastEdge = decided.edge
            loop.refreshFailureReason = failure.reason
            loop.refreshFailureResponse = failure.response
            let reason = LogoutReason.refreshFailed(failure.reason, response: failure.response)
            logoutEffects(insideLock: r, reason: reason, into: &actions)
            return finish(insideLock: r, .failure(loggedOutError(r.date)), into: &actions)
        }
        switch result {
        case .unavailable(let failure):
            // Coordination trouble: the request fails with the reason (or, ahead of expiry, goes
            // out with the token it has); no failure edge is taken, so nobody is logged out.
            if proactive, !loop.signingIn, tokenUsable(at: r.date) {
                loop.skipProactive = true
                return proceed(insideLock: r, &loop, into: &actions)
            }
            loop.signingIn = false
            loop.refreshRule = nil
            loop.refreshFailureReason = failure.reason
            return finish(insideLock: r, .failure(.refreshFailed(reason: failure.reason)), into: &actions)
        case .superseded:
            // The refresh belonged to a session that has since ended: decide again, without
            // counting another re-send (a sign-in's token is newer and retried at once).
            if proactive { return proceed(insideLock: r, &loop, into: &actions) }
            return awaitRefresh(
                insideLock: r, &loop, failedGeneration: loop.signedGeneration, proactive: false, into: &actions)
        case .adopted:
            // Credentials the fleet already held answered the refresh (no token call): the re-send
            // is the generation rule's and is not counted (issue 19, invariant d), so a refusal of
            // them leads to a coordinated refresh, never to on-exhausted.
            if !proactive, loop.refreshResends > 0 { loop.refreshResends -= 1 }
            loop.refreshRule = nil
            return proceed(insideLock: r, &loop, into: &actions)
        case .loggedOut:
            return cancelledByLogout(insideLock: r, into: &actions)
        case .cancelled:
            return ended(insideLock: r, into: &actions)
        case .ok:
            if proactive { loop.skipProactive = true } else { loop.refreshRule = nil }
            return proceed(insideLock: r, &loop, into: &actions)
        case .failed(let failure) where proactive:
            if loop.signingIn || !tokenUsable(at: r.date) {
                // No token, or an expired one (signing in, or held for a refresh that failed):
                // sending would only fetch a refresh trigger. The failure edges decide.
                loop.signingIn = false
                return afterRefresh(insideLock: r, &loop, .failed(failure), proactive: false, into: &actions)
            }
            // The token is still valid for a moment: try it, but remember the failure.
            loop.proactiveFailure = ProactiveFailure(failure, generation: generation)
            loop.skipProactive = true
            return proceed(insideLock: r, &loop, into: &actions)
        case .failed(let failure) where !failure.isDefinitive:
            // Transient trouble outlasted refresh.timeout (or a definitive answer is still fresh:
            // see `decideRefresh`): the request fails with the reason, the session goes on. Only a
            // definitive answer reaches on-failure.
            let flow = loop.refreshRule.map { r.scope.compiled[$0] }
            loop.refreshRule = nil
            loop.lastEdge = flow?.onTransient?.edge
            return finish(insideLock: r, .failure(.refreshFailed(reason: failure.reason)), into: &actions)
        case .failed(let failure):
            let rule = loop.refreshRule
            loop.refreshRule = nil
            // The refresh's own reason goes with every way this ends (a logout names it too).
            loop.refreshFailureReason = failure.reason
            loop.refreshFailureResponse = failure.response
            guard let rule, r.scope.compiled[rule].onFailure != nil else {
                // A refresh before sending (ahead of expiry, signing in) has no rule: the
                // scope's own edge decides.
                let error = PolicyEngineError.refreshFailed(reason: failure.reason)
                guard let escalation = r.scope.beforeSendingFailure else {
                    return finish(insideLock: r, .failure(error), into: &actions)
                }
                loop.lastEdge = escalation.edge
                switch escalation.action {
                case .logout:
                    return logout(
                        insideLock: r, &loop, escalation.logout,
                        reason: .refreshFailed(failure.reason, response: failure.response), into: &actions)
                case .deliver where r.lastResponse != nil:
                    return deliverOrFail(insideLock: r, into: &actions)
                default:
                    return finish(insideLock: r, .failure(error), into: &actions)
                }
            }
            if failure.response != nil, r.scope.compiled[rule].refreshAnswer != nil, r.answerLogsOut == nil {
                // Whether the answer matches a logout rule is a code scan: made outside the lock.
                return .judge(rule: rule, failure)
            }
            return refreshFailed(insideLock: r, &loop, rule: rule, failure, into: &actions)
        }
    }

    /// A refresh for rule `rule` failed definitively: its `refresh-answer` edge when the token
    /// endpoint's answer matches a `logout` rule (``RequestEvent/answerLogsOut``), else its
    /// `on-failure`.
    mutating func refreshFailed(
        insideLock r: RequestEvent, _ loop: inout RequestLoop, rule: Int, _ failure: RefreshFailure,
        into actions: inout Actions
    ) -> Next {
        let flow = r.scope.compiled[rule]
        let error = PolicyEngineError.refreshFailed(reason: failure.reason)
        if failure.response != nil, let answer = flow.refreshAnswer, r.answerLogsOut == true {
            return follow(insideLock: r, &loop, answer, of: flow, failing: error, emit: false, into: &actions)
        }
        guard let onFailure = flow.onFailure else { return finish(insideLock: r, .failure(error), into: &actions) }
        return follow(insideLock: r, &loop, onFailure, of: flow, failing: error, emit: false, into: &actions)
    }

    /// Follows an escalation edge of `flow`: the response event says where it led and why (taken
    /// with a response; taken after a refresh ended, the outcome names the edge), and the request
    /// ends there. `error` is the failure when the edge leads to fail.
    mutating func follow(
        insideLock r: RequestEvent, _ loop: inout RequestLoop, _ escalation: RuleGraph.Escalation,
        of flow: RuleGraph.CompiledRule, failing error: PolicyEngineError, emit: Bool = true,
        into actions: inout Actions
    ) -> Next {
        if !emit { loop.lastEdge = escalation.edge }
        if escalation.edge.kind == .budget || escalation.edge.kind == .notRetryable {
            loop.refusal = escalation.edge.kind
        }
        if emit {
            noteResponse(
                r, loop, rule: flow.rule, action: escalation.action, reason: escalation.edge.kind.rawValue,
                edge: escalation.edge, into: &actions)
        }
        switch escalation.action {
        case .logout:
            return logout(
                insideLock: r, &loop, escalation.logout, reason: .rule(flow.rule.name, response: r.lastResponse),
                into: &actions)
        case .deliver:
            if r.lastResponse == nil, case .retriesExhausted = error {
                return finish(insideLock: r, .failure(error), into: &actions)
            }
            return deliverOrFail(insideLock: r, into: &actions)
        default:
            return finish(insideLock: r, .failure(error), into: &actions)
        }
    }

    /// Request `r`'s park ended: its backoff's timer or a dispatch slot sends it on (the gate runs
    /// in this transition), the refresh it waited for ended (``afterRefresh(insideLock:_:_:proactive:into:)``),
    /// its deadline came, or it was ended. Its timer leaves the heap here when the wait ended some
    /// other way than by its firing.
    mutating func afterPark(insideLock r: RequestEvent, _ loop: inout RequestLoop, into actions: inout Actions)
        -> Next
    {
        let (woken, endedOutside, disarm) = woke(insideLock: r.id)
        actions += disarm
        var decided: DecidedLogout?
        var result: FlightResult?
        if case .flight(let flightResult, let logout)? = woken { (decided, result) = (logout, flightResult) }
        loop.decidedLogout = decided
        switch loop.waitingFor {
        case .backoff:
            if endedOutside { return ended(insideLock: r, into: &actions) }
            return proceed(insideLock: r, &loop, into: &actions)
        case .refresh(let proactive):
            // The logout this request's edge led to was started with the refresh's end: its
            // effects are this request's to perform, even when it was ended meanwhile.
            if decided != nil, let result {
                return afterRefresh(insideLock: r, &loop, result, proactive: proactive, into: &actions)
            }
            if endedOutside { return ended(insideLock: r, into: &actions) }
            // Its deadline came first.
            if case .timer? = woken { return waitedPastDeadline(insideLock: r, into: &actions) }
            guard let result else { return ended(insideLock: r, into: &actions) }
            return afterRefresh(insideLock: r, &loop, result, proactive: proactive, into: &actions)
        case .dispatch:
            if endedOutside { return ended(insideLock: r, into: &actions) }
            if case .timer? = woken { return waitedPastDeadline(insideLock: r, into: &actions) }
            guard case .dispatched? = woken else { return ended(insideLock: r, into: &actions) }
            return proceed(insideLock: r, &loop, into: &actions)
        }
    }

    /// Carries out a rule's `logout` for request `r` (directly, as an escalation, or as the
    /// failure edge of its refresh): the cooldown starts and every other request is ended
    /// (``logOut(insideLock:cooldown:cancelInFlight:reason:trigger:now:date:)``), the event and
    /// the publication follow after unlocking, and the request ends logged out. Many triggers
    /// make one logout: a request that finds the cooldown running only ends.
    mutating func logout(
        insideLock r: RequestEvent, _ loop: inout RequestLoop, _ settings: LogoutSettings, reason: LogoutReason,
        into actions: inout Actions
    ) -> Next {
        // The server's logout code answered an attempt signed before the last sign-in: it ended
        // the session that attempt belonged to, which the sign-in already replaced. The request
        // fails by its rule; the session signed in since goes on (a race, not the server ending
        // this session).
        if loop.refreshFailureReason == nil, case .rule(let name, let response?) = reason,
            loop.signedGeneration < signInGeneration
        {
            return finish(insideLock: r, .failure(.failed(response: response, rule: name)), into: &actions)
        }
        // A logout that a failed refresh led to names the refresh's reason, whichever edge led there.
        let reason =
            loop.refreshFailureReason.map { LogoutReason.refreshFailed($0, response: loop.refreshFailureResponse) }
            ?? reason
        let plugin = r.context.runtime.scopes[r.scopeIndex].logout
        logOut(
            insideLock: settings.cooldown, cancelInFlight: settings.cancelInFlight, reason: reason, trigger: r.id,
            context: r.context, plugin: plugin, publishes: true, now: r.now, date: r.date, into: &actions)
        return finish(insideLock: r, .failure(loggedOutError(r.date)), into: &actions)
    }

    /// The effects of a logout a refresh's end already started on request `r`'s edge (the
    /// cooldown and the ending of the other requests are done): the event and the publication.
    func logoutEffects(insideLock r: RequestEvent, reason: LogoutReason, into actions: inout Actions) {
        let cooldown = loggedOutUntil.map { $0 - r.now }
        note(r, .logout, into: &actions) { event in
            event.rule = reason.ruleName
            event.reason = reason.eventText
            event.category = reason.category
            event.cooldown = cooldown
        }
        actions.append(
            .publish(
                LogoutNotice(
                    until: loggedOutUntilDate ?? r.date, reason: reason, credentials: credentials,
                    requestID: r.context.id, plugin: r.context.runtime.scopes[r.scopeIndex].logout, publishes: true)))
    }
}
