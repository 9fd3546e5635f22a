import Foundation

/// One request in flight: its decisions, and the state others reach it by (a logout, a timer,
/// the refresh it waits for, its caller's cancellation).
///
/// Why a synchronous state machine under a three-step async driver (`PolicyEngine.drive`): an
/// async function's frame lives on the task's heap for as long as it is suspended, and the
/// compiler sizes it for every temporary of every path. Written as one async loop, a request's
/// frame was 30 KB; with a driver awaiting five kinds of step it was still 2.4 KB, plus a frame
/// per nested wait. Here every decision runs synchronously on the thread's stack, every wait
/// (a backoff, a refresh in flight) is the same one park, and the driver awaits only an attempt
/// or a park with nothing but this object in its frame. What a request keeps while it waits is
/// this object and a few hundred bytes of frames.
///
/// A class, so the driver holds one reference, the steps mutate it in place, and the engine's
/// registry, the refresh's waiter list and the timer heap can point at it without allocating.
///
/// Concurrency contract: not `Sendable`. Its fields are the loop's own, touched only by the
/// request's task (one step at a time). What others reach the request by (its phase, its park,
/// its armed timer, its attempt) is its ``EngineState/Slot``, in the engine's state, found by
/// its number; its timer is a ``RequestTimer`` that knows only that number.
final class RequestMachine {

    /// What the driver awaits next.
    enum Step {
        case finish, send, park
    }

    /// What a park waits for.
    enum Parked {
        /// A backoff; a refresh this request started or joined (`proactive`: one ahead of expiry,
        /// or one a new request waits for under `hold-new-requests`); a free dispatch slot.
        case backoff, refresh(proactive: Bool), dispatch
    }

    typealias Wake = EngineState.Wake

    enum AttemptOutcome { case response, error, timedOut, cancelled }

    // MARK: The loop's own

    let engine: PolicyEngine
    let context: RequestContext
    let scopeIndex: Int
    let scope: RuleGraph.Scope
    let plugins: PolicyRuntime.ScopePlugins
    let path: String
    let deadline: Duration?
    let request: HTTPRequest
    /// The idempotency headers the engine generated (not the caller's): they carry a rule's key
    /// on every attempt but do not make a method retryable that the rule does not list.
    let generatedKeys: [String]
    /// The host whose dispatch slots this request takes; `nil` when dispatch is unlimited.
    let host: String?
    /// `dispatch.max-in-flight-per-host` of the policy it started under, `auto` resolved against
    /// the transport (`Int.max`: unlimited).
    let dispatchLimit: Int

    var result: Result<HTTPResponse, PolicyEngineError> = .failure(.cancelled)
    /// The signed request of the attempt about to go out (the unsigned one between attempts),
    /// and when it times out. (Not an optional: unwrapping one for the transport call cost the
    /// attempt's async frame 208 bytes.)
    var pendingRequest: HTTPRequest
    /// What the attempt about to go out is cancelled by (made for the gate, which begins it).
    var pendingAttempt: AttemptCancellation?
    /// What the last attempt came to; its response or error is in `lastResponse` or `failure`.
    var attemptOutcome = AttemptOutcome.cancelled
    var waitingFor = Parked.backoff
    /// The rule whose refresh is awaited (`nil`: the scope's settings), for its failure edges.
    var refreshRule: Int?

    var attempt = 0
    var retries = 0
    var refreshResends = 0
    var lastResponse: HTTPResponse?
    var lastCode: String?
    var failure: TransportError?
    /// The escalation edge taken after a refresh ended, reported with the outcome.
    var lastEdge: RuleGraph.Edge?
    /// Why a retry was refused (`budget`, `not-retryable`), for the outcome's reason.
    var refusal: RuleGraph.EdgeKind?
    /// The reason of the refresh that failed, for the outcome and the logout it leads to.
    var refreshFailureReason: String?
    /// The token endpoint's answer to that refresh, when it answered.
    var refreshFailureResponse: HTTPResponse?
    /// The token generation the last attempt was signed with.
    var signedGeneration: UInt64 = 0
    /// The proactive refresh for this turn of the loop is done.
    var skipProactive = false
    /// A proactive refresh of this request that failed, and the token generation it failed for:
    /// while that generation is current, the request neither refreshes ahead again nor calls the
    /// refresh plugin for a trigger, but meets this failure (one failure is one failure: the
    /// same dead refresh token is not sent twice). Boxed, to keep waiting requests small.
    var proactiveFailure: ProactiveFailure?

    final class ProactiveFailure {
        let failure: RefreshFailure
        let generation: UInt64

        init(_ failure: RefreshFailure, generation: UInt64) {
            self.failure = failure
            self.generation = generation
        }
    }

    /// The proactive refresh awaited gets the first credentials (there were none): its failure
    /// follows the failure edges, since there is no token to send instead.
    var signingIn = false

    /// Why this request asks for a refresh, for the refresh plugin (``RefreshContext/reason``).
    var refreshReason: String {
        if signingIn { return "sign-in" }
        if case .refresh(proactive: true) = waitingFor { return "ahead" }
        return refreshRule.map { scope.rules[$0].name } ?? "refresh"
    }

    /// The last response arrived although a logout had ended the request meanwhile: its rule
    /// may deliver or fail it, nothing else (the session is over).
    var arrivedAfterLogout = false
    /// The request has waited for a refresh before the attempt about to go out (held, ahead of
    /// expiry, signing in): it is not held again before that attempt, so each attempt waits for
    /// at most one refresh before it goes out (the bound ``WorstCase`` states).
    var preSendWaited = false
    /// The logout its awaited refresh's failure led to, started by the refresh's end (see
    /// ``EngineState/Wake/flight(_:logout:)``): this request performs its effects.
    var decidedLogout: EngineState.DecidedLogout?

    /// Its slot exists in the engine's state.
    var registered = false
    /// Its slot was removed by the transition that decided its outcome (``EngineState/attemptEnded(insideLock:responseArrived:gotError:callerCancelled:scope:_:now:)``).
    var slotFinished = false
    /// The rule the last attempt's result matched, and its business code.
    var classified = EngineState.Classified()
    /// What the attempt's end decided for a `retry` rule.
    var retryVerdict: EngineState.RetryVerdict?

    /// The time of the event the machine is handling (its start, an attempt's end, a park's
    /// end), on the engine's clock and on the wall clock: read once per event by the driver
    /// (``PolicyEngine/drive(_:)``), never by the machine.
    var now: Duration
    var date: Date

    @inline(never)
    init(engine: PolicyEngine, original: HTTPRequest, context: RequestContext, date: Date) {
        self.engine = engine
        self.context = context
        let graph = context.runtime.policy.graph
        let method = context.method
        let path = context.path
        let index = graph.scopeIndex(method: method, path: path)
        scopeIndex = index
        scope = graph.scopes[index]
        plugins = context.runtime.scopes[index]
        self.path = path
        var request = original
        generatedKeys = engine.prepareIdempotency(&request, scope)
        self.request = request
        pendingRequest = request
        deadline = scope.deadline.map { context.start + $0 }
        now = context.start
        self.date = date
        if let limit = context.runtime.policy.dispatch.maxInFlightPerHost.resolved(
            connectionsPerHost: engine.transportConnectionsPerHost)
        {
            dispatchLimit = limit
            host = original.url.host.map { host in original.url.port.map { "\(host):\($0)" } ?? host } ?? ""
        } else {
            dispatchLimit = .max
            host = nil
        }
    }

    var method: String { request.method }

    var runtime: PolicyRuntime { context.runtime }

    /// Its timer (attempt timeout, backoff, the deadline of a wait), made on first use: a
    /// request has at most one armed at a time.
    lazy var timer = RequestTimer(engine: engine, id: context.number)

    // MARK: - Outcomes

    @inline(never)
    func finish(_ result: Result<HTTPResponse, PolicyEngineError>) -> Step {
        engine.emit(runtime) { outcomeEvent(result) }
        self.result = result
        return .finish
    }

    func outcomeEvent(_ result: Result<HTTPResponse, PolicyEngineError>) -> PolicyEvent {
        var event = PolicyEvent(.outcome, time: now, context: context)
        event.edge = lastEdge?.id
        switch result {
        case .success(let response):
            event.result = .delivered
            event.status = response.status
            event.code = lastCode
        case .failure(let error):
            switch error {
            case .loggedOut: event.result = .loggedOut
            case .cancelled: event.result = .cancelled
            default:
                event.result = .failed
                event.reason = error.reasonText
            }
            if let lastResponse, error != .cancelled {
                event.status = lastResponse.status
                event.code = lastCode
            }
        }
        switch refusal {
        case .budget?: event.reason = "retry refused: budget"
        case .notRetryable?: event.reason = "\(method) not retried"
        default: break
        }
        return event
    }

    @inline(never)
    func loggedOut() -> Step { finish(.failure(engine.loggedOutError())) }

    /// Ended by another request's logout while on the wire or waiting: a `cancel` event, then
    /// the logged-out outcome (the trigger itself and requests refused in the cooldown have no
    /// `cancel`: nothing of theirs was interrupted).
    @inline(never)
    func cancelledByLogout() -> Step {
        engine.emit(runtime) {
            var event = PolicyEvent(.cancel, time: now, context: context)
            event.reason = "logout"
            return event
        }
        return loggedOut()
    }

    /// The request was ended from outside its loop: by a logout, or by its caller.
    @inline(never)
    func ended() -> Step {
        let reason = engine.state.withLock { $0.slots[context.number]?.endReason }
        if reason == .loggedOut { return cancelledByLogout() }
        engine.emit(runtime) {
            var event = PolicyEvent(.cancel, time: now, context: context)
            event.reason = "the caller cancelled the request"
            return event
        }
        return finish(.failure(.cancelled))
    }

    /// Delivers the last response, or fails with the transport error when there is none.
    func deliverOrFail() -> Step {
        if let lastResponse { return finish(.success(lastResponse)) }
        return finish(.failure(.transport(failure ?? TransportError(.connection))))
    }

    /// The `response` event of the attempt just classified: the rule that matched, and what the
    /// request does now — the rule's action, or where an escalation edge led (`deliver` with the
    /// reason `not-retryable`), with the edge taken.
    func emitResponse(
        rule: Rule?, action: ActionKind? = nil, reason: String? = nil,
        edge: @autoclosure () -> RuleGraph.Edge? = nil
    ) {
        engine.emit(runtime) {
            var event = PolicyEvent(.response, time: now, context: context)
            event.attempt = attempt
            event.status = lastResponse?.status
            event.code = lastCode
            event.error = failure?.errorClass
            event.rule = rule?.name
            event.action = action ?? rule?.action
            event.reason = reason
            event.edge = edge()?.id
            return event
        }
    }

    // MARK: - The top of the loop

    /// Checks the request may go on, refreshes ahead of expiry, then signs and sends.
    @inline(never)
    /// `gated`: the gate already passed under the lock that ended a park (a backoff's timer, a
    /// dispatch slot): one lock for waking and going on.
    func top(gated given: Gated? = nil) -> Step {
        let first = !registered
        // `now` is the time of the event that led here: the first turn runs at the request's
        // start, a later one (after a dispatch queue, a refresh, a backoff) when its park ended:
        // the attempt timeout runs from the moment the attempt leaves the engine.
        let hold = scope.refresh.holdNewRequests
        let id = context.number
        registered = true
        let deadline = deadline
        let gated: Gated
        if let given {
            gated = given
        } else {
            let departure = self.departure()
            let (now, date) = (now, date)
            gated = engine.state.withLock { state in
                if first {
                    state.register(
                        id, host: host, dispatchLimit: dispatchLimit, holdsNewRequests: hold, deadline: deadline)
                }
                return state.gate(insideLock: id, departure, now: now, date: date)
            }
        }
        let (box, generation) = (gated.credentials, gated.generation)
        switch gated.gate {
        case .go:
            // Its attempt began in the gate's transition, its timeout armed.
            engine.perform(gated.actions, for: self)
        case .refreshFirst:
            // No credentials and a plugin that can sign in (client_credentials, a login): the
            // first token before the request goes out, rather than sending it unsigned. Or the
            // token expires within `ahead`: a fresh one first.
            signingIn = gated.signingIn
            waitingFor = .refresh(proactive: true)
            refreshRule = nil
            return awaitRefresh(failedGeneration: generation, proactive: true)
        case .ended: return ended()
        case .loggedOut: return cancelledByLogout()
        case .held:
            // About to go out (a first attempt or a retry) while a refresh is in flight: it waits
            // for the fresh token, and says so.
            let attempt = attempt
            engine.emit(runtime) {
                var event = PolicyEvent(.held, time: now, context: context)
                event.attempt = attempt + 1
                event.reason = "refresh in flight"
                return event
            }
            waitingFor = .refresh(proactive: true)
            refreshRule = nil
            preSendWaited = true
            engine.perform(gated.actions, for: self)
            return .park
        case .queued:
            waitingFor = .dispatch
            let next = self.attempt + 1
            engine.emit(runtime) {
                var event = PolicyEvent(.queued, time: now, context: context)
                event.attempt = next
                return event
            }
            engine.perform(gated.actions, for: self)
            return .park
        }
        let credentials = box?.credentials
        signingIn = false
        skipProactive = false
        // Signed in place: the pending request is the one copy of the caller's request per attempt.
        var signed = request
        if let credentials, let authorize = plugins.authorize { authorize.authorize(&signed, with: credentials) }
        pendingRequest = consume signed
        signedGeneration = generation
        preSendWaited = false
        attempt += 1
        let attempt = attempt
        engine.emit(runtime) {
            var event = PolicyEvent(.send, time: now, context: context)
            event.attempt = attempt
            return event
        }
        return .send
    }

    /// What the gate needs of this request (see ``EngineState/Departure``), with a new
    /// attempt's cancellation, kept for the attempt when it goes.
    func departure() -> EngineState.Departure {
        var departure = EngineState.Departure()
        departure.cancelled = Task.isCancelled
        departure.mayHold = !preSendWaited
        departure.beforeSending = EngineState.RefreshRoute(scope: scope, rule: nil)
        departure.mayRefreshFirst = !skipProactive
        departure.signsIn = plugins.signsIn
        departure.refreshes = plugins.refresh != nil
        departure.ahead = scope.refreshAhead
        departure.failedAheadGeneration = proactiveFailure?.generation
        departure.attemptTimeout = scope.attemptTimeout
        pendingAttempt = departure.attempt
        return departure
    }

    /// The deadline passed while the request waited for a refresh or a dispatch slot.
    @inline(never)
    func waitedPastDeadline() -> Step {
        engine.emit(runtime) {
            var event = PolicyEvent(.cancel, time: now, context: context)
            event.reason = "deadline"
            return event
        }
        return finish(.failure(.deadlineExceeded))
    }

    // MARK: - After an attempt

    @inline(never)
    func afterAttempt() -> Step {
        pendingRequest = request  // drops the signed copy
        let outcome = attemptOutcome
        attemptOutcome = .cancelled
        let ruleIndex: Int?
        switch outcome {
        case .cancelled:
            return ended()
        case .response:
            guard lastResponse != nil else { return ended() }
            // Classified by the shell before the attempt's end (see `PolicyEngine.classify`).
            lastCode = classified.code
            ruleIndex = classified.rule
            if ruleIndex.map({ scope.rules[$0].action != .refresh && scope.rules[$0].action != .logout }) ?? true {
                // The server accepted this token: a later refresh of it is a healthy rotation.
                engine.noteAccepted(signedGeneration)
            }
        case .timedOut, .error:
            lastCode = nil
            if outcome == .timedOut {
                if let deadline, now >= deadline {
                    failure = TransportError(.timeout, "deadline")
                    emitResponse(rule: nil, reason: "deadline", edge: scope.attemptDeadline)
                    return finish(.failure(.deadlineExceeded))
                }
                failure = TransportError(
                    .timeout, "no response within \(scope.attemptTimeout?.policyText ?? "the attempt timeout")")
            }
            // The rule its error class (or `timeout`) matches.
            ruleIndex = classified.rule
        }
        guard let ruleIndex else {
            if let failure {
                emitResponse(rule: nil, edge: scope.noMatchError)
                return finish(.failure(.transport(failure)))
            }
            emitResponse(rule: nil, edge: scope.noMatchResponse)
            if let lastResponse { return finish(.success(lastResponse)) }
            return finish(.failure(.cancelled))
        }
        // From here the compiled rule decides: its action, and its escalation edges.
        let flow = scope.compiled[ruleIndex]
        switch flow.action {
        case .deliver:
            emitResponse(rule: flow.rule)
            return deliverOrFail()
        case .fail:
            emitResponse(rule: flow.rule)
            guard let lastResponse else { return finish(.failure(.transport(failure ?? TransportError(.connection)))) }
            return finish(.failure(.failed(response: lastResponse, rule: flow.rule.name)))
        case .logout:
            emitResponse(rule: flow.rule)
            return logout(flow.logout, reason: .rule(flow.rule.name, response: lastResponse))
        case .refresh where arrivedAfterLogout, .retry where arrivedAfterLogout:
            // The session ended while this response came in: no refresh or retry follows.
            emitResponse(rule: flow.rule)
            return cancelledByLogout()
        case .refresh:
            return refreshTrigger(flow)
        case .retry:
            return retryTrigger(flow)
        }
    }

    /// Follows an escalation edge of `flow`: the response event says where it led and why, and
    /// the request ends there. `error` is the failure when the edge leads to fail.
    func follow(
        _ escalation: RuleGraph.Escalation, of flow: RuleGraph.CompiledRule,
        failing error: @autoclosure () -> PolicyEngineError, emit: Bool = true
    ) -> Step {
        // Taken with a response, the response event names the edge; taken after a refresh ended,
        // the outcome does.
        if !emit { lastEdge = escalation.edge }
        if escalation.edge.kind == .budget || escalation.edge.kind == .notRetryable {
            refusal = escalation.edge.kind
        }
        if emit {
            emitResponse(
                rule: flow.rule, action: escalation.action, reason: escalation.edge.kind.rawValue,
                edge: escalation.edge)
        }
        switch escalation.action {
        case .logout:
            return logout(escalation.logout, reason: .rule(flow.rule.name, response: lastResponse))
        case .deliver:
            if lastResponse == nil, case .retriesExhausted = error() { return finish(.failure(error())) }
            return deliverOrFail()
        default:
            return finish(.failure(error()))
        }
    }

    func refreshTrigger(_ flow: RuleGraph.CompiledRule) -> Step {
        // The generation first: refused with a token older than the current one, the request is
        // re-sent with the current one at once, and that re-send is not counted (no refresh was
        // waited for; the same holds for credentials adopted from the fleet: issue 19, invariant d).
        if engine.state.withLock({ $0.generation }) > signedGeneration {
            emitResponse(rule: flow.rule)
            return top()
        }
        guard refreshResends < flow.refresh.maxPerRequest else {
            let error = PolicyEngineError.refreshFailed(
                reason: "the request was re-sent \(refreshResends) time(s) for refresh triggers")
            guard let exhausted = flow.onExhausted else { return finish(.failure(error)) }
            return follow(exhausted, of: flow, failing: error)
        }
        emitResponse(rule: flow.rule)
        refreshResends += 1
        refreshRule = flow.index
        if let earlier = proactiveFailure, earlier.generation == signedGeneration,
            engine.state.withLock({ $0.generation }) == signedGeneration
        {
            // This request's refresh ahead of expiry already failed for this token: that is the
            // refresh's failure, not a reason to send the same refresh token again.
            return afterRefresh(.failed(earlier.failure), proactive: false)
        }
        waitingFor = .refresh(proactive: false)
        return awaitRefresh(failedGeneration: signedGeneration, proactive: false)
    }

    /// The refresh settings of the refresh awaited.
    var refreshSettings: RefreshSettings { refreshRule.map { scope.compiled[$0].refresh } ?? scope.refresh }

    /// Asks the engine for a token newer than `failedGeneration`: an answer now, or a park until
    /// the refresh in flight ends.
    @inline(never)
    func awaitRefresh(failedGeneration: UInt64, proactive: Bool) -> Step {
        // Where this request goes when the refresh fails: its rule's failure edges, or (before
        // sending, with no usable token) the scope's; with a token still valid, nowhere yet (it
        // is sent with it).
        let route: EngineState.RefreshRoute?
        if !proactive {
            route = EngineState.RefreshRoute(scope: scope, rule: refreshRule)
        } else if signingIn || !tokenUsable() {
            route = EngineState.RefreshRoute(scope: scope, rule: nil)
        } else {
            route = nil
        }
        guard
            let result = engine.decideRefresh(
                self, failedGeneration: failedGeneration, settings: refreshSettings, proactive: proactive, route: route)
        else {
            // Parked until the refresh ends, its deadline's timer armed with the wait.
            if proactive { preSendWaited = true }
            return .park
        }
        return afterRefresh(result, proactive: proactive)
    }

    /// Whether the credentials held now can still be sent (present and not expired).
    func tokenUsable() -> Bool {
        let credentials = engine.state.withLock { $0.credentials }
        guard let credentials else { return false }
        return credentials.expiresAt.map { $0 > date } ?? true
    }

    func afterRefresh(_ result: EngineState.FlightResult, proactive: Bool) -> Step {
        if let decided = decidedLogout?.escalation, case .failed(let failure) = result {
            // The refresh's end already logged the session out on this request's edge (the
            // cooldown runs, every other request was ended): perform the logout's effects.
            decidedLogout = nil
            lastEdge = decided.edge
            refreshFailureReason = failure.reason
            refreshFailureResponse = failure.response
            engine.logout(
                settings: decided.logout, plugins: plugins, trigger: self,
                reason: .refreshFailed(failure.reason, response: failure.response), started: true)
            return loggedOut()
        }
        if case .unavailable(let refreshFailure) = result {
            // Coordination trouble: the request fails with the reason (or, ahead of expiry, goes
            // out with the token it has); no failure edge is taken, so nobody is logged out.
            if proactive, !signingIn, let credentials = engine.state.withLock({ $0.credentials }),
                credentials.expiresAt.map({ $0 > date }) ?? true
            {
                skipProactive = true
                return top()
            }
            signingIn = false
            refreshRule = nil
            refreshFailureReason = refreshFailure.reason
            return finish(.failure(.refreshFailed(reason: refreshFailure.reason)))
        }
        if case .superseded = result {
            // The refresh belonged to a session that has since ended: decide again, without
            // counting another re-send (a sign-in's token is newer and retried at once).
            return proactive ? top() : awaitRefresh(failedGeneration: signedGeneration, proactive: false)
        }
        if case .adopted = result {
            // Credentials the fleet already held answered the refresh (no token call): the re-send
            // is the generation rule's and is not counted (issue 19, invariant d), so a refusal of
            // them leads to a coordinated refresh, never to on-exhausted.
            if !proactive, refreshResends > 0 { refreshResends -= 1 }
            refreshRule = nil
            return top()
        }
        if proactive {
            switch result {
            case .loggedOut: return cancelledByLogout()
            case .cancelled: return ended()
            case .failed(let refreshFailure):
                let (credentials, generation) = engine.state.withLock { ($0.credentials, $0.generation) }
                if signingIn || credentials == nil || credentials?.expiresAt.map({ $0 <= date }) == true {
                    // No token, or an expired one (signing in, or held for a refresh that failed):
                    // sending would only fetch a refresh trigger. The failure edges decide.
                    signingIn = false
                    return afterRefresh(.failed(refreshFailure), proactive: false)
                }
                // The token is still valid for a moment: try it, but remember the failure.
                proactiveFailure = ProactiveFailure(refreshFailure, generation: generation)
                skipProactive = true
                return top()
            default:
                skipProactive = true
                return top()
            }
        }
        let flow = refreshRule.map { scope.compiled[$0] }
        refreshRule = nil
        switch result {
        case .ok, .superseded, .unavailable, .adopted: return top()  // (.unavailable, .adopted: handled above)
        case .loggedOut: return cancelledByLogout()
        case .cancelled: return ended()
        case .failed(let refreshFailure) where !refreshFailure.isDefinitive:
            // Transient trouble outlasted refresh.timeout (or a definitive answer is still fresh:
            // see `EngineState.decideRefresh`): the request fails with the reason, the session
            // goes on. Only a definitive answer reaches on-failure.
            lastEdge = flow?.onTransient?.edge
            return finish(.failure(.refreshFailed(reason: refreshFailure.reason)))
        case .failed(let refreshFailure):
            // The refresh's own reason goes with every way this ends (a logout names it too).
            refreshFailureReason = refreshFailure.reason
            refreshFailureResponse = refreshFailure.response
            let error = PolicyEngineError.refreshFailed(reason: refreshFailure.reason)
            guard let flow, let onFailure = flow.onFailure else {
                // A refresh before sending (ahead of expiry, signing in) has no rule: the
                // scope's own edge decides.
                guard let escalation = scope.beforeSendingFailure else { return finish(.failure(error)) }
                lastEdge = escalation.edge
                switch escalation.action {
                case .logout:
                    return logout(
                        escalation.logout,
                        reason: .refreshFailed(refreshFailure.reason, response: refreshFailure.response))
                case .deliver where lastResponse != nil: return deliverOrFail()
                default: return finish(.failure(error))
                }
            }
            if let response = refreshFailure.response, let answer = flow.refreshAnswer,
                engine.endsSession(response, scope: scope, scopeIndex: scopeIndex, runtime, method: method, path: path)
            {
                return follow(answer, of: flow, failing: error, emit: false)
            }
            return follow(onFailure, of: flow, failing: error, emit: false)
        }
    }

    /// A `retry` rule matched: what the attempt's end decided (``EngineState/RetryVerdict``).
    func retryTrigger(_ flow: RuleGraph.CompiledRule) -> Step {
        let verdict = retryVerdict
        retryVerdict = nil
        switch verdict {
        case .notRetried(let edge)?:
            guard let edge else {
                return finish(.failure(.retriesExhausted(lastResponse: lastResponse, lastError: failure)))
            }
            return follow(edge, of: flow, failing: .retriesExhausted(lastResponse: lastResponse, lastError: failure))
        case .refused?:
            guard let refused = flow.budget else { return ended() }
            return follow(refused, of: flow, failing: .retriesExhausted(lastResponse: lastResponse, lastError: failure))
        case .pastDeadline?:
            // A wait that would end past the deadline is not started.
            guard let edge = flow.deadline else { return ended() }
            return follow(edge, of: flow, failing: .deadlineExceeded)
        case .started(let delay)?:
            // In its backoff, its timer armed by the attempt's end.
            emitResponse(rule: flow.rule, edge: flow.again)
            retries += 1
            let (attempt, now) = (attempt, now)
            engine.emit(runtime) {
                var event = PolicyEvent(.wait, time: now, context: context)
                event.delay = delay
                event.attempt = attempt
                return event
            }
            waitingFor = .backoff
            return .park
        case nil:
            return ended()
        }
    }

    /// Whether this request may be sent again under a rule's effective retry settings: its
    /// method is listed, or the caller gave it the rule's idempotency key.
    func isRetryable(_ settings: RetrySettings) -> Bool {
        if settings.methods.contains(method) { return true }
        guard let header = settings.idempotencyKey, !generatedKeys.contains(header) else { return false }
        return request.headers[header] != nil
    }

    @inline(never)
    func logout(_ settings: LogoutSettings, reason: LogoutReason) -> Step {
        // A logout that a failed refresh led to names the refresh's reason, whichever edge led there.
        let reason =
            refreshFailureReason.map { LogoutReason.refreshFailed($0, response: refreshFailureResponse) } ?? reason
        engine.logout(settings: settings, plugins: plugins, trigger: self, reason: reason)
        return loggedOut()
    }

    // MARK: - After a park

    typealias Gated = EngineState.GateResult

    /// The park ended: the backoff's timer, the refresh's end, or the request was ended.
    @inline(never)
    func afterPark() -> Step {
        // A backoff's timer or a dispatch slot sends the request on: the gate at the top of its
        // loop runs under the same lock as the wake.
        let goesOn: Wake?
        switch waitingFor {
        case .backoff: goesOn = .timer
        case .dispatch: goesOn = .dispatched
        case .refresh: goesOn = nil
        }
        let departure = goesOn == nil ? nil : self.departure()
        let (now, date) = (now, date)
        let id = context.number
        let (woken, endedOutside, disarm, gated) = engine.state.withLock {
            state -> (Wake?, Bool, Actions, Gated?) in
            let (woken, endedOutside, disarm) = state.woke(insideLock: id)
            var gated: Gated?
            if !endedOutside, let goesOn, let woken, woken.sameKind(as: goesOn) {
                if let departure { gated = state.gate(insideLock: id, departure, now: now, date: date) }
            }
            return (woken, endedOutside, disarm, gated)
        }
        // Woken some other way than by its timer: the timer leaves the heap here, in the task that
        // scheduled it, so no ordering of the two can leave it behind.
        engine.perform(disarm, for: self)
        var decided: EngineState.DecidedLogout?
        if case .flight(_, let logout)? = woken { decided = logout }
        decidedLogout = decided
        switch waitingFor {
        case .backoff:
            if endedOutside { return ended() }
            return top(gated: gated)
        case .refresh(let proactive):
            // The logout this request's edge led to was started with the refresh's end: its
            // effects are this request's to perform, even when it was ended meanwhile.
            if decided != nil, case .flight(let result, _)? = woken {
                return afterRefresh(result, proactive: proactive)
            }
            if endedOutside { return ended() }
            // Its deadline came first.
            if case .timer? = woken { return waitedPastDeadline() }
            guard case .flight(let result, _)? = woken else { return ended() }
            return afterRefresh(result, proactive: proactive)
        case .dispatch:
            if endedOutside { return ended() }
            if case .timer? = woken { return waitedPastDeadline() }
            guard case .dispatched? = woken else { return ended() }
            return top(gated: gated)
        }
    }
}
