import Foundation

/// The transitions of a request's slot: the top of its loop, its attempt's begin and end, its
/// park and wake, its backoff, its timer, its caller's cancellation, a logout's sweep. Each runs
/// under the engine's lock and returns what the shell performs after unlocking (``Action``).
extension EngineState {
    /// What the top of a request's loop may do (``gate(_:_:now:date:)``).
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
    mutating func gate(_ id: UInt64, _ departure: Departure, now: Duration, date: Date) -> GateResult {
        guard let slot = slots[id], !departure.cancelled, slot.endReason == nil else { return GateResult(.ended) }
        if isLoggedOut(at: now) { return GateResult(.loggedOut) }
        if departure.mayHold, slot.holdsNewRequests, let flight, !flight.released {
            let usable = credentials.map { credentials in credentials.expiresAt.map { $0 > date } ?? true } ?? false
            return GateResult(
                .held, actions: join(id, route: usable ? nil : departure.beforeSending, held: true))
        }
        if slot.host != nil, !acquireDispatchSlot(id) {
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
        let actions = attemptBegan(id, cancellation: departure.attempt, timeoutAt: timeoutAt) ?? []
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
    mutating func attemptBegan(_ id: UInt64, cancellation: AttemptCancellation, timeoutAt: Duration?)
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
        _ id: UInt64, _ continuation: UnsafeContinuation<Void, Never>,
        into woken: inout Actions
    ) -> Bool {
        let ready =
            modifySlot(id) { slot -> Bool in
                if slot.phase.isWoken || slot.endReason != nil { return true }
                slot.parked = continuation
                return false
            } ?? true
        if !ready, slots[id]?.host != nil { releaseDispatchSlot(id, into: &woken) }
        return ready
    }

    /// Why a request's park ended (``woke(_:into:)``).
    struct Woke {
        /// Its wake (`nil`: none was set, it was ended).
        var wake: Wake?
        /// It was ended from outside (a logout, its caller).
        var endedOutside: Bool
    }

    /// Request `id`'s park ended: takes why, and appends its timer to take off the heap when the
    /// wait ended some other way than by its firing. It runs its loop on.
    mutating func woke(_ id: UInt64, into actions: inout Actions) -> Woke {
        modifySlot(id) { slot in
            var taken: Wake?
            if case .woken(let wake, _) = slot.phase { taken = wake }
            slot.phase = .running
            if slot.timerScheduled {
                slot.timerScheduled = false
                actions.append(.disarm)
            }
            return Woke(wake: taken, endedOutside: slot.endReason != nil)
        } ?? Woke(wake: nil, endedOutside: true)
    }

    /// Request `id` has its outcome: its dispatch slot goes to the next request (resumed from
    /// `woken` after unlocking) and its slot is removed.
    mutating func finished(_ id: UInt64, into woken: inout Actions) {
        if slots[id]?.host != nil { releaseDispatchSlot(id, into: &woken) }
        slots.removeValue(forKey: id)
    }

    /// What a retry's backoff start came to (``startBackoff(_:budget:until:deadline:now:)``).
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
    /// its backoff with its timer armed at `end` (appended to `actions`). In the order of the
    /// edges' precedence: budget, then deadline.
    mutating func startBackoff(
        _ id: UInt64, budget: RetrySettings.Budget?, until end: Duration, deadline: Duration?, now: Duration,
        into actions: inout Actions
    ) -> BackoffStart {
        guard let slot = slots[id], slot.endReason == nil else { return .ended }
        if let budget, !self.budget.takeRetry(at: now, budget: budget) { return .refused }
        if let deadline, end > deadline { return .pastDeadline }
        let token = modifySlot(id) { slot -> UInt64 in
            let token = slot.nextTimer()
            slot.phase = .backoff(timer: token)
            return token
        }
        actions.append(.arm(at: end, token: token ?? 0))
        return .started
    }

    /// Ends request `id` from outside its loop (its caller, or a logout): marks why, disarms its
    /// timer (a backoff's leaves the heap when the request's park ends, in its own task), and
    /// hands back its attempt and its park.
    mutating func end(_ id: UInt64, _ reason: EndReason) -> Actions {
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

    /// What a request does with the attempt that just ended (``attemptEnded(_:responseArrived:callerCancelled:)``).
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
    /// disarms it (its timer, appended to `actions`) and says what counts. A response that has
    /// arrived is the server's answer, which a logout decided a moment later does not unsay; only
    /// the caller's cancellation drops it.
    mutating func attemptDisposition(
        _ id: UInt64, responseArrived: Bool, callerCancelled: Bool, into actions: inout Actions
    ) -> AttemptDisposition {
        modifySlot(id) { slot in
            var timedOut = false
            if case .onWire(_, _, let timed) = slot.phase { timedOut = timed }
            slot.phase = .running
            if slot.timerScheduled {
                slot.timerScheduled = false
                actions.append(.disarm)
            }
            if callerCancelled { return .ended }
            switch slot.endReason {
            case nil: return .result(timedOut: timedOut)
            case .loggedOut? where responseArrived: return .arrivedAfterLogout
            default: return .ended
            }
        } ?? .ended
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

    /// What a `retry` rule came to (``retry(_:_:_:_:now:into:)``), in the order of its edges' precedence.
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
        /// retries or the edge it would take is not compiled.
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

    /// A `retry` rule matched request `id`'s attempt: retries left, then a request that may not
    /// be sent again, then the budget, then the deadline (the order of the edges' precedence);
    /// otherwise its backoff starts, the delay drawn here (`max-delay` caps it after jitter; a
    /// `Retry-After` the rule honours replaces it).
    mutating func retry(
        _ id: UInt64, _ flow: RuleGraph.CompiledRule, _ classified: Classified, _ ask: RetryAsk,
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
        switch startBackoff(id, budget: budget, until: now + delay, deadline: deadline, now: now, into: &actions) {
        case .refused: return .refused
        case .pastDeadline: return .pastDeadline
        case .ended: return .notRetried(nil)  // (not reached: its attempt's result counts)
        case .started: return .started(delay: delay)
        }
    }

    /// Request `id`'s timer fired: its attempt timed out, its backoff is over, or its deadline
    /// came while it waited for a refresh or a dispatch slot. A stale firing (the attempt ended,
    /// the request was ended, the refresh or the slot came first) finds another token armed, or
    /// a wake already set, and does nothing.
    mutating func timerFired(_ id: UInt64, token: UInt64) -> Actions {
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
    mutating func endRequests(_ trigger: UInt64?, cancelInFlight: Bool) -> Actions {
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
                    // rule (``attemptEnded(_:responseArrived:callerCancelled:)``).
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
