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
    /// What a refresh trigger leads to (``decideRefresh(failedGeneration:settings:proactive:now:)``).
    enum RefreshDecision {
        /// The session is in its cooldown.
        case loggedOut
        /// A newer token exists (or one within `share-window`): retry with it now.
        case retryNow
        /// Wait for the refresh in flight.
        case join(Flight)
        /// This trigger starts a refresh: the flight, and the credentials it replaces.
        case start(Flight, credentials: Credentials?)
        /// `refresh.limit` is used up: a failed refresh, without a call.
        case limited(RefreshFailure)
        /// The last refresh of these credentials failed definitively a moment ago: that failure
        /// again, without a call (as transient: it already reached `on-failure` once).
        case remembered(RefreshFailure)
    }

    /// How long a definitive refresh failure is answered from memory: `refresh.timeout` (10 s by
    /// default). A refresh that cannot succeed (a wrong client secret) is then tried at most once
    /// per timeout, not once per request, and every request meanwhile fails with its reason.
    static func definitiveHold(_ settings: RefreshSettings) -> Duration {
        settings.timeout
    }

    /// Notes that a server accepted a request signed with `generation`.
    mutating func accepted(_ generation: UInt64) {
        if generation > acceptedGeneration { acceptedGeneration = generation }
    }

    /// Decides what a refresh trigger does. A request whose token is already older than the
    /// current one retries at once; within `share-window` after a refresh it retries without
    /// refreshing; a refresh of credentials whose last refresh failed definitively within
    /// ``definitiveHold(_:)`` fails again without a call; beyond `limit` (refreshes that did not
    /// help: of a token no server accepted) the refresh fails without a call; otherwise it joins
    /// the refresh in flight or starts one.
    mutating func decideRefresh(
        failedGeneration: UInt64, settings: RefreshSettings, proactive: Bool, now: Duration
    ) -> RefreshDecision {
        if isLoggedOut(at: now) { return .loggedOut }
        if generation > failedGeneration { return .retryNow }
        if let flight { return .join(flight) }
        if !proactive, let last = lastRefresh, now - last < settings.shareWindow { return .retryNow }
        if let memory = lastDefinitive, memory.generation == generation {
            let hold = Self.definitiveHold(settings)
            if now - memory.at < hold {
                var again = memory.failure
                again.kind = .transient
                again.reason += " (the last refresh's answer; not asked again within \(hold.policyText))"
                return .remembered(again)
            }
            lastDefinitive = nil
        }
        // A refresh that did not help: of a token no server accepted (a loop). Only these count.
        let unhelped = !proactive && (acceptedGeneration < generation || generation == 0)
        if let limit = settings.limit, unhelped {
            refreshCalls.removeAll { now - $0 >= limit.per }
            if refreshCalls.count >= limit.count {
                return .limited(
                    RefreshFailure("more than \(limit.count) refreshes in \(limit.per.policyText) (refresh.limit)"))
            }
            refreshCalls.append(now)
        }
        nextFlight += 1
        let started = Flight(
            id: nextFlight, sessionEpoch: sessionEpoch, signInEpoch: signInEpoch, sharedGeneration: sharedGeneration,
            countsTowardLimit: unhelped)
        flight = started
        return .start(started, credentials: credentials)
    }

    /// What a refresh's end did (``refreshEnded(_:outcome:shared:now:)``).
    struct RefreshEnd {
        /// New credentials were taken: save them.
        var saved = false
        /// The refresh succeeded for a session that has since ended: its token was dropped.
        var discarded = false
        /// The refresh succeeded after a logout with no sign-in since: its tokens were kept (the
        /// server has rotated the refresh token), and the session stays logged out.
        var keptAfterLogout = false
        /// What its waiters find.
        var result = FlightResult.cancelled
        /// The flight as the state held it, with its waiters (`nil`: already answered, by a
        /// coordinator's publication).
        var waiting: Flight?
    }

    /// Ends `ended` (the refresh task's copy) with what the refresh produced (`shared`: the
    /// generation the coordinator gave the credentials) and says what its waiters find. A result
    /// for a session that has since been logged out or signed in again is dropped: its waiters
    /// decide again.
    ///
    /// With `coordinationTrouble`, a failure is the fleet's, not the token endpoint's: its waiters
    /// find ``FlightResult/unavailable(_:)`` (they fail; nobody is logged out).
    mutating func refreshEnded(
        _ ended: Flight, outcome: Result<Credentials, RefreshFailure>, shared: UInt64?, now: Duration,
        coordinationTrouble: Bool = false, adopted: Bool = false
    ) -> RefreshEnd {
        var end = RefreshEnd()
        if flight?.id == ended.id {
            end.waiting = flight
            flight = nil
        }
        switch outcome {
        case .success(let fresh) where sessionEpoch == ended.sessionEpoch:
            // Adopted already when the coordinator's news arrived first.
            if shared.map({ $0 > sharedGeneration }) ?? true {
                credentials = fresh
                generation += 1
                if let shared { sharedGeneration = shared }
                end.saved = true
            }
            lastRefresh = now
            end.result = adopted ? .adopted : .ok
        case .success(let fresh) where signInEpoch == ended.signInEpoch:
            // A logout ended the session during the refresh, and nobody signed in since: the
            // server has already rotated the refresh token, so the old one is dead. Keep the new
            // tokens (saved by the shell); the session stays logged out.
            credentials = fresh
            generation += 1
            if let shared, shared > sharedGeneration { sharedGeneration = shared }
            end.saved = true
            end.keptAfterLogout = true
            end.result = .superseded
        case .success:
            end.discarded = true
            end.result = .superseded
        case .failure(let failure):
            // A failure after the session changed is the old session's: decide again.
            end.result =
                sessionEpoch != ended.sessionEpoch
                ? .superseded : coordinationTrouble ? .unavailable(failure) : .failed(failure)
            if failure.isDefinitive, !coordinationTrouble, sessionEpoch == ended.sessionEpoch {
                lastDefinitive = (generation, failure, now)
            }
        }
        return end
    }

    /// A refresh failed: when the failure leads one of its waiters to a logout (in request
    /// order, the first whose ``RefreshRoute`` ends in `logout`), the logout starts here, in the
    /// same critical section that ends the refresh: the cooldown begins and every other request
    /// (its waiters first, then the rest as `cancel-in-flight` says) is ended as logged out
    /// before any of them is woken. So no waiter is released and sent between the failure and
    /// the logout it causes. The trigger keeps its wait (``endWaits(insideLock:_:logout:into:)``
    /// wakes it with the failure and the logout, whose effects it performs).
    ///
    /// Returns the trigger, its logout, and what to resume and cancel; `nil` when no waiter logs
    /// out (or the session is already in a cooldown: many triggers make one logout).
    mutating func logOutForFailedRefresh(
        insideLock waiting: Flight, _ failure: RefreshFailure, answerLogsOut: Bool, now: Duration, date: Date
    ) -> (trigger: UInt64, logout: DecidedLogout, actions: Actions)? {
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
        var actions: Actions = []
        for id in waiters where id != trigger {
            modifySlot(id) { slot in
                if slot.endReason == nil { slot.endReason = .loggedOut }
                // It no longer waits for the refresh; its deadline's timer no longer counts.
                slot.phase = .running
                if let continuation = slot.parked.take() { actions.append(.resume(continuation)) }
            }
        }
        actions += endRequests(insideLock: trigger, cancelInFlight: escalation.logout.cancelInFlight)
        return (trigger, DecidedLogout(escalation), actions)
    }

    /// The refresh task's end, in one transition: the session takes what the refresh produced
    /// (``refreshEnded(_:outcome:shared:now:coordinationTrouble:adopted:)``; `lifetime`: the seconds the
    /// new access token is valid for, as issued), a definitive failure that leads a waiter to a
    /// logout starts that logout (``logOutForFailedRefresh(insideLock:_:answerLogsOut:now:date:)``),
    /// and only then are the waiters woken and the dispatch queues moved. `answerLogsOut`: the
    /// token endpoint's answer matches a logout rule.
    ///
    /// Returns what the refresh's end did, whether it logged out, and the actions in order: save
    /// the credentials (when it took new ones), the `refresh-end` event (about `context`, the
    /// request that started the refresh; made when someone observes), then the waiters resumed
    /// and the logout's cancellations.
    mutating func refreshEnded(
        insideLock ended: Flight, outcome: Result<Credentials, RefreshFailure>, shared: UInt64?, lifetime: Double?,
        answerLogsOut: Bool, coordinationTrouble: Bool, adopted: Bool = false, context: RequestContext? = nil,
        now: Duration, date: Date
    ) -> (RefreshEnd, loggedOut: Bool, Actions) {
        let end = refreshEnded(
            ended, outcome: outcome, shared: shared, now: now, coordinationTrouble: coordinationTrouble,
            adopted: adopted)
        if end.saved, let fresh = try? outcome.get(), credentials == fresh {
            credentialsBox = CredentialsBox(fresh, lifetime: lifetime)
        }
        var said: Actions = []
        if end.saved { said.append(.save) }
        if let context, !context.runtime.observers.isEmpty {
            var event = PolicyEvent(.refreshEnd, time: now, context: context)
            switch outcome {
            case .success where end.discarded:
                event.ok = false
                event.reason = "the session was signed in again during the refresh; its token was discarded"
            case .success where end.keptAfterLogout:
                event.ok = false
                event.reason =
                    "the session was logged out during the refresh; its new tokens were saved, and the session stays logged out"
            case .success: event.ok = true
            case .failure(let failure):
                event.ok = false
                event.reason = failure.reason
                event.status = failure.response?.status
            }
            said.append(.emit(event))
        }
        guard let waiting = end.waiting else { return (end, false, said) }
        var actions: Actions = []
        var logout: (UInt64, DecidedLogout)?
        // A definitive failure that logs a waiter out does so here, before any waiter is woken,
        // so none is released and sent in between.
        if case .failed(let failure) = end.result, failure.isDefinitive,
            let decided = logOutForFailedRefresh(
                insideLock: waiting, failure, answerLogsOut: answerLogsOut, now: now, date: date)
        {
            logout = (decided.trigger, decided.logout)
            actions = decided.actions
        }
        // The waiters are resumed first, then the logout's cancellations, as before.
        var woken: Actions = said
        endWaits(insideLock: waiting, end.result, logout: logout, into: &woken)
        return (end, logout != nil, woken + actions)
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
    /// `trigger` is ended as logged out (``endRequests(insideLock:cancelInFlight:)``), and the
    /// actions say the rest in order: the `logout` event, the requests resumed and cancelled, and
    /// the publication (`publishes`: the coordinator is told and `plugin` called, with the ending
    /// session's credentials read here, with the cooldown's start). Returns `false`, with no
    /// action, when the session is already in its cooldown: many triggers make one logout.
    @discardableResult
    mutating func logOut(
        insideLock cooldown: Duration, cancelInFlight: Bool, reason: LogoutReason, trigger: UInt64?,
        context: RequestContext?, plugin: (any LogoutPlugin)?, publishes: Bool, until: Date? = nil, now: Duration,
        date: Date, into actions: inout Actions
    ) -> Bool {
        let untilDate = until ?? date.addingTimeInterval(cooldown.seconds)
        guard
            startCooldown(
                until: now + cooldown, untilDate: untilDate, reason: reason, extendOnly: until != nil, now: now)
        else { return false }
        let ended = endRequests(insideLock: trigger, cancelInFlight: cancelInFlight)
        if !(context?.runtime ?? runtime).observers.isEmpty {
            var event = PolicyEvent(.logout, time: now, context: context)
            event.rule = reason.ruleName
            event.reason = reason.eventText
            actions.append(.emit(event))
        }
        actions += ended
        if publishes || plugin != nil {
            actions.append(
                .publish(
                    LogoutNotice(
                        until: untilDate, reason: reason, credentials: credentials, requestID: context?.id,
                        plugin: plugin, publishes: publishes)))
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
        guard let answered = flight, answered.sessionEpoch == sessionEpoch else { return .adopted(answered: nil) }
        lastRefresh = now
        flight = nil
        return .adopted(answered: answered)
    }

    /// The coordinator stored this engine's sign-in of `signedIn` as `session`. `false` when it
    /// stored other credentials (a later sign-in elsewhere won), which are then to be adopted.
    mutating func signInStored(_ session: SharedSession, _ signedIn: Credentials) -> Bool {
        guard session.generation > sharedGeneration else { return true }
        guard session.credentials == nil || session.credentials?.sameTokens(as: signedIn) == true else { return false }
        sharedGeneration = session.generation
        return true
    }
}
