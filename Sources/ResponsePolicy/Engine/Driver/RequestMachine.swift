import Foundation

/// One request in flight, driven: it performs what its transitions decide and nothing else.
///
/// Every decision is a transition of ``EngineState``, one per event, run under the engine's lock,
/// one acquisition per event (``run(_:_:)``), with the request's own state (its
/// ``EngineState/RequestLoop``: counters, the last answer, what it waits for) handed to it
/// `inout`: the top of its loop (``EngineState/proceed(_:_:into:)``), its attempt's end
/// (``EngineState/attemptEnded(_:_:_:into:)``: the rule it met and everything that follows, its
/// events and its outcome included), the end of a park (``EngineState/afterPark(_:_:into:)``),
/// and a token endpoint's answer judged (``EngineState/refreshFailed(_:_:rule:_:into:)``). What
/// the machine does itself is what cannot run under a lock: sign the attempt (the authorize
/// plugin), classify an attempt's result and a token endpoint's answer (a code scan), and say
/// `send`. It reads no clock: the driver reads the time once per event (``PolicyEngine/drive(_:)``).
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
    /// Its state between events: counters, the last answer, what it waits for (what its
    /// transitions decide from, see ``EngineState/RequestLoop``), handed to each `inout`.
    var loop = EngineState.RequestLoop()
    var attempt: Int { loop.attempt }
    /// Its timer's registration is the engine's: a request that left the state has no slot.
    var registered = false

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
            connectionsPerHost: engine.transport.inFlightLimit(for: original.url))
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
        self.result = result
        return .finish
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
            departure: departure, lastResponse: loop.lastResponse, failure: loop.failure, code: loop.lastCode)
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
            // Its slot was removed and its outcome event made in the transition that decided it.
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
                state.refreshFailed(event, &loop, rule: rule, failure, into: &actions)
            }
        }
    }

    /// The top of the loop: registers the request on its first turn, then the gate decides
    /// (``EngineState/proceed(_:_:_:into:)``), under one lock.
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
            return state.proceed(event, &loop, into: &actions)
        }
    }

    /// Its attempt ended (``EngineState/attemptEnded(_:_:_:into:)``): the result classified here,
    /// outside the lock, then one transition decides the rest.
    @inline(never)
    func attemptEnded(_ ended: PolicyEngine.EndedAttempt) -> Step {
        pendingRequest = request  // drops the signed copy
        let end = EngineState.AttemptEnd(
            result: ended.result, classified: engine.classify(ended.result, self),
            callerCancelled: ended.callerCancelled, random: engine.options.random)
        return run(event()) { state, event, loop, actions in state.attemptEnded(event, &loop, end, into: &actions) }
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
    /// the request was ended (``EngineState/afterPark(_:_:_:into:)``), under one lock.
    @inline(never)
    func afterPark() -> Step {
        run(event()) { state, event, loop, actions in state.afterPark(event, &loop, into: &actions) }
    }
}
