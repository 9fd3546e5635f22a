import Foundation

/// One request in flight, driven: it performs what its transitions decide and nothing else.
///
/// Every decision is a transition of ``EngineState`` (the gate at the top of its loop, its
/// attempt's end with the refresh trigger or logout rule it meets, the retry's verdict, the end of
/// a park with the after-refresh tree, an escalation edge, carrying out a `logout`), run under the
/// engine's lock, one acquisition per event (``run(_:_:)``), with the request's own counters (its
/// ``EngineState/RequestLoop``) handed to it `inout`. What the machine does itself is what cannot
/// run under a lock or is only reporting: sign the attempt (the authorize plugin), read the code of
/// a token endpoint's answer (``EngineState/Next/judge(rule:_:)``), and emit the `send`, `response`
/// and `outcome` events of what was decided. It reads no clock: the driver reads the time once per
/// event (``PolicyEngine/drive(_:)``).
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

    typealias Parked = EngineState.RequestLoop.Parked

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
    /// How the session is shared, for a refresh this request starts.
    let coordination: RefreshFlight.Coordination

    var result: Result<HTTPResponse, PolicyEngineError> = .failure(.cancelled)
    /// The signed request of the attempt about to go out (the unsigned one between attempts),
    /// and when it times out. (Not an optional: unwrapping one for the transport call cost the
    /// attempt's async frame 208 bytes.)
    var pendingRequest: HTTPRequest
    /// What the attempt about to go out is cancelled by (made for the gate, which begins it).
    var pendingAttempt: AttemptCancellation?
    /// What the last attempt came to; its response or error is in `lastResponse` or `failure`.
    var attemptOutcome = AttemptOutcome.cancelled
    /// Its counters and what it waits for: what its transitions decide from (see
    /// ``EngineState/RequestLoop``), handed to each `inout`.
    var loop = EngineState.RequestLoop()
    var attempt: Int { loop.attempt }
    var retries: Int {
        get { loop.retries }
        set { loop.retries = newValue }
    }
    var lastResponse: HTTPResponse?
    var lastCode: String?
    var failure: TransportError?

    /// The last response arrived although a logout had ended the request meanwhile: its rule
    /// may deliver or fail it, nothing else (the session is over).
    var arrivedAfterLogout = false
    /// Its slot exists in the engine's state.
    var registered = false
    /// Its slot was removed by the transition that decided its outcome (``EngineState/attemptEnded(insideLock:responseArrived:gotError:callerCancelled:scope:_:now:)``).
    var slotFinished = false
    /// That transition finished it because its attempt timed out at its deadline.
    var finishedAtDeadline = false
    /// The rule the last attempt's result matched, and its business code.
    var classified = EngineState.Classified()
    /// What the attempt's end decided for a `retry` rule.
    var retryVerdict: EngineState.RetryVerdict?

    /// What a refresh trigger or a logout rule decided in the transition that ended the attempt
    /// (see `PolicyEngine.endAttempt`), for ``afterAttempt()`` to carry out. Boxed: only those
    /// attempts have one, and every waiting request carries the field.
    var decided: Decided?

    final class Decided {
        let next: EngineState.Next
        init(_ next: EngineState.Next) { self.next = next }
    }

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
        coordination = engine.refreshCoordination(context.runtime)
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
        event.edge = loop.lastEdge?.id
        event.scope = scope.id
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
                event.category = error.category
            }
            if let lastResponse, error != .cancelled {
                event.status = lastResponse.status
                event.code = lastCode
            }
        }
        switch loop.refusal {
        case .budget?:
            event.reason = "retry refused: budget"
            event.category = .budget
        case .notRetryable?:
            event.reason = "\(method) not retried"
            event.category = .notRetryable
        default: break
        }
        return event
    }

    /// Delivers the last response, or fails with the transport error when there is none.
    func deliverOrFail() -> Step {
        if let lastResponse { return finish(.success(lastResponse)) }
        return finish(.failure(.transport(failure ?? TransportError(.connection))))
    }

    /// The `response` event of the attempt just classified: the rule that matched, and what the
    /// request does now.
    func emitResponse(rule: Rule?, reason: String? = nil, edge: @autoclosure () -> RuleGraph.Edge? = nil) {
        engine.emit(runtime) {
            var event = PolicyEvent(.response, time: now, context: context)
            event.attempt = attempt
            event.status = lastResponse?.status
            event.code = lastCode
            event.error = failure?.errorClass
            event.rule = rule?.name
            event.action = rule?.action
            event.reason = reason
            event.edge = edge()?.id
            return event
        }
    }

    // MARK: - The driver

    /// The event this request's transition is about (see ``EngineState/RequestEvent``): the time
    /// read by the driver, the last attempt's answer, and a departure made ready in case the
    /// request goes out in the transition (its attempt's cancellation kept for the attempt).
    func event() -> EngineState.RequestEvent {
        var departure = EngineState.Departure()
        departure.cancelled = Task.isCancelled
        departure.beforeSending = EngineState.RefreshRoute(scope: scope, rule: nil)
        departure.signsIn = plugins.signsIn
        departure.refreshes = plugins.refresh != nil
        departure.ahead = scope.refreshAhead
        departure.attemptTimeout = scope.attemptTimeout
        departure.coordination = coordination
        pendingAttempt = departure.attempt
        return EngineState.RequestEvent(
            id: context.number, scope: scope, scopeIndex: scopeIndex, context: context, now: now, date: date,
            departure: departure, lastResponse: lastResponse, failure: failure, code: lastCode)
    }

    /// Runs one transition of this request under the engine's lock (one acquisition), performs its
    /// actions after unlocking, and does what it decided.
    @inline(never)
    func run(
        _ event: EngineState.RequestEvent,
        _ transition: (inout EngineState, EngineState.RequestEvent, inout EngineState.RequestLoop, inout Actions) ->
            EngineState.Next
    ) -> Step {
        var actions = Actions()
        // (The loop is the machine's own: only this request's task touches it, so it is changed in
        // place, under the engine's lock, with no copy.)
        let next = engine.state.withLock { state in transition(&state, event, &self.loop, &actions) }
        engine.perform(actions, for: self)
        return apply(next, event)
    }

    /// Does what a transition decided: signs and sends, parks, reports the outcome, or classifies
    /// a token endpoint's answer (outside the lock) and lets the refresh's failure decide.
    func apply(_ next: EngineState.Next, _ event: EngineState.RequestEvent?) -> Step {
        switch next {
        case .park:
            return .park
        case .finish(let result):
            slotFinished = true
            return finish(result)
        case .send(let box, _):
            // Signed in place: the pending request is the one copy of the caller's request per attempt.
            var signed = request
            if let credentials = box?.credentials, let authorize = plugins.authorize {
                authorize.authorize(&signed, with: credentials)
            }
            pendingRequest = consume signed
            let attempt = attempt
            engine.emit(runtime) {
                var event = PolicyEvent(.send, time: now, context: context)
                event.attempt = attempt
                return event
            }
            return .send
        case .judge(let rule, let failure):
            // (Its own event: a departure made now is the one a gate in this transition uses.)
            var judged = event ?? self.event()
            judged.answerLogsOut =
                failure.response.map {
                    engine.endsSession($0, scope: scope, scopeIndex: scopeIndex, runtime, method: method, path: path)
                } ?? false
            return run(judged) { state, event, loop, actions in
                state.refreshFailed(insideLock: event, &loop, rule: rule, failure, into: &actions)
            }
        }
    }

    /// The top of the loop: registers the request on its first turn, then the gate decides
    /// (``EngineState/proceed(insideLock:_:_:into:)``), under one lock.
    @inline(never)
    func top() -> Step {
        let first = !registered
        registered = true
        let (id, host, limit, hold, deadline) = (
            context.number, host, dispatchLimit, scope.refresh.holdNewRequests, deadline
        )
        return run(event()) { state, event, loop, actions in
            if first {
                state.register(id, host: host, dispatchLimit: limit, holdsNewRequests: hold, deadline: deadline)
            }
            return state.proceed(insideLock: event, &loop, into: &actions)
        }
    }

    /// The request was ended from outside its loop: by a logout, or by its caller.
    func ended() -> Step {
        run(event()) { state, event, _, actions in state.ended(insideLock: event, into: &actions) }
    }

    // MARK: - After an attempt

    @inline(never)
    func afterAttempt() -> Step {
        pendingRequest = request  // drops the signed copy
        let decided = self.decided.take()
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
                engine.noteAccepted(loop.signedGeneration)
            }
        case .timedOut, .error:
            lastCode = nil
            if outcome == .timedOut {
                if finishedAtDeadline {
                    failure = TransportError(.timeout, "deadline")
                    emitResponse(rule: nil, reason: "deadline", edge: scope.attemptDeadline)
                    return finish(.failure(.deadlineExceeded))
                }
                failure = timeoutFailure
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
        case .refresh where decided != nil, .logout:
            // Decided with the attempt's end, under its lock.
            // (No new event: the departure made with the attempt's end is the one its gate used.)
            if let decided { return apply(decided.next, nil) }
            return run(event()) { state, event, loop, actions in
                state.noteResponse(event, loop, rule: flow.rule, into: &actions)
                return state.logout(
                    insideLock: event, &loop, flow.logout, reason: .rule(flow.rule.name, response: event.lastResponse),
                    into: &actions)
            }
        case .refresh where arrivedAfterLogout, .retry where arrivedAfterLogout:
            // The session ended while this response came in: no refresh or retry follows.
            emitResponse(rule: flow.rule)
            return run(event()) { state, event, _, actions in state.cancelledByLogout(insideLock: event, into: &actions)
            }
        case .refresh:
            return run(event()) { state, event, loop, actions in
                state.refreshTrigger(insideLock: event, &loop, flow, into: &actions)
            }
        case .retry:
            // An escalation edge it took was followed with the attempt's end, under its lock.
            if let decided { return apply(decided.next, nil) }
            return retryTrigger(flow)
        }
    }

    /// The error of an attempt that timed out before its deadline.
    var timeoutFailure: TransportError {
        TransportError(.timeout, "no response within \(scope.attemptTimeout?.policyText ?? "the attempt timeout")")
    }

    /// A `retry` rule matched: what the attempt's end decided (``EngineState/RetryVerdict``). An
    /// escalation edge the verdict leads along was already followed in that transition (see
    /// ``EngineState/RetryVerdict/escalation(of:exhausted:)``), so what is left here has no edge: a backoff started, retries
    /// over with none to follow, or a request the transition ended.
    func retryTrigger(_ flow: RuleGraph.CompiledRule) -> Step {
        let verdict = retryVerdict
        retryVerdict = nil
        switch verdict {
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
            loop.waitingFor = .backoff
            return .park
        case .notRetried?:
            return finish(.failure(.retriesExhausted(lastResponse: lastResponse, lastError: failure)))
        case .refused?, .pastDeadline?, nil:
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

    // MARK: - After a park

    /// The park ended: the backoff's timer, the refresh's end, a dispatch slot, its deadline, or
    /// the request was ended (``EngineState/afterPark(insideLock:_:_:into:)``), under one lock.
    @inline(never)
    func afterPark() -> Step {
        run(event()) { state, event, loop, actions in state.afterPark(insideLock: event, &loop, into: &actions) }
    }
}
