import Foundation

extension PolicyEngine {
    /// What one attempt produced.
    enum AttemptResult: Sendable {
        case response(HTTPResponse)
        case error(TransportError)
        case timedOut
        case cancelled
    }

    /// The request loop: sign, send, classify, act; until an outcome. Every decision is made by
    /// ``RequestMachine`` synchronously; this driver only awaits what it asks for, so the frame
    /// kept while a request waits stays small.
    func run(_ original: HTTPRequest, _ context: RequestContext) async -> Result<HTTPResponse, PolicyEngineError> {
        let machine = RequestMachine(engine: self, original: original, context: context)
        var step = machine.top()
        while true {
            switch step {
            case .finish:
                return machine.result
            case .proactiveRefresh:
                step = machine.afterProactiveRefresh(
                    await awaitFreshToken(
                        failedGeneration: machine.pendingGeneration, settings: machine.scope.refresh,
                        plugins: machine.plugins, context, proactive: true))
            case .send:
                guard let request = machine.pendingRequest else { return machine.result }
                step = machine.afterAttempt(
                    await attemptOnce(request, timeout: machine.pendingTimeout, number: context.number))
            case .refresh:
                step = machine.afterRefresh(
                    await awaitFreshToken(
                        failedGeneration: machine.pendingGeneration,
                        settings: machine.pendingRefresh ?? machine.scope.refresh,
                        plugins: machine.plugins, context, proactive: false))
            case .logout:
                if let (settings, reason) = machine.pendingLogout {
                    await logout(settings: settings, plugins: machine.plugins, trigger: context, reason: reason)
                }
                step = machine.loggedOut()
            case .wait:
                step = machine.afterWait(await wait(context.number, until: machine.pendingUntil))
            }
        }
    }

    /// Sends once. A ``CancellableTransport`` is called inline in the caller's task; any other
    /// transport runs in a task of its own, the unit a logout, the attempt timeout or the caller's
    /// cancellation can cancel without ending the request's loop. Either way the attempt is
    /// cancelled through one ``AttemptCancellation`` registered in the request's entry.
    @inline(never)  // a frame of its own, held only while this is awaited
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
            // Inline, the engine can only wait for the transport to honour the cancellation, as
            // `CancellableTransport` requires.
            result = await Self.call(inline, request, cancellation)
        } else {
            result = await callInTask(request, cancellation)
        }
        if let timer { timers.cancel(timer) }
        let (timedOut, endedOutside) = state.withLock { state -> (Bool, Bool) in
            state.requests[number]?.attempt = nil
            return (state.requests[number]?.timedOut ?? false, state.requests[number]?.endReason != nil)
        }
        // Ended from outside (logout, the caller) wins over a timeout at the same instant.
        if endedOutside { return .cancelled }
        if case .cancelled = result, timedOut { return .timedOut }
        return result
    }

    /// A plain transport's call in a task of its own. The attempt ends as soon as it is
    /// cancelled, even when the transport ignores the cancellation: its late answer is dropped.
    @inline(never)
    func callInTask(_ request: HTTPRequest, _ cancellation: AttemptCancellation) async -> AttemptResult {
        let transport = self.transport
        let executor = options.taskExecutor
        return await withCheckedContinuation { (continuation: CheckedContinuation<AttemptResult, Never>) in
            let once = ResumeOnce(continuation)
            let task = Task(executorPreference: executor) { once.resume(await Self.call(transport, request)) }
            cancellation.onCancel {
                task.cancel()
                once.resume(.cancelled)
            }
        }
    }

    /// The attempt timeout fired: cancel that attempt, if it is still the one on the wire.
    func timeOut(_ number: UInt64, attempt: Int) {
        let cancellation = state.withLock { state -> AttemptCancellation? in
            guard var entry = state.requests[number], entry.attemptNumber == attempt, entry.endReason == nil,
                let current = entry.attempt
            else {
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
    @inline(never)  // a frame of its own, held only while this is awaited
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
            guard let expiry = state.credentials?.expiresAt, expiry.timeIntervalSince(now) < ahead.seconds else {
                return nil
            }
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
