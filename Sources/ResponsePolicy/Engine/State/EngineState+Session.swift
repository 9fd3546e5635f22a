import Foundation

/// The session's transitions: what a refresh trigger, a refresh's end, a logout, a sign-in and
/// a coordinator's publication do to the credentials, their generations, the refresh in flight
/// and the cooldown.
///
/// Each is a `mutating func` that takes the time as an argument and returns what it decided; it
/// never awaits, locks or reads a clock. The shell (`PolicyEngine`) runs it under the engine's
/// lock and then performs the outcome (joins the request to the flight, starts the refresh task,
/// emits events, saves credentials, wakes waiters). So these rules are tested as a value, with
/// random event sequences and no threads (`SessionStateModelTests`).
extension EngineState {
    /// Notes that a server accepted a request signed with `generation`. Under `refresh.limit` the
    /// coordinator hears it once per shared generation (a process that saw that token refused must
    /// not count it fleet-wide).
    mutating func accepted(_ generation: UInt64, into actions: inout Actions) {
        if generation > acceptedGeneration { acceptedGeneration = generation }
        if generation == self.generation, sharedGeneration > reportedAcceptance, runtime.countsRefreshLimit {
            reportedAcceptance = sharedGeneration
            actions.append(.refresh(.noteAccepted(sharedGeneration)))
        }
    }

    /// What the refresh flight reads of the session at `now`.
    func sessionFacts(at now: Duration) -> RefreshFlight.SessionFacts {
        RefreshFlight.SessionFacts(
            generation: generation, acceptedGeneration: acceptedGeneration, sessionEpoch: sessionEpoch,
            signInEpoch: signInEpoch, sharedGeneration: sharedGeneration, credentials: credentials,
            loggedOut: isLoggedOut(at: now))
    }

    /// How the session of `runtime`'s policy is shared, for a flight that starts now.
    func coordination(_ runtime: PolicyRuntime, local: Bool, unavailable: Bool) -> RefreshFlight.Coordination {
        local ? .local : .shared(waits: runtime.policy.coordinationOnUnavailable == .wait, unavailable: unavailable)
    }

    /// Performs a step of the refresh flight inside the same transition: the work the shell does
    /// (a call, a turn, a publication, a timer, an event), the release of waiters at the deadline,
    /// or the ending the session takes (``flightEnded(_:_:now:date:)``). Returns the actions
    /// in order.
    mutating func flightStep(_ step: RefreshFlight.Step, now: Duration, date: Date) -> Actions {
        var actions: Actions = []
        switch step {
        case .none:
            break
        case .call(let call, let deadline, let problem):
            if let problem { actions.append(.refresh(.problem(problem, call.starter.context.runtime))) }
            if let deadline { actions.append(.refresh(.arm(deadline))) }
            actions.append(.refresh(.call(call)))
        case .ask(let id, let request, let deadline):
            if let deadline { actions.append(.refresh(.arm(deadline))) }
            if let flight = refresh.current, flight.id == id {
                actions.append(.refresh(.ask(id, request, flight.starter.context.runtime)))
            }
        case .wait(let timer, let retry, let problem):
            let runtime = (flight?.starter.context.runtime) ?? self.runtime
            if let problem { actions.append(.refresh(.problem(problem, runtime))) }
            if let retry, let starter = flight?.starter, !runtime.observers.isEmpty {
                var event = PolicyEvent(.refreshRetry, time: now, context: starter.context)
                event.attempt = retry.call
                event.delay = retry.delay
                event.status = retry.failure.response?.status
                event.reason = retry.failure.reason
                actions.append(.emit(event))
            }
            actions.append(.refresh(.arm(timer)))
        case .release(let id, let failure):
            // Its waiters fail with the reason (the session goes on); the call runs on, and a pair
            // it brings is still kept (a second `refresh-end` says so).
            guard let flight = refresh.current, flight.id == id else { break }
            let runtime = flight.starter.context.runtime
            if !runtime.observers.isEmpty {
                var event = PolicyEvent(.refreshEnd, time: now, context: flight.starter.context)
                event.ok = false
                event.reason = failure.reason
                event.category = .timeout
                actions.append(.emit(event))
            }
            endWaits(flight, .failed(failure), into: &actions)
            refresh.released(id)
        case .end(let ending):
            actions = flightEnded(ending, now: now, date: date)
        }
        return actions
    }

    /// A refresh ended, in one transition: the session takes what it produced, a definitive
    /// failure that leads a waiter to a logout starts that logout
    /// (``logOutForFailedRefresh(_:_:answerLogsOut:now:date:)``), and only then are the
    /// waiters woken and the dispatch queues moved, so no waiter is released and sent between the
    /// failure and the logout it causes.
    ///
    /// What the session takes:
    /// - a pair, for the session the refresh was for: new credentials, a new generation (unless
    ///   the coordinator's news brought them first), saved;
    /// - a pair after a logout with no sign-in since: kept and saved (the server has rotated the
    ///   refresh token, so the old one is dead), and the session stays logged out;
    /// - a pair after a sign-in: dropped, for the sign-in replaced that session;
    /// - a pair the refresh could not use (``RefreshFailure/keeping``): its refresh token replaces
    ///   the one held (the access token held stays), as a new generation that is remembered as failed;
    /// - a failure: a definitive one, or one with a kept pair, is remembered
    ///   (``RefreshFlight/ended(_:generation:tookCredentials:remember:now:)``); with coordination
    ///   trouble its waiters find ``FlightResult/unavailable(_:)`` and nobody is logged out.
    ///
    /// Returns the actions in order: save (when it took credentials), the `refresh-end` event, the
    /// waiters resumed, the logout's cancellations, the turn's end and a problem for the shell.
    mutating func flightEnded(
        _ ending: RefreshFlight.Ending, now: Duration, date: Date
    ) -> Actions {
        let ended = ending.flight
        let sameSession = sessionEpoch == ended.sessionEpoch
        var took = false
        var discarded = false
        var keptAfterLogout = false
        var result = FlightResult.cancelled
        switch ending.outcome {
        case .success(let fresh) where sameSession:
            // Adopted already when the coordinator's news arrived first.
            if ending.shared.map({ $0 > sharedGeneration }) ?? true {
                take(fresh, shared: ending.shared, lifetime: ending.lifetime)
                took = true
            }
            result = ending.adopted ? .adopted : ending.late ? .late : .ok
        case .success(let fresh) where signInEpoch == ended.signInEpoch:
            // A logout ended the session during the refresh, and nobody signed in since: the
            // server has already rotated the refresh token, so the old one is dead. Keep the new
            // tokens; the session stays logged out.
            take(fresh, shared: ending.shared, lifetime: ending.lifetime)
            took = true
            keptAfterLogout = true
            result = .superseded
        case .success(let fresh) where ending.shared != nil && !ending.issued:
            // The fleet's credentials (another process refreshed), for a session a sign-in here
            // replaced meanwhile: news like any other, taken when newer than what is held.
            if case .adopted = adopt(SharedSession(credentials: fresh, generation: ending.shared ?? 0), now: now) {
                took = true
            }
            result = .superseded
        case .success:
            discarded = true
            result = .superseded
        case .failure(let failure):
            if let pair = ending.kept, signInEpoch == ended.signInEpoch {
                // The server issued this pair: its refresh token is the one to present next time.
                let held = credentials
                take(
                    Credentials(
                        accessToken: held?.accessToken ?? "", refreshToken: pair.refreshToken ?? held?.refreshToken,
                        expiresAt: held?.expiresAt), shared: nil, lifetime: nil)
                took = true
            }
            // A failure after the session changed is the old session's: decide again.
            result = !sameSession ? .superseded : ending.trouble ? .unavailable(failure) : .failed(failure)
        }
        if case .failure(let failure) = ending.outcome {
            let remember = (failure.isDefinitive || ending.kept != nil) && !ending.trouble && sameSession
            refresh.ended(ending, generation: generation, tookCredentials: took, remember: remember, now: now)
        } else {
            refresh.ended(
                ending, generation: generation, tookCredentials: took && sameSession, remember: false, now: now)
        }
        var said: Actions = [.refresh(.disarm(ended.id))]
        let runtime = ended.starter.context.runtime
        if took { said.append(.save) }
        if let lease = ending.unpublished, took, let credentials {
            // Taken and saved first: the pair reaches the fleet under the lease after that.
            refresh.unpublished = (credentials, lease)
            said.append(.refresh(.publishPending(runtime)))
        } else if took, ending.kept != nil, case .shared = ended.coordination, let lease = ended.lease,
            let credentials
        {
            // The kept refresh token reaches the fleet under the lease: another process must not
            // present the one the server has spent.
            refresh.unpublished = (credentials, lease)
            said.append(.refresh(.publishPending(runtime)))
        } else if let lease = ending.endTurn, case .failure(let failure) = ending.outcome {
            // A wait the token endpoint asked for goes to the store with the turn's end: no
            // process is granted a lease before it ends (`Retry-After` is fleet-wide).
            // (Its reason is the token endpoint's answer; each process says how long is left.)
            if let embargo = refresh.embargo, embargo.until > now {
                said.append(
                    .refresh(.endTurn(lease, embargo.failure.reason, retryAfter: date + (embargo.until - now).seconds)))
            } else {
                said.append(.refresh(.endTurn(lease, failure.reason)))
            }
        }
        if let problem = ending.problem { said.append(.refresh(.problem(problem, runtime))) }
        if !runtime.observers.isEmpty {
            var event = PolicyEvent(.refreshEnd, time: now, context: ended.starter.context)
            event.category = PolicyEvent.Category(ending, discarded: discarded || keptAfterLogout)
            switch ending.outcome {
            case .success where discarded:
                event.ok = false
                event.reason = "the session was signed in again during the refresh; its token was discarded"
            case .success where keptAfterLogout:
                event.ok = false
                event.reason =
                    "the session was logged out during the refresh; its new tokens were saved, and the session stays logged out"
            case .success:
                event.ok = true
                if ended.released {
                    event.reason =
                        "answered after refresh.timeout (\(ended.settings.timeout.policyText)); the new tokens are kept"
                }
            case .failure(let failure):
                event.ok = false
                event.reason = failure.reason
                event.status = failure.response?.status
            }
            said.append(.emit(event))
        }
        if refresh.isIdle { said += settled() }
        guard !ended.detached else { return said }
        var actions: Actions = []
        var logout: (UInt64, DecidedLogout)?
        // A definitive failure that logs a waiter out does so here, before any waiter is woken,
        // so none is released and sent in between.
        if case .failed(let failure) = result, failure.isDefinitive,
            let decided = logOutForFailedRefresh(
                ended, failure, answerLogsOut: ending.answerLogsOut, now: now, date: date, into: &actions)
        {
            logout = (decided.trigger, decided.logout)
        }
        // The waiters are resumed first, then the logout's cancellations.
        var woken: Actions = said
        endWaits(ended, result, logout: logout, into: &woken)
        return woken + actions
    }

    /// Takes `fresh` as the session's credentials: a new generation (the coordinator's `shared`
    /// one when it numbered them), with their lifetime as issued (for `ahead`).
    private mutating func take(_ fresh: Credentials, shared: UInt64?, lifetime: Double?) {
        credentialsBox = CredentialsBox(fresh, lifetime: lifetime)
        generation += 1
        if let shared, shared > sharedGeneration { sharedGeneration = shared }
    }

    /// Resumes the callers waiting for the refresh to settle (``PolicyEngine/waitForBackgroundWork()``).
    mutating func settled() -> Actions {
        var actions: Actions = []
        for waiter in refreshSettled { actions.append(.resume(waiter)) }
        refreshSettled = []
        return actions
    }

    /// A refresh failed: when the failure leads one of its waiters to a logout (in request
    /// order, the first whose ``RefreshRoute`` ends in `logout`), the logout starts here, in the
    /// same critical section that ends the refresh: the cooldown begins and every other request
    /// (its waiters first, then the rest as `cancel-in-flight` says) is ended as logged out
    /// before any of them is woken. So no waiter is released and sent between the failure and
    /// the logout it causes. The trigger keeps its wait (``endWaits(_:_:logout:into:)``
    /// wakes it with the failure and the logout, whose effects it performs).
    ///
    /// The logout a failed refresh started on a waiter's edge (``logOutForFailedRefresh(_:_:answerLogsOut:now:date:into:)``).
    struct RefreshLogout {
        /// The waiter whose edge led there: it performs the logout's effects.
        let trigger: UInt64
        let logout: DecidedLogout
    }

    /// Returns the trigger and its logout, and appends what to resume and cancel; `nil` when no
    /// waiter logs out (or the session is already in a cooldown: many triggers make one logout).
    mutating func logOutForFailedRefresh(
        _ waiting: Flight, _ failure: RefreshFailure, answerLogsOut: Bool, now: Duration, date: Date,
        into actions: inout Actions
    ) -> RefreshLogout? {
        let waiters = live(waiting)
        var decided: (UInt64, RuleGraph.Escalation)?
        for id in waiters {
            guard let escalation = slots[id]?.refreshRoute?.escalation(answerLogsOut: answerLogsOut),
                escalation.action == .logout
            else { continue }
            decided = (id, escalation)
            break
        }
        guard let (trigger, escalation) = decided else { return nil }
        let cooldown = escalation.logout.cooldown
        guard
            startCooldown(
                until: now + cooldown, untilDate: date.addingTimeInterval(cooldown.seconds),
                reason: .refreshFailed(failure.reason, response: failure.response), extendOnly: false, now: now)
        else { return nil }
        for id in waiters where id != trigger {
            modifySlot(id) { slot in
                if slot.endReason == nil { slot.endReason = .loggedOut }
                // It no longer waits for the refresh; its deadline's timer no longer counts.
                slot.phase = .running
                if let continuation = slot.parked.take() { actions.append(.resume(continuation)) }
            }
        }
        actions += endRequests(trigger, cancelInFlight: escalation.logout.cancelInFlight)
        return RefreshLogout(trigger: trigger, logout: DecidedLogout(escalation))
    }

    /// Starts a cooldown until `until` (`untilDate` on the wall clock). `false` when the session
    /// is already in one: many triggers make one logout. With `extendOnly` (news from another
    /// process), a cooldown already running is extended when `untilDate` is later.
    mutating func startCooldown(
        until: Duration, untilDate: Date, reason: LogoutReason, extendOnly: Bool, now: Duration
    ) -> Bool {
        if isLoggedOut(at: now) {
            // Later by more than the stores' millisecond rounding: a process hearing its own
            // logout back counted it twice (issue 19).
            guard extendOnly, let current = loggedOutUntilDate, untilDate.timeIntervalSince(current) > 0.002 else {
                return false
            }
        }
        loggedOutUntil = until
        loggedOutUntilDate = untilDate
        logoutReason = reason
        // A refresh in flight belongs to the ended session: its token must not sign back in.
        sessionEpoch += 1
        return true
    }

    /// Ends the session, one transition for every way it ends (a request's `logout` rule or edge,
    /// the host's ``PolicyEngine/logout(reason:)``, news from another process): the cooldown starts
    /// (``startCooldown(until:untilDate:reason:extendOnly:now:)``; `until`: the end another
    /// process published, which extends a cooldown already running), every request but
    /// `trigger` is ended as logged out (``endRequests(_:cancelInFlight:)``), and the
    /// actions say the rest in order: the `logout` event, the requests resumed and cancelled, and
    /// the publication (`publishes`: the coordinator is told and `plugin` called, with the ending
    /// session's credentials read here, with the cooldown's start). Returns `false`, with no
    /// action, when the session is already in its cooldown: many triggers make one logout.
    @discardableResult
    mutating func endSession(
        cooldown: Duration, cancelInFlight: Bool, reason: LogoutReason, trigger: UInt64?,
        context: RequestContext?, plugin: (any LogoutPlugin)?, publishes: Bool, until: Date? = nil, now: Duration,
        date: Date, into actions: inout Actions
    ) -> Bool {
        let untilDate = until ?? date.addingTimeInterval(cooldown.seconds)
        guard
            startCooldown(
                until: now + cooldown, untilDate: untilDate, reason: reason, extendOnly: until != nil, now: now)
        else { return false }
        let ended = endRequests(trigger, cancelInFlight: cancelInFlight)
        if !(context?.runtime ?? runtime).observers.isEmpty {
            var event = PolicyEvent(.logout, time: now, context: context)
            event.rule = reason.ruleName
            event.reason = reason.eventText
            event.category = reason.category
            event.cooldown = until.map { $0.timeIntervalSince(date) }.map { .seconds(max(0, $0)) } ?? cooldown
            actions.append(.emit(event))
        }
        actions += ended
        if publishes || plugin != nil {
            actions.append(
                .publish(
                    LogoutNotice(
                        until: untilDate, reason: reason, credentials: credentials, requestID: context?.id,
                        plugin: plugin, publishes: publishes, epoch: sharedEpoch)))
        }
        return true
    }

    /// A sign-in: new credentials, the cooldown over, and a refresh in flight made the old
    /// session's (its token must not replace these).
    mutating func signIn(_ signedIn: Credentials) {
        credentials = signedIn
        generation += 1
        signInGeneration = generation
        sessionEpoch += 1
        signInEpoch += 1
        loggedOutUntil = nil
        loggedOutUntilDate = nil
        logoutReason = nil
    }

    /// What a coordinator's publication did (``adopt(_:now:)``).
    enum Adoption {
        /// Not newer than what is held: old news.
        case ignored
        /// The credentials held, only numbered.
        case numbered
        /// New credentials; the refresh in flight, when there was one, is answered by them.
        case adopted(answered: Flight?)
    }

    /// Adopts credentials another engine published, when their generation is newer than the one
    /// held. A refresh this engine awaits is answered by them (its waiters go on now; its own
    /// end later finds the generation adopted and changes nothing).
    mutating func adopt(_ session: SharedSession, now: Duration) -> Adoption {
        // A sign-in elsewhere after the credentials held were issued (its epoch, the generation it
        // stored at, is past theirs: issue 30, case 6): an attempt signed with them carried the
        // ended session's token, and a logout code in its answer ends nothing now, as after a
        // sign-in of this engine (``signInGeneration``).
        let signedInElsewhere = session.epoch > sharedGeneration
        if session.generation >= sharedGeneration, session.epoch <= session.generation {
            sharedEpoch = max(sharedEpoch, session.epoch)
        }
        guard let published = session.credentials, session.generation > sharedGeneration else { return .ignored }
        sharedGeneration = session.generation
        // The same tokens read back from another store (its expiry to the millisecond, the
        // credentials file's to the second) are not new credentials: adopting them as fresh made
        // the re-sent requests use up max-per-request and log the fleet out (issue 19).
        guard !published.sameTokens(as: credentials) else {
            if credentials?.expiresAt == nil, published.expiresAt != nil { credentials = published }
            return .numbered
        }
        credentials = published
        generation += 1
        if signedInElsewhere { signInGeneration = generation }
        guard let answered = flight, answered.sessionEpoch == sessionEpoch else { return .adopted(answered: nil) }
        refresh.lastRefresh = now
        return .adopted(answered: refresh.detach())
    }

    /// The coordinator stored this engine's sign-in of `signedIn` as `session`. `false` when it
    /// stored other credentials (a later sign-in elsewhere won), which are then to be adopted.
    mutating func signInStored(_ session: SharedSession, _ signedIn: Credentials) -> Bool {
        guard session.generation > sharedGeneration else { return true }
        guard session.credentials == nil || session.credentials?.sameTokens(as: signedIn) == true else { return false }
        sharedGeneration = session.generation
        sharedEpoch = max(sharedEpoch, session.epoch > 0 ? session.epoch : session.generation)
        return true
    }
}
