/// One request's decisions: what to do next, given what the last await produced.
///
/// Why a synchronous state machine under a small async driver (`PolicyEngine.run`): an async
/// function's frame lives on the task's heap for as long as it is suspended, and the compiler
/// sizes it for every temporary of every path. Written as one async loop, the request's frame
/// was 30 KB — for each request waiting on a refresh. Here every decision runs synchronously,
/// on the thread's stack; only this struct (a few hundred bytes) is kept across suspensions.
///
/// A class, so the driver's frame holds one reference and the steps mutate it in place.
///
/// Concurrency contract: owned by one request's task; never shared.
final class RequestMachine {
    /// What the driver awaits next.
    /// The driver's next await; its inputs wait in the `pending…` properties, so the driver's
    /// frame holds no copies of requests or settings.
    enum Step {
        case finish, proactiveRefresh, send, refresh, logout, wait
    }

    var result: Result<HTTPResponse, PolicyEngineError> = .failure(.cancelled)
    var pendingGeneration: UInt64 = 0
    var pendingRequest: HTTPRequest?
    var pendingTimeout: Duration?
    var pendingLogout: (settings: LogoutSettings, reason: String)?
    var pendingUntil: Duration = .zero

    let engine: PolicyEngine
    let context: RequestContext
    let scopeIndex: Int
    let scope: RuleGraph.Scope
    let plugins: PolicyRuntime.ScopePlugins
    let method: String
    let path: String
    let retryable: Bool
    let deadline: Duration?
    var request: HTTPRequest

    var attempt = 0
    var retries = 0
    var refreshResends = 0
    var lastResponse: HTTPResponse?
    var lastCode: String?
    var failure: TransportError?
    /// The token generation the last attempt was signed with.
    var signedGeneration: UInt64 = 0
    /// The proactive refresh for this turn of the loop is done.
    var skipProactive = false
    /// The refresh settings of the refresh being awaited, for its failure edges.
    var pendingRefresh: RefreshSettings?

    @inline(never)
    init(engine: PolicyEngine, original: HTTPRequest, context: RequestContext) {
        self.engine = engine
        self.context = context
        let graph = context.runtime.policy.graph
        // Computed once: `URL.path` builds a new string on every call.
        let method = original.method
        let path = original.path
        scopeIndex =
            graph.scopes.firstIndex { scope in scope.route.map { $0.matches(method: method, path: path) } ?? true }
            ?? graph.scopes.count - 1
        scope = graph.scopes[scopeIndex]
        plugins = context.runtime.scopes[scopeIndex]
        self.method = method
        self.path = path
        var request = original
        retryable = engine.prepareIdempotency(&request, scope.retry)
        self.request = request
        deadline = scope.retry.deadline.map { context.start + $0 }
    }

    var runtime: PolicyRuntime { context.runtime }

    // MARK: - Outcomes

    @inline(never)  // keeps this step's temporaries out of the driver's async frame
    func finish(_ result: Result<HTTPResponse, PolicyEngineError>) -> Step {
        engine.emit(runtime) { outcomeEvent(result) }
        self.result = result
        return .finish
    }

    func outcomeEvent(_ result: Result<HTTPResponse, PolicyEngineError>) -> PolicyEvent {
        var event = PolicyEvent(.outcome, time: engine.clock.now, request: context.id)
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
        return event
    }

    @inline(never)  // keeps this step's temporaries out of the driver's async frame
    func loggedOut() -> Step { finish(.failure(.loggedOut(until: engine.cooldownEnd()))) }

    /// Ended by another request's logout while on the wire or waiting: a `cancel` event, then
    /// the logged-out outcome (the trigger itself and requests refused in the cooldown have no
    /// `cancel`: nothing of theirs was interrupted).
    @inline(never)  // keeps this step's temporaries out of the driver's async frame
    func cancelledByLogout() -> Step {
        engine.emit(runtime) {
            var event = PolicyEvent(.cancel, time: engine.clock.now, request: context.id)
            event.reason = "logout"
            return event
        }
        return loggedOut()
    }

    /// The request was ended from outside its loop: by a logout, or by its caller.
    @inline(never)  // keeps this step's temporaries out of the driver's async frame
    func ended() -> Step {
        let reason = engine.state.withLock { $0.requests[context.number]?.endReason }
        if reason == .loggedOut { return cancelledByLogout() }
        engine.emit(runtime) {
            var event = PolicyEvent(.cancel, time: engine.clock.now, request: context.id)
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

    func emitResponse(rule: Rule?, reason: String? = nil) {
        engine.emit(runtime) {
            var event = PolicyEvent(.response, time: engine.clock.now, request: context.id)
            event.attempt = attempt
            event.status = lastResponse?.status
            event.code = lastCode
            event.error = failure?.errorClass
            event.rule = rule?.name
            event.action = rule?.action
            event.reason = reason
            return event
        }
    }

    // MARK: - The top of the loop

    /// Checks the request may go on, refreshes ahead of expiry, then signs and sends.
    @inline(never)  // keeps this step's temporaries out of the driver's async frame
    func top() -> Step {
        let now = engine.clock.now
        let (endedOutside, isLoggedOut) = engine.state.withLock { state in
            (state.requests[context.number]?.endReason != nil, state.isLoggedOut(at: now))
        }
        if Task.isCancelled || endedOutside { return ended() }
        if isLoggedOut { return cancelledByLogout() }
        if !skipProactive, let ahead = scope.refresh.ahead, plugins.refresh != nil,
            let generation = engine.expiringGeneration(within: ahead)
        {
            pendingGeneration = generation
            return .proactiveRefresh
        }
        skipProactive = false
        let (credentials, generation) = engine.state.withLock { ($0.credentials, $0.generation) }
        var signed = request
        if let credentials, let authorize = plugins.authorize { authorize.authorize(&signed, with: credentials) }
        signedGeneration = generation
        attempt += 1
        let attempt = attempt
        engine.emit(runtime) {
            var event = PolicyEvent(.send, time: engine.clock.now, request: context.id)
            event.attempt = attempt
            return event
        }
        var timeout = scope.retry.attemptTimeout
        if let deadline { timeout = min(timeout ?? .seconds(1 << 40), max(.zero, deadline - engine.clock.now)) }
        pendingRequest = signed
        pendingTimeout = timeout
        return .send
    }

    @inline(never)  // keeps this step's temporaries out of the driver's async frame
    func afterProactiveRefresh(_ result: EngineState.FlightResult) -> Step {
        switch result {
        case .loggedOut: return cancelledByLogout()
        case .cancelled: return ended()
        default:
            // A failed proactive refresh leaves the old token to try.
            skipProactive = true
            return top()
        }
    }

    // MARK: - After an attempt

    @inline(never)  // keeps this step's temporaries out of the driver's async frame
    func afterAttempt(_ result: PolicyEngine.AttemptResult) -> Step {
        pendingRequest = nil
        let ruleIndex: Int?
        switch result {
        case .cancelled:
            return ended()
        case .response(let response):
            lastResponse = response
            failure = nil
            lastCode = runtime.code(of: response, scopeIndex: scopeIndex, scanLimit: engine.options.bodyScanLimit)
            ruleIndex = scope.classifier.match(
                status: response.status, code: lastCode, headers: response.headers, method: method, path: path)
        case .timedOut, .error:
            let error: TransportError
            if case .error(let transportError) = result {
                error = transportError
            } else {
                lastResponse = nil
                lastCode = nil
                if let deadline, engine.clock.now >= deadline {
                    failure = TransportError(.timeout, "deadline")
                    emitResponse(rule: nil, reason: "deadline")
                    return finish(.failure(.deadlineExceeded))
                }
                error = TransportError(
                    .timeout, "no response within \(scope.retry.attemptTimeout?.policyText ?? "the attempt timeout")")
            }
            failure = error
            lastResponse = nil
            lastCode = nil
            ruleIndex = scope.classifier.match(error: error.errorClass, method: method, path: path)
        }
        guard let ruleIndex else {
            emitResponse(rule: nil)
            if let failure { return finish(.failure(.transport(failure))) }
            if let lastResponse { return finish(.success(lastResponse)) }
            return finish(.failure(.cancelled))
        }
        let rule = scope.rules[ruleIndex]
        emitResponse(rule: rule)
        switch rule.action {
        case .deliver:
            return deliverOrFail()
        case .fail:
            guard let lastResponse else { return finish(.failure(.transport(failure ?? TransportError(.connection)))) }
            return finish(.failure(.failed(response: lastResponse, rule: rule.name)))
        case .logout:
            return logout(scope.logout(for: rule), reason: rule.name)
        case .refresh:
            return refreshTrigger(rule)
        case .retry:
            return retryTrigger(rule)
        }
    }

    func refreshTrigger(_ rule: Rule) -> Step {
        let settings = scope.refresh(for: rule)
        guard refreshResends < settings.maxPerRequest else {
            switch settings.onExhausted {
            case .logout: return logout(scope.logout, reason: rule.name)
            case .deliver: return deliverOrFail()
            default:
                return finish(
                    .failure(
                        .refreshFailed(reason: "the request was re-sent \(refreshResends) time(s) for refresh triggers")
                    ))
            }
        }
        refreshResends += 1
        pendingRefresh = settings
        pendingGeneration = signedGeneration
        return .refresh
    }

    @inline(never)  // keeps this step's temporaries out of the driver's async frame
    func afterRefresh(_ result: EngineState.FlightResult) -> Step {
        let settings = pendingRefresh ?? scope.refresh
        pendingRefresh = nil
        switch result {
        case .ok: return top()
        case .loggedOut: return cancelledByLogout()
        case .cancelled: return ended()
        case .failed(let refreshFailure):
            if let response = refreshFailure.response,
                engine.endsSession(response, scope: scope, scopeIndex: scopeIndex, runtime, method: method, path: path)
            {
                return logout(scope.logout, reason: PolicyEngine.refreshFailedReason)
            }
            switch settings.onFailure {
            case .logout: return logout(scope.logout, reason: PolicyEngine.refreshFailedReason)
            case .deliver: return deliverOrFail()
            default: return finish(.failure(.refreshFailed(reason: refreshFailure.reason)))
            }
        }
    }

    func retryTrigger(_ rule: Rule) -> Step {
        let settings = scope.retry(for: rule)
        let now = engine.clock.now
        var allowed = retryable && retries < settings.maxRetries
        if allowed, let budget = settings.budget {
            allowed = engine.state.withLock { $0.budget.takeRetry(at: now, budget: budget) }
        }
        guard allowed else {
            switch settings.onExhausted {
            case .fail: return finish(.failure(.retriesExhausted(lastResponse: lastResponse, lastError: failure)))
            case .logout: return logout(scope.logout, reason: rule.name)
            default:
                if lastResponse == nil {
                    return finish(.failure(.retriesExhausted(lastResponse: nil, lastError: failure)))
                }
                return deliverOrFail()
            }
        }
        let delay = RetryTiming.delay(
            forRetry: retries + 1, settings: settings, response: lastResponse, now: engine.clock.date,
            random: engine.options.random)
        if let deadline, now + delay > deadline {
            // A wait that would end past the deadline is not started.
            return finish(.failure(.deadlineExceeded))
        }
        retries += 1
        let attempt = attempt
        engine.emit(runtime) {
            var event = PolicyEvent(.wait, time: now, request: context.id)
            event.delay = delay
            event.attempt = attempt
            return event
        }
        pendingUntil = now + delay
        return .wait
    }

    @inline(never)  // keeps this step's temporaries out of the driver's async frame
    func logout(_ settings: LogoutSettings, reason: String) -> Step {
        pendingLogout = (settings, reason)
        return .logout
    }

    func afterWait(_ elapsed: Bool) -> Step {
        elapsed ? top() : ended()
    }
}
