import Foundation

extension PolicyEngine {
    /// What one attempt produced.
    enum AttemptResult: Sendable {
        case response(HTTPResponse)
        case error(TransportError)
        case timedOut
        case cancelled
    }

    /// The request loop: sign, send, classify, act; until an outcome.
    func run(_ original: HTTPRequest, _ context: RequestContext) async -> Result<HTTPResponse, PolicyEngineError> {
        let runtime = context.runtime
        let graph = runtime.policy.graph
        // Computed once: `URL.path` builds a new string on every call.
        let method = original.method
        let path = original.path
        let scopeIndex = graph.scopes.firstIndex { scope in
            scope.route.map { $0.matches(method: method, path: path) } ?? true
        } ?? graph.scopes.count - 1
        let scope = graph.scopes[scopeIndex]
        let plugins = runtime.scopes[scopeIndex]
        var request = original
        let retryable = prepareIdempotency(&request, scope.retry)
        let deadline = scope.retry.deadline.map { context.start + $0 }

        var attempt = 0
        var retries = 0
        var refreshResends = 0
        var lastResponse: HTTPResponse?
        var lastCode: String?

        func finish(_ result: Result<HTTPResponse, PolicyEngineError>) -> Result<HTTPResponse, PolicyEngineError> {
            emit(runtime) { outcomeEvent(result) }
            return result
        }

        func outcomeEvent(_ result: Result<HTTPResponse, PolicyEngineError>) -> PolicyEvent {
            var event = PolicyEvent(.outcome, time: clock.now, request: context.id)
            switch result {
            case .success(let response):
                event.result = .delivered
                event.status = response.status
                event.code = lastCode
            case .failure(let error):
                switch error {
                case .loggedOut: event.result = .loggedOut
                case .cancelled: event.result = .cancelled
                default: event.result = .failed
                }
                if let lastResponse, error != .cancelled {
                    event.status = lastResponse.status
                    event.code = lastCode
                }
                if case .loggedOut = error {} else if case .cancelled = error {} else { event.reason = error.reasonText }
            }
            return event
        }

        func emitResponse(
            status: Int?, code: String?, error: TransportErrorClass?, rule: Rule?, reason: String? = nil
        ) {
            emit(runtime) {
                var event = PolicyEvent(.response, time: clock.now, request: context.id)
                event.attempt = attempt
                event.status = status
                event.code = code
                event.error = error
                event.rule = rule?.name
                event.action = rule?.action
                event.reason = reason
                return event
            }
        }

        func ended() -> Result<HTTPResponse, PolicyEngineError> {
            let reason = state.withLock { $0.requests[context.number]?.endReason }
            if reason == .loggedOut { return finish(.failure(.loggedOut(until: cooldownEnd()))) }
            emit(runtime) {
                var event = PolicyEvent(.cancel, time: clock.now, request: context.id)
                event.reason = "the caller cancelled the request"
                return event
            }
            return finish(.failure(.cancelled))
        }

        while true {
            let now = clock.now
            let (endedOutside, loggedOut) = state.withLock { state in
                (state.requests[context.number]?.endReason != nil, state.isLoggedOut(at: now))
            }
            if Task.isCancelled || endedOutside { return ended() }
            if loggedOut { return finish(.failure(.loggedOut(until: cooldownEnd()))) }

            // Refresh ahead of expiry, before sending (single flight as usual).
            if let ahead = scope.refresh.ahead, plugins.refresh != nil, let generation = expiringGeneration(within: ahead) {
                switch await awaitFreshToken(
                    failedGeneration: generation, settings: scope.refresh, plugins: plugins, context, proactive: true)
                {
                case .ok, .failed: break  // a failed proactive refresh leaves the old token to try
                case .loggedOut: return finish(.failure(.loggedOut(until: cooldownEnd())))
                case .cancelled: return ended()
                }
            }

            let (credentials, generation) = state.withLock { ($0.credentials, $0.generation) }
            var signed = request
            if let credentials, let authorize = plugins.authorize { authorize.authorize(&signed, with: credentials) }
            attempt += 1
            emit(runtime) {
                var event = PolicyEvent(.send, time: clock.now, request: context.id)
                event.attempt = attempt
                return event
            }

            var timeout = scope.retry.attemptTimeout
            if let deadline { timeout = min(timeout ?? .seconds(1 << 40), max(.zero, deadline - clock.now)) }
            let result = await attemptOnce(signed, timeout: timeout, number: context.number)

            let ruleIndex: Int?
            var failure: TransportError?
            switch result {
            case .cancelled:
                return ended()
            case .response(let response):
                lastResponse = response
                lastCode = runtime.code(of: response, scopeIndex: scopeIndex, scanLimit: options.bodyScanLimit)
                ruleIndex = scope.classifier.match(
                    status: response.status, code: lastCode, headers: response.headers, method: method, path: path)
            case .timedOut, .error:
                let error: TransportError
                if case .error(let transportError) = result {
                    error = transportError
                } else {
                    if let deadline, clock.now >= deadline {
                        emitResponse(status: nil, code: nil, error: .timeout, rule: nil, reason: "deadline")
                        return finish(.failure(.deadlineExceeded))
                    }
                    error = TransportError(.timeout, "no response within \(timeout?.policyText ?? "the attempt timeout")")
                }
                failure = error
                lastResponse = nil
                lastCode = nil
                ruleIndex = scope.classifier.match(error: error.errorClass, method: method, path: path)
            }

            guard let ruleIndex else {
                emitResponse(status: lastResponse?.status, code: lastCode, error: failure?.errorClass, rule: nil)
                if let failure { return finish(.failure(.transport(failure))) }
                if let lastResponse { return finish(.success(lastResponse)) }
                return finish(.failure(.cancelled))
            }
            let rule = scope.rules[ruleIndex]
            emitResponse(status: lastResponse?.status, code: lastCode, error: failure?.errorClass, rule: rule)

            /// Delivers the response, or fails with the transport error when there is none.
            func deliverOrFail() -> Result<HTTPResponse, PolicyEngineError> {
                if let lastResponse { return finish(.success(lastResponse)) }
                return finish(.failure(.transport(failure ?? TransportError(.connection))))
            }

            switch rule.action {
            case .deliver:
                return deliverOrFail()
            case .fail:
                guard let lastResponse else { return finish(.failure(.transport(failure ?? TransportError(.connection)))) }
                return finish(.failure(.failed(response: lastResponse, rule: rule.name)))
            case .logout:
                await logout(settings: scope.logout(for: rule), plugins: plugins, trigger: context, reason: rule.name)
                return finish(.failure(.loggedOut(until: cooldownEnd())))
            case .refresh:
                let settings = scope.refresh(for: rule)
                guard refreshResends < settings.maxPerRequest else {
                    switch settings.onExhausted {
                    case .logout:
                        await logout(settings: scope.logout, plugins: plugins, trigger: context, reason: rule.name)
                        return finish(.failure(.loggedOut(until: cooldownEnd())))
                    case .deliver: return deliverOrFail()
                    default:
                        return finish(
                            .failure(.refreshFailed(reason: "the request was re-sent \(refreshResends) time(s) for refresh triggers")))
                    }
                }
                refreshResends += 1
                switch await awaitFreshToken(
                    failedGeneration: generation, settings: settings, plugins: plugins, context, proactive: false)
                {
                case .ok: continue
                case .loggedOut: return finish(.failure(.loggedOut(until: cooldownEnd())))
                case .cancelled: return ended()
                case .failed(let refreshFailure):
                    if let response = refreshFailure.response,
                        endsSession(response, scope: scope, scopeIndex: scopeIndex, runtime, method: method, path: path)
                    {
                        await logout(settings: scope.logout, plugins: plugins, trigger: context, reason: Self.refreshFailedReason)
                        return finish(.failure(.loggedOut(until: cooldownEnd())))
                    }
                    switch settings.onFailure {
                    case .logout:
                        await logout(settings: scope.logout, plugins: plugins, trigger: context, reason: Self.refreshFailedReason)
                        return finish(.failure(.loggedOut(until: cooldownEnd())))
                    case .deliver: return deliverOrFail()
                    default: return finish(.failure(.refreshFailed(reason: refreshFailure.reason)))
                    }
                }
            case .retry:
                let settings = scope.retry(for: rule)
                let now = clock.now
                var allowed = retryable && retries < settings.maxRetries
                if allowed, let budget = settings.budget {
                    allowed = state.withLock { $0.budget.takeRetry(at: now, budget: budget) }
                }
                guard allowed else {
                    switch settings.onExhausted {
                    case .fail: return finish(.failure(.retriesExhausted(lastResponse: lastResponse, lastError: failure)))
                    case .logout:
                        await logout(settings: scope.logout, plugins: plugins, trigger: context, reason: rule.name)
                        return finish(.failure(.loggedOut(until: cooldownEnd())))
                    default:
                        if lastResponse == nil {
                            return finish(.failure(.retriesExhausted(lastResponse: nil, lastError: failure)))
                        }
                        return deliverOrFail()
                    }
                }
                let delay = RetryTiming.delay(
                    forRetry: retries + 1, settings: settings, response: lastResponse, now: clock.date, random: options.random)
                if let deadline, now + delay > deadline {
                    // A wait that would end past the deadline is not started.
                    return finish(.failure(.deadlineExceeded))
                }
                retries += 1
                emit(runtime) {
                    var event = PolicyEvent(.wait, time: now, request: context.id)
                    event.delay = delay
                    event.attempt = attempt
                    return event
                }
                guard await wait(context.number, until: now + delay) else { return ended() }
            }
        }
    }

    /// Sends once. A ``CancellableTransport`` is called inline in the caller's task; any other
    /// transport runs in a task of its own, the unit a logout, the attempt timeout or the caller's
    /// cancellation can cancel without ending the request's loop. Either way the attempt is
    /// cancelled through one ``AttemptCancellation`` registered in the request's entry.
    func attemptOnce(_ request: HTTPRequest, timeout: Duration?, number: UInt64) async -> AttemptResult {
        let cancellation = AttemptCancellation()
        let attemptNumber: Int? = state.withLock { state in
            guard var entry = state.requests[number], entry.endReason == nil else { return nil }
            entry.attempt = cancellation
            entry.attemptNumber += 1
            entry.timedOut = false
            entry.phase = .onWire
            state.requests[number] = entry
            return entry.attemptNumber
        }
        guard let attemptNumber else { return .cancelled }
        var timer: UInt64?
        if let timeout {
            timer = timers.schedule(at: clock.now + timeout) { [weak self] in
                self?.timeOut(number, attempt: attemptNumber)
            }
        }
        let result: AttemptResult
        if let inline = inlineTransport {
            result = await Self.call(inline, request, cancellation)
        } else {
            let transport = self.transport
            let task = Task(executorPreference: options.taskExecutor) { await Self.call(transport, request) }
            cancellation.onCancel { task.cancel() }
            result = await task.value
        }
        if let timer { timers.cancel(timer) }
        let timedOut = state.withLock { state -> Bool in
            state.requests[number]?.attempt = nil
            return state.requests[number]?.timedOut ?? false
        }
        if case .cancelled = result, timedOut { return .timedOut }
        return result
    }

    /// The attempt timeout fired: cancel that attempt, if it is still the one on the wire.
    func timeOut(_ number: UInt64, attempt: Int) {
        let cancellation = state.withLock { state -> AttemptCancellation? in
            guard var entry = state.requests[number], entry.attemptNumber == attempt, let current = entry.attempt else {
                return nil
            }
            entry.timedOut = true
            state.requests[number] = entry
            return current
        }
        cancellation?.cancel()
    }

    /// Waits until `deadline` on the engine's timers; `false` when the request was ended
    /// (logout, caller cancellation) first.
    func wait(_ number: UInt64, until deadline: Duration) async -> Bool {
        await withCheckedContinuation { (continuation: CheckedContinuation<Bool, Never>) in
            let waiting = state.withLock { state -> Bool in
                guard var entry = state.requests[number], entry.endReason == nil else { return false }
                entry.waiter = continuation
                entry.phase = .waiting
                state.requests[number] = entry
                return true
            }
            guard waiting else {
                continuation.resume(returning: false)
                return
            }
            timers.schedule(at: deadline) { [weak self] in self?.wake(number) }
        }
    }

    func wake(_ number: UInt64) {
        let waiter = state.withLock { state -> CheckedContinuation<Bool, Never>? in
            let waiter = state.requests[number]?.waiter
            state.requests[number]?.waiter = nil
            state.requests[number]?.phase = .onWire
            return waiter
        }
        waiter?.resume(returning: true)
    }

    static func call(_ transport: any Transport, _ request: HTTPRequest) async -> AttemptResult {
        do {
            return .response(try await transport.send(request))
        } catch {
            return classify(error, cancelled: Task.isCancelled)
        }
    }

    static func call(
        _ transport: any CancellableTransport, _ request: HTTPRequest, _ cancellation: AttemptCancellation
    ) async -> AttemptResult {
        do {
            return .response(try await transport.send(request, cancellation: cancellation))
        } catch {
            return classify(error, cancelled: cancellation.isCancelled || Task.isCancelled)
        }
    }

    /// A transport's error as an attempt result; anything unexpected counts as `connection`.
    static func classify(_ error: any Error, cancelled: Bool) -> AttemptResult {
        if error is CancellationError { return .cancelled }
        if let error = error as? TransportError { return .error(error) }
        if cancelled { return .cancelled }
        return .error(TransportError(.connection, String(describing: type(of: error))))
    }

    /// Adds the idempotency key where needed; returns whether the request may be retried.
    ///
    /// A request the caller gave an idempotency key is retryable whatever its method, and keeps
    /// that key. A listed method that is not idempotent by nature (POST, PATCH) gets one
    /// generated value, sent on every attempt, so the server can recognise a repeat.
    func prepareIdempotency(_ request: inout HTTPRequest, _ retry: RetrySettings) -> Bool {
        if let header = retry.idempotencyKey, request.headers[header] != nil { return true }
        guard retry.methods.contains(request.method) else { return false }
        if let header = retry.idempotencyKey, request.method == "POST" || request.method == "PATCH" {
            request.headers.set(header, Self.idempotencyValue(options.random))
        }
        return true
    }

    static func idempotencyValue(_ random: any RandomSource) -> String {
        let a = random.nextBits()
        let b = random.nextBits()
        let hex = String(a, radix: 16) + String(b, radix: 16)
        return String(repeating: "0", count: max(0, 32 - hex.count)) + hex
    }

    /// The generation of the current token when it expires within `ahead`.
    func expiringGeneration(within ahead: Duration) -> UInt64? {
        let now = clock.date
        return state.withLock { state in
            guard let expiry = state.credentials?.expiresAt, expiry.timeIntervalSince(now) < ahead.seconds else { return nil }
            return state.generation
        }
    }

    func cooldownEnd() -> Date {
        state.withLock { $0.loggedOutUntilDate } ?? clock.date
    }

    /// Whether a refresh endpoint's answer matches a `logout` rule of the scope.
    /// (Classified as if it answered the request that triggered the refresh: its scope's rules,
    /// its method and path.)
    func endsSession(
        _ response: HTTPResponse, scope: RuleGraph.Scope, scopeIndex: Int, _ runtime: PolicyRuntime, method: String,
        path: String
    ) -> Bool {
        let code = runtime.code(of: response, scopeIndex: scopeIndex, scanLimit: options.bodyScanLimit)
        guard
            let index = scope.classifier.match(
                status: response.status, code: code, headers: response.headers, method: method, path: path)
        else { return false }
        return scope.rules[index].action == .logout
    }
}

extension PolicyEngineError {
    /// A short reason for the outcome event.
    var reasonText: String {
        switch self {
        case .retriesExhausted: return "retries exhausted"
        case .failed(_, let rule): return "rule '\(rule)'"
        case .refreshFailed(let reason): return "refresh failed: \(reason)"
        case .deadlineExceeded: return "deadline"
        case .transport(let error): return "\(error.errorClass.rawValue) error"
        case .loggedOut: return "logged out"
        case .cancelled: return "cancelled"
        }
    }
}
