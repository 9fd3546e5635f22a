import Foundation

/// A request's decisions, one transition per event its driver brings, each under one lock: the
/// top of its loop (``proceed(_:_:into:)``), its attempt's end (``attemptEnded(_:_:_:into:)``),
/// the end of a park (``afterPark(_:_:into:)``), a token endpoint's answer judged
/// (``refreshFailed(_:_:rule:_:into:)``) and its end from outside (``ended(_:_:into:)``); and the
/// steps they share: a refresh trigger, what a refresh it waited for came to, an escalation edge,
/// carrying out a logout, and its outcome (``finish(_:_:_:into:)``, the one place an outcome is
/// made). Each takes the event (the request's ``RequestEvent``, read by its driver with the time)
/// and the request's own ``RequestLoop`` `inout`, and returns what the driver does next
/// (``Next``) with the ordered ``Actions`` the shell performs after unlocking. None awaits, locks
/// or reads a clock.
extension EngineState {
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

    /// The request has its outcome: its slot goes (its dispatch slot to the next request), and the
    /// `outcome` event says what it came to (the edge that led there, the last response's status
    /// and code, why a retry was refused). Every outcome is decided here, in the transition that
    /// ends the request.
    mutating func finish(
        _ r: RequestEvent, _ loop: RequestLoop, _ result: Result<HTTPResponse, PolicyEngineError>,
        into actions: inout Actions
    ) -> Next {
        finished(r.id, into: &actions)
        note(r, .outcome, into: &actions) { event in
            event.edge = loop.lastEdge?.id
            event.scope = r.scope.id
            switch result {
            case .success(let response):
                event.result = .delivered
                event.status = response.status
                event.code = r.code
            case .failure(let error):
                switch error {
                case .loggedOut: event.result = .loggedOut
                case .cancelled: event.result = .cancelled
                default:
                    event.result = .failed
                    event.reason = error.reasonText
                    event.category = error.category
                }
                if let response = r.lastResponse, error != .cancelled {
                    event.status = response.status
                    event.code = r.code
                }
            }
            switch loop.refusal {
            case .budget?:
                event.reason = "retry refused: budget"
                event.category = .budget
            case .notRetryable?:
                event.reason = "\(r.context.method) not retried"
                event.category = .notRetryable
            default: break
            }
        }
        return .finish(result)
    }

    /// The error of a request a logout ended: the cooldown's end and reason.
    func loggedOutError(_ date: Date) -> PolicyEngineError {
        let (until, reason) = cooldown ?? (date, .host("logged out"))
        return .loggedOut(until: until, reason: reason)
    }

    /// Ended by a logout while on the wire or waiting: a `cancel` event, then the logged-out
    /// outcome.
    mutating func cancelledByLogout(_ r: RequestEvent, _ loop: RequestLoop, into actions: inout Actions) -> Next {
        note(r, .cancel, into: &actions) { $0.reason = "logout" }
        return finish(r, loop, .failure(loggedOutError(r.date)), into: &actions)
    }

    /// The request was ended from outside its loop: by a logout, or by its caller.
    mutating func ended(_ r: RequestEvent, _ loop: RequestLoop, into actions: inout Actions) -> Next {
        if slots[r.id]?.endReason == .loggedOut { return cancelledByLogout(r, loop, into: &actions) }
        note(r, .cancel, into: &actions) { $0.reason = "the caller cancelled the request" }
        return finish(r, loop, .failure(.cancelled), into: &actions)
    }

    /// The deadline passed while the request waited for a refresh or a dispatch slot.
    mutating func waitedPastDeadline(_ r: RequestEvent, _ loop: RequestLoop, into actions: inout Actions) -> Next {
        note(r, .cancel, into: &actions) { $0.reason = "deadline" }
        return finish(r, loop, .failure(.deadlineExceeded), into: &actions)
    }

    /// Delivers the last response, or fails with the transport error when there is none.
    mutating func deliverOrFail(_ r: RequestEvent, _ loop: RequestLoop, into actions: inout Actions) -> Next {
        if let response = r.lastResponse { return finish(r, loop, .success(response), into: &actions) }
        return finish(r, loop, .failure(.transport(r.failure ?? TransportError(.connection))), into: &actions)
    }

    /// Whether the credentials held can still be sent at `date` (present and not expired).
    func tokenUsable(at date: Date) -> Bool {
        guard let credentials else { return false }
        return credentials.expiresAt.map { $0 > date } ?? true
    }

    /// The top of request `r`'s loop: the gate (``gate(_:_:now:date:)``) with what its
    /// loop says (held at most once per attempt, no second refresh ahead in one turn), and what
    /// the gate's answer leads to: it goes out (its attempt numbered, signed with the credentials
    /// returned), it waits (held, queued: an event says so), it refreshes first, or it ends.
    mutating func proceed(_ r: RequestEvent, _ loop: inout RequestLoop, into actions: inout Actions) -> Next {
        var departure = r.departure
        departure.mayHold = !loop.preSendWaited
        departure.mayRefreshFirst = !loop.skipProactive
        departure.failedAheadGeneration = loop.proactiveFailure?.generation
        let gated = gate(r.id, departure, now: r.now, date: r.date)
        switch gated.gate {
        case .go:
            // Its attempt began in the gate, its timeout armed.
            actions += gated.actions
            loop.signingIn = false
            loop.skipProactive = false
            loop.signedGeneration = gated.generation
            loop.signedExpiry = gated.credentials?.credentials.expiresAt.flatMap { $0 > r.date ? $0 : nil }
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
                r, &loop, failedGeneration: gated.generation, proactive: true, into: &actions)
        case .ended:
            return ended(r, loop, into: &actions)
        case .loggedOut:
            return cancelledByLogout(r, loop, into: &actions)
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

    /// What an attempt's end brings to its transition (``attemptEnded(_:_:_:into:)``): what came
    /// back, the rule it matches (found by the shell before the lock: a lookup in the compiled flow,
    /// with the body's code scan outside the lock), whether the caller's task was cancelled, and the
    /// randomness a retry's jitter draws from.
    struct AttemptEnd {
        var result: AttemptResult
        var classified: Classified
        var callerCancelled = false
        var random: any RandomSource
    }

    /// Request `r`'s attempt ended: the one transition that decides what that leads to, from the
    /// compiled flow. What counts first (``attemptDisposition(_:responseArrived:callerCancelled:into:)``):
    /// a request ended from outside ends (its caller, or a logout before any answer); an answer that
    /// arrived after a logout is handled by its rule, but a refresh or retry it asks for ends it
    /// logged out. Then the answer becomes the request's last (a timeout's error, or at its
    /// deadline the deadline's), a response not refused accepts the token it was signed with, and
    /// the rule it matched decides: none delivers the response (or fails with the error);
    /// `deliver` and `fail` end it; `logout` ends the session; `refresh` is a refresh trigger
    /// (``refreshTrigger(_:_:_:into:)``); `retry` starts its backoff, or follows the escalation
    /// edge its verdict leads along (``retry(_:_:_:_:now:into:)``). Its events (`response`, `wait`,
    /// `outcome`) are made here with the decision.
    mutating func attemptEnded(
        _ event: RequestEvent, _ loop: inout RequestLoop, _ end: AttemptEnd, into actions: inout Actions
    ) -> Next {
        var r = event
        var arrived = false
        if case .response = end.result { arrived = true }
        let disposition = attemptDisposition(
            r.id, responseArrived: arrived, callerCancelled: end.callerCancelled, into: &actions)
        let timedOut: Bool
        switch disposition {
        case .ended: return ended(r, loop, into: &actions)
        case .arrivedAfterLogout: timedOut = false
        case .result(let timed): timedOut = timed
        }
        let afterLogout = disposition == .arrivedAfterLogout
        switch end.result {
        case .response(let response):
            (loop.lastResponse, loop.failure, loop.lastCode) = (response, nil, end.classified.code)
        case .error(let error):
            (loop.lastResponse, loop.failure, loop.lastCode) = (nil, error, nil)
        case .cancelled where timedOut:
            (loop.lastResponse, loop.lastCode) = (nil, nil)
            if let deadline = slots[r.id]?.deadline, r.now >= deadline {
                loop.failure = TransportError(.timeout, "deadline")
                r.answer(loop)
                noteResponse(r, loop, rule: nil, reason: "deadline", edge: r.scope.attemptDeadline, into: &actions)
                return finish(r, loop, .failure(.deadlineExceeded), into: &actions)
            }
            loop.failure = Self.timeoutFailure(r.scope)
        case .cancelled:
            // Cancelled before it was answered, and not by its timer.
            return ended(r, loop, into: &actions)
        }
        r.answer(loop)
        guard let rule = end.classified.rule else {
            if case .response = end.result { accepted(loop.signedGeneration, into: &actions) }
            if let failure = loop.failure {
                noteResponse(r, loop, rule: nil, edge: r.scope.noMatchError, into: &actions)
                return finish(r, loop, .failure(.transport(failure)), into: &actions)
            }
            noteResponse(r, loop, rule: nil, edge: r.scope.noMatchResponse, into: &actions)
            guard let response = loop.lastResponse else { return finish(r, loop, .failure(.cancelled), into: &actions) }
            return finish(r, loop, .success(response), into: &actions)
        }
        let flow = r.scope.compiled[rule]
        if case .response = end.result, flow.action != .refresh, flow.action != .logout {
            // The server accepted this token: a later refresh of it is a healthy rotation.
            accepted(loop.signedGeneration, into: &actions)
        }
        switch flow.action {
        case .deliver:
            noteResponse(r, loop, rule: flow.rule, into: &actions)
            return deliverOrFail(r, loop, into: &actions)
        case .fail:
            noteResponse(r, loop, rule: flow.rule, into: &actions)
            guard let response = loop.lastResponse else {
                return finish(
                    r, loop, .failure(.transport(loop.failure ?? TransportError(.connection))), into: &actions)
            }
            return finish(r, loop, .failure(.failed(response: response, rule: flow.rule.name)), into: &actions)
        case .logout:
            noteResponse(r, loop, rule: flow.rule, into: &actions)
            return carryOutLogout(
                r, &loop, flow.logout, reason: .rule(flow.rule.name, response: loop.lastResponse), into: &actions)
        case .refresh where afterLogout, .retry where afterLogout:
            // The session ended while this response came in: no refresh or retry follows.
            noteResponse(r, loop, rule: flow.rule, into: &actions)
            return cancelledByLogout(r, loop, into: &actions)
        case .refresh:
            return refreshTrigger(r, &loop, flow, into: &actions)
        case .retry:
            return retryTrigger(r, &loop, flow, end, into: &actions)
        }
    }

    /// A `retry` rule matched request `r`'s attempt: its backoff starts (the `response` event
    /// names the loop edge, a `wait` event the delay, and the retry is counted), or the verdict's
    /// escalation edge is followed (``RetryVerdict/escalation(of:exhausted:)``); a verdict whose
    /// edge is not compiled fails the request with its retries exhausted.
    mutating func retryTrigger(
        _ r: RequestEvent, _ loop: inout RequestLoop, _ flow: RuleGraph.CompiledRule, _ end: AttemptEnd,
        into actions: inout Actions
    ) -> Next {
        let ask = RetryAsk(retries: loop.retries, response: loop.lastResponse, date: r.date, random: end.random)
        let verdict = retry(r.id, flow, end.classified, ask, now: r.now, into: &actions)
        let exhausted = PolicyEngineError.retriesExhausted(lastResponse: loop.lastResponse, lastError: loop.failure)
        if case .started(let delay) = verdict {
            noteResponse(r, loop, rule: flow.rule, edge: flow.again, into: &actions)
            loop.retries += 1
            let attempt = loop.attempt
            note(r, .wait, into: &actions) { event in
                event.delay = delay
                event.attempt = attempt
            }
            loop.waitingFor = .backoff
            return .park
        }
        guard let (escalation, error) = verdict.escalation(of: flow, exhausted: exhausted) else {
            return finish(r, loop, .failure(exhausted), into: &actions)
        }
        return follow(r, &loop, escalation, of: flow, failing: error, into: &actions)
    }

    /// The error of an attempt that timed out before its deadline.
    static func timeoutFailure(_ scope: RuleGraph.Scope) -> TransportError {
        TransportError(.timeout, "no response within \(scope.attemptTimeout?.policyText ?? "the attempt timeout")")
    }

    /// A `refresh` rule matched request `r`'s attempt. The generation first: refused with a token
    /// older than the current one, the request is re-sent with the current one at once, and that
    /// re-send is not counted (no refresh was waited for; the same holds for credentials adopted
    /// from the fleet: issue 19, invariant d). Then `max-per-request` (its `on-exhausted` edge),
    /// unless the token expired in flight (see below); then a failure of this request's own
    /// refresh ahead of expiry for this very token (met again, not asked again: the same refresh
    /// token is never presented twice); otherwise it starts or joins the refresh.
    ///
    /// Expired in flight: the token was valid when the attempt left and its lifetime, as the
    /// token endpoint issued it, ended before the answer came. Its refusal says the token grew
    /// old, not that the server refuses fresh tokens, so the refresh it leads to is not counted:
    /// an attempt slower than a token's whole life (a loaded machine, tokens of a few seconds)
    /// does not use up `max-per-request` and reach `on-exhausted`, whose default is a logout. The
    /// request's deadline bounds such re-sends, and a token refused before its time is counted.
    mutating func refreshTrigger(
        _ r: RequestEvent, _ loop: inout RequestLoop, _ flow: RuleGraph.CompiledRule,
        into actions: inout Actions
    ) -> Next {
        if generation > loop.signedGeneration {
            noteResponse(r, loop, rule: flow.rule, into: &actions)
            return proceed(r, &loop, into: &actions)
        }
        let expiredInFlight = loop.signedExpiry.map { $0 <= r.date } ?? false
        guard expiredInFlight || loop.refreshResends < flow.refresh.maxPerRequest else {
            let error = PolicyEngineError.refreshFailed(
                reason: "the request was re-sent \(loop.refreshResends) time(s) for refresh triggers")
            guard let exhausted = flow.onExhausted else {
                return finish(r, loop, .failure(error), into: &actions)
            }
            return follow(r, &loop, exhausted, of: flow, failing: error, into: &actions)
        }
        noteResponse(r, loop, rule: flow.rule, into: &actions)
        loop.triggerCounted = !expiredInFlight
        if loop.triggerCounted { loop.refreshResends += 1 }
        loop.refreshRule = flow.index
        if let earlier = loop.proactiveFailure, earlier.generation == loop.signedGeneration,
            generation == loop.signedGeneration
        {
            // This request's refresh ahead of expiry already failed for this token: that is the
            // refresh's failure, not a reason to send the same refresh token again.
            return afterRefresh(r, &loop, .failed(earlier.failure), proactive: false, into: &actions)
        }
        loop.waitingFor = .refresh(proactive: false)
        return awaitRefresh(
            r, &loop, failedGeneration: loop.signedGeneration, proactive: false, into: &actions)
    }

    /// Asks for a token newer than `failedGeneration` (``RefreshFlight/trigger(_:_:now:)``):
    /// an answer now, or a wait for the refresh in flight, joined in this transition (its
    /// deadline's timer armed with it), which this may just have started.
    mutating func awaitRefresh(
        _ r: RequestEvent, _ loop: inout RequestLoop, failedGeneration: UInt64, proactive: Bool,
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
            return afterRefresh(r, &loop, .cancelled, proactive: proactive, into: &actions)
        }
        let settings = loop.refreshRule.map { r.scope.compiled[$0].refresh } ?? r.scope.refresh
        let trigger = RefreshFlight.Trigger(
            failedGeneration: failedGeneration, settings: settings, proactive: proactive,
            reason: loop.refreshReason(r.scope),
            starter: RefreshFlight.Starter(context: r.context, scopeIndex: r.scopeIndex),
            coordination: r.departure.coordination)
        let failure: RefreshFailure
        let refusal: RefreshFlight.Refusal
        switch refresh.trigger(trigger, sessionFacts(at: r.now), now: r.now) {
        case .loggedOut:
            return afterRefresh(r, &loop, .loggedOut, proactive: proactive, into: &actions)
        case .retryNow:
            return afterRefresh(r, &loop, .ok, proactive: proactive, into: &actions)
        case .refused(let refused, let why):
            (failure, refusal) = (refused, why)
        case .join(_, let rearm):
            // Parked until the refresh ends, its deadline's timer armed with the wait.
            actions += join(r.id, route: route)
            if let rearm { actions.append(.refresh(.arm(rearm))) }
            if proactive { loop.preSendWaited = true }
            return .park
        case .start(_, let step):
            actions += join(r.id, route: route)
            note(r, .refreshStart, into: &actions) { _ in }
            actions += flightStep(step, now: r.now, date: r.date)
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
        return afterRefresh(r, &loop, .failed(failure), proactive: proactive, into: &actions)
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
        _ r: RequestEvent, _ loop: inout RequestLoop, _ result: FlightResult, proactive: Bool,
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
            logoutEffects(r, reason: reason, into: &actions)
            return finish(r, loop, .failure(loggedOutError(r.date)), into: &actions)
        }
        switch result {
        case .unavailable(let failure):
            // Coordination trouble: the request fails with the reason (or, ahead of expiry, goes
            // out with the token it has); no failure edge is taken, so nobody is logged out.
            if proactive, !loop.signingIn, tokenUsable(at: r.date) {
                loop.skipProactive = true
                return proceed(r, &loop, into: &actions)
            }
            loop.signingIn = false
            loop.refreshRule = nil
            loop.refreshFailureReason = failure.reason
            return finish(r, loop, .failure(.refreshFailed(reason: failure.reason)), into: &actions)
        case .superseded:
            // The refresh belonged to a session that has since ended: decide again, without
            // counting another re-send (a sign-in's token is newer and retried at once).
            if proactive { return proceed(r, &loop, into: &actions) }
            return awaitRefresh(
                r, &loop, failedGeneration: loop.signedGeneration, proactive: false, into: &actions)
        case .loggedOut:
            return cancelledByLogout(r, loop, into: &actions)
        case .cancelled:
            return ended(r, loop, into: &actions)
        case .late where proactive, .ok:
            // This engine's own pair (ahead of expiry, a late one too: nothing was counted for it).
            if proactive { loop.skipProactive = true } else { loop.refreshRule = nil }
            return proceed(r, &loop, into: &actions)
        case .adopted, .late:
            // Credentials the fleet already held answered the refresh (no token call), or a pair
            // read past refresh.timeout (the process was frozen with the answer waiting, so its
            // access token may have expired meanwhile): the re-send is not counted (issue 19,
            // invariant d), so a refusal of them leads to another (coordinated) refresh, never to
            // on-exhausted.
            if !proactive, loop.triggerCounted, loop.refreshResends > 0 { loop.refreshResends -= 1 }
            loop.refreshRule = nil
            return proceed(r, &loop, into: &actions)
        case .failed(let failure) where proactive:
            if loop.signingIn || !tokenUsable(at: r.date) {
                // No token, or an expired one (signing in, or held for a refresh that failed):
                // sending would only fetch a refresh trigger. The failure edges decide.
                loop.signingIn = false
                return afterRefresh(r, &loop, .failed(failure), proactive: false, into: &actions)
            }
            // The token is still valid for a moment: try it, but remember the failure.
            loop.proactiveFailure = ProactiveFailure(failure, generation: generation)
            loop.skipProactive = true
            return proceed(r, &loop, into: &actions)
        case .failed(let failure) where !failure.isDefinitive:
            // Transient trouble outlasted refresh.timeout (or a definitive answer is still fresh:
            // see `decideRefresh`): the request fails with the reason, the session goes on. Only a
            // definitive answer reaches on-failure.
            let flow = loop.refreshRule.map { r.scope.compiled[$0] }
            loop.refreshRule = nil
            loop.lastEdge = flow?.onTransient?.edge
            return finish(r, loop, .failure(.refreshFailed(reason: failure.reason)), into: &actions)
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
                    return finish(r, loop, .failure(error), into: &actions)
                }
                loop.lastEdge = escalation.edge
                switch escalation.action {
                case .logout:
                    return carryOutLogout(
                        r, &loop, escalation.logout,
                        reason: .refreshFailed(failure.reason, response: failure.response), into: &actions)
                case .deliver where r.lastResponse != nil:
                    return deliverOrFail(r, loop, into: &actions)
                default:
                    return finish(r, loop, .failure(error), into: &actions)
                }
            }
            if failure.response != nil, r.scope.compiled[rule].refreshAnswer != nil, r.answerLogsOut == nil {
                // Whether the answer matches a logout rule is a code scan: made outside the lock.
                return .judge(rule: rule, failure)
            }
            return refreshFailed(r, &loop, rule: rule, failure, into: &actions)
        }
    }

    /// A refresh for rule `rule` failed definitively: its `refresh-answer` edge when the token
    /// endpoint's answer matches a `logout` rule (``RequestEvent/answerLogsOut``), else its
    /// `on-failure`.
    mutating func refreshFailed(
        _ r: RequestEvent, _ loop: inout RequestLoop, rule: Int, _ failure: RefreshFailure,
        into actions: inout Actions
    ) -> Next {
        let flow = r.scope.compiled[rule]
        let error = PolicyEngineError.refreshFailed(reason: failure.reason)
        if failure.response != nil, let answer = flow.refreshAnswer, r.answerLogsOut == true {
            return follow(r, &loop, answer, of: flow, failing: error, emit: false, into: &actions)
        }
        guard let onFailure = flow.onFailure else { return finish(r, loop, .failure(error), into: &actions) }
        return follow(r, &loop, onFailure, of: flow, failing: error, emit: false, into: &actions)
    }

    /// Follows an escalation edge of `flow`: the response event says where it led and why (taken
    /// with a response; taken after a refresh ended, the outcome names the edge), and the request
    /// ends there. `error` is the failure when the edge leads to fail.
    mutating func follow(
        _ r: RequestEvent, _ loop: inout RequestLoop, _ escalation: RuleGraph.Escalation,
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
            return carryOutLogout(
                r, &loop, escalation.logout, reason: .rule(flow.rule.name, response: r.lastResponse),
                into: &actions)
        case .deliver:
            if r.lastResponse == nil, case .retriesExhausted = error {
                return finish(r, loop, .failure(error), into: &actions)
            }
            return deliverOrFail(r, loop, into: &actions)
        default:
            return finish(r, loop, .failure(error), into: &actions)
        }
    }

    /// Request `r`'s park ended: its backoff's timer or a dispatch slot sends it on (the gate runs
    /// in this transition), the refresh it waited for ended (``afterRefresh(_:_:_:proactive:into:)``),
    /// its deadline came, or it was ended. Its timer leaves the heap here when the wait ended some
    /// other way than by its firing.
    mutating func afterPark(_ r: RequestEvent, _ loop: inout RequestLoop, into actions: inout Actions)
        -> Next
    {
        let woke = woke(r.id, into: &actions)
        let (woken, endedOutside) = (woke.wake, woke.endedOutside)
        var decided: DecidedLogout?
        var result: FlightResult?
        if case .flight(let flightResult, let logout)? = woken { (decided, result) = (logout, flightResult) }
        loop.decidedLogout = decided
        switch loop.waitingFor {
        case .backoff:
            if endedOutside { return ended(r, loop, into: &actions) }
            return proceed(r, &loop, into: &actions)
        case .refresh(let proactive):
            // The logout this request's edge led to was started with the refresh's end: its
            // effects are this request's to perform, even when it was ended meanwhile.
            if decided != nil, let result {
                return afterRefresh(r, &loop, result, proactive: proactive, into: &actions)
            }
            if endedOutside { return ended(r, loop, into: &actions) }
            // Its deadline came first.
            if case .timer? = woken { return waitedPastDeadline(r, loop, into: &actions) }
            guard let result else { return ended(r, loop, into: &actions) }
            return afterRefresh(r, &loop, result, proactive: proactive, into: &actions)
        case .dispatch:
            if endedOutside { return ended(r, loop, into: &actions) }
            if case .timer? = woken { return waitedPastDeadline(r, loop, into: &actions) }
            guard case .dispatched? = woken else { return ended(r, loop, into: &actions) }
            return proceed(r, &loop, into: &actions)
        }
    }

    /// Carries out a rule's `logout` for request `r` (directly, as an escalation, or as the
    /// failure edge of its refresh): the cooldown starts and every other request is ended
    /// (``endSession(cooldown:cancelInFlight:reason:trigger:now:date:)``), the event and
    /// the publication follow after unlocking, and the request ends logged out. Many triggers
    /// make one logout: a request that finds the cooldown running only ends.
    mutating func carryOutLogout(
        _ r: RequestEvent, _ loop: inout RequestLoop, _ settings: LogoutSettings, reason: LogoutReason,
        into actions: inout Actions
    ) -> Next {
        // The server's logout code answered an attempt signed before the last sign-in: it ended
        // the session that attempt belonged to, which the sign-in already replaced. The request
        // fails by its rule; the session signed in since goes on (a race, not the server ending
        // this session).
        if loop.refreshFailureReason == nil, case .rule(let name, let response?) = reason,
            loop.signedGeneration < signInGeneration
        {
            return finish(r, loop, .failure(.failed(response: response, rule: name)), into: &actions)
        }
        // A logout that a failed refresh led to names the refresh's reason, whichever edge led there.
        let reason =
            loop.refreshFailureReason.map { LogoutReason.refreshFailed($0, response: loop.refreshFailureResponse) }
            ?? reason
        let plugin = r.context.runtime.scopes[r.scopeIndex].logout
        endSession(
            cooldown: settings.cooldown, cancelInFlight: settings.cancelInFlight, reason: reason, trigger: r.id,
            context: r.context, plugin: plugin, publishes: true, now: r.now, date: r.date, into: &actions)
        return finish(r, loop, .failure(loggedOutError(r.date)), into: &actions)
    }

    /// The effects of a logout a refresh's end already started on request `r`'s edge (the
    /// cooldown and the ending of the other requests are done): the event and the publication.
    func logoutEffects(_ r: RequestEvent, reason: LogoutReason, into actions: inout Actions) {
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
                    requestID: r.context.id, plugin: r.context.runtime.scopes[r.scopeIndex].logout, publishes: true,
                    epoch: sharedEpoch)))
    }
}
