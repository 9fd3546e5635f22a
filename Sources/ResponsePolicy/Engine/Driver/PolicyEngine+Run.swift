import Foundation

extension PolicyEngine {
    /// The request loop: sign, send, classify, act; until an outcome. Every decision is a
    /// transition of ``EngineState`` that ``RequestMachine`` runs; this driver awaits only an
    /// attempt or a park, and its frame holds nothing but the machine (see ``RequestMachine`` for
    /// why).
    @inline(never)
    func drive(_ machine: RequestMachine) async {
        var step = machine.top()
        while true {
            switch step {
            case .finish:
                return
            case .send:
                let ended = await attempt(machine)
                (machine.now, machine.date) = (clock.now, clock.date)
                step = machine.attemptEnded(ended)
            case .park:
                await park(machine)
                (machine.now, machine.date) = (clock.now, clock.date)
                step = machine.afterPark()
            }
        }
    }

    /// What an attempt came to, as the driver hands it to the transition: the transport's result
    /// and whether the caller's task was cancelled (an inline attempt learns of it that way).
    struct EndedAttempt {
        var result: AttemptResult
        var callerCancelled: Bool
    }

    /// Sends the machine's pending request once and returns what came of it. A
    /// ``CancellableTransport`` is called inline in the caller's task; any other transport runs
    /// in a task of its own, the unit a logout, the attempt timeout or the caller's cancellation
    /// can cancel without ending the request's loop. Either way the attempt is cancelled through
    /// one ``AttemptCancellation`` the machine holds while it is on the wire.
    @inline(never)  // a frame of its own, held only while this is awaited
    func attempt(_ machine: RequestMachine) async -> EndedAttempt {
        guard let cancellation = beginAttempt(machine) else {
            // Cancelled before it left (ended since the gate, or its deadline had come): its
            // transition says which.
            return EndedAttempt(result: .cancelled, callerCancelled: attemptsInline && Task.isCancelled)
        }
        guard attemptsInline else {
            return EndedAttempt(result: await attemptInTask(machine, cancellation), callerCancelled: false)
        }
        // Inline, the engine can only wait for the transport to honour the cancellation, as
        // `CancellableTransport` requires.
        let result: AttemptResult
        do {
            result = .response(try await inlineTransport.send(machine.pendingRequest, cancellation: cancellation))
        } catch {
            result = Self.classify(error, cancelled: cancellation.isCancelled || Task.isCancelled)
        }
        cancellation.attemptEnded()
        return EndedAttempt(result: result, callerCancelled: Task.isCancelled)
    }

    /// A plain transport's attempt, in a task of its own that the caller's cancellation ends.
    @inline(never)  // keeps its frame out of the inline path's
    func attemptInTask(_ machine: RequestMachine, _ cancellation: AttemptCancellation) async -> AttemptResult {
        let id = machine.context.number
        return await withTaskCancellationHandler {
            await callInTask(machine, cancellation)
        } onCancel: {
            end(id, .cancelled)
        }
    }

    /// The attempt the gate began (see ``EngineState/gate(_:_:now:date:)``); `nil` when
    /// it was already cancelled (the request was ended since, or its deadline had come).
    @inline(never)
    func beginAttempt(_ machine: RequestMachine) -> AttemptCancellation? {
        guard let cancellation = machine.pendingAttempt.take(), !cancellation.isCancelled else { return nil }
        if machine.host != nil, options.taskExecutor == nil {
            // Under a dispatch limit, the few requests on the wire decide for all the others (a
            // refresh trigger, a slot to free): when its answer comes, this task must not wait in
            // the pool's queue behind thousands of requests just made (at N = 5,000 that queue
            // delayed the refresh by 130-170 ms). So it runs at high priority from its first
            // attempt on (the caller's task keeps that priority). Not in a simulation, whose
            // scheduler orders tasks itself.
            withUnsafeCurrentTask { $0?.escalatePriority(to: .high) }
        }
        return cancellation
    }

    /// The rule an attempt's result matches in the request's scope (see ``EngineState/Classified``):
    /// a lookup in the compiled flow, made before the lock (the body's code scan stays outside it).
    @inline(never)
    func classify(_ result: AttemptResult, _ machine: RequestMachine) -> EngineState.Classified {
        var classified = EngineState.Classified()
        let (scope, method, path) = (machine.scope, machine.method, machine.path)
        switch result {
        case .response(let response):
            let code = machine.runtime.code(
                of: response, scopeIndex: machine.scopeIndex, scanLimit: options.bodyScanLimit)
            classified.code = code
            classified.rule = scope.classifier.match(
                status: response.status, code: code, headers: response.headers, method: method, path: path)
        case .error(let error):
            classified.rule = scope.classifier.match(error: error.errorClass, method: method, path: path)
        case .cancelled:
            // It may have timed out (the transition knows).
            classified.rule = scope.classifier.match(error: .timeout, method: method, path: path)
        }
        if let rule = classified.rule, scope.compiled[rule].action == .retry {
            // A response over the size limit is definitive: the same request gets the same answer,
            // so a `retry` rule that matches `too-large` (by name or `any`) does not retry it.
            classified.retryable = !result.isTooLarge && machine.isRetryable(scope.compiled[rule].retry)
        }
        return classified
    }

    /// Suspends the request until whatever it waits for (its backoff timer, the refresh in
    /// flight) or `end` wakes it; returns at once when that already happened.
    @inline(never)  // a frame of its own, held only while this is awaited
    func park(_ machine: RequestMachine) async {
        let id = machine.context.number
        await withTaskCancellationHandler {
            await withUnsafeContinuation { (continuation: UnsafeContinuation<Void, Never>) in
                // Under the lock `end` takes: either it finds this continuation, or this sees
                // that the request was ended (the handler runs at once on a cancelled task).
                // A request that waits gives its dispatch slot to the next one, in the same
                // critical section. (Done here, in a synchronous closure, rather than in the
                // driver: a call there grew every waiting request's async frame by 1 KB.)
                var woken: Actions = []
                let now = state.withLock { $0.parking(id, continuation, into: &woken) }
                if now { continuation.resume() }
                perform(woken, for: nil)
            }
            // Whoever woke it held the gate while it resumed it (see `resumeGate`).
            resumeGate.withLock { _ in }
        } onCancel: {
            end(id, .cancelled)
        }
    }

    /// A request's timer fired (see ``EngineState/timerFired(_:token:)``).
    func timerFired(_ id: UInt64, token: UInt64) {
        perform(state.withLock { $0.timerFired(id, token: token) }, for: nil)
    }

    /// Performs what a transition decided, in order, after unlocking. `machine`: the request the
    /// event was about, whose timer `arm` and `disarm` mean and whose refresh `startRefresh`
    /// starts (`nil`: the list has none); `runtime`: whose observers see the events and whose
    /// store saves (the machine's by default).
    @inline(__always)
    func perform(_ actions: Actions, for machine: RequestMachine?, runtime: PolicyRuntime? = nil) {
        for action in actions {
            switch action {
            case .resume(let continuation): resumeGate.withLock { _ in continuation.resume() }
            case .cancel(let attempt): attempt.cancel()
            case .arm(let deadline, let token):
                if let machine { timers.schedule(machine.timer, at: deadline, token: token) }
            case .disarm:
                if let machine { timers.cancel(machine.timer) }
            case .emit, .save, .refresh, .publish:
                performRare(action, for: machine, runtime: runtime)
            }
        }
    }

    /// The actions of a refresh or a logout (kept out of `perform`, which every event inlines).
    @inline(never)
    func performRare(_ action: Action, for machine: RequestMachine?, runtime: PolicyRuntime?) {
        // (Every caller that may emit or save names its runtime; the engine's is a last resort.)
        let runtime = runtime ?? machine?.runtime ?? state.withLock { $0.runtime }
        switch action {
        case .emit(let event): emit(event, runtime)
        case .save: saveCredentials(runtime)
        case .refresh(let work): performRefresh(work)
        case .publish(let notice): publish(notice)
        case .resume, .cancel, .arm, .disarm: break
        }
    }

    /// A plain transport's call in a task of its own. The attempt ends as soon as it is
    /// cancelled, even when the transport ignores the cancellation: its late answer is dropped.
    @inline(never)
    func callInTask(_ machine: RequestMachine, _ cancellation: AttemptCancellation) async -> AttemptResult {
        let request = machine.pendingRequest
        let transport = self.transport
        let executor = options.taskExecutor
        let result = await withCheckedContinuation { (continuation: CheckedContinuation<AttemptResult, Never>) in
            let once = ResumeOnce(continuation)
            let task = Task(executorPreference: executor) { once.resume(await Self.call(transport, request)) }
            cancellation.onCancel {
                task.cancel()
                once.resume(.cancelled)
            }
        }
        cancellation.attemptEnded()
        return result
    }

    static func call(_ transport: any Transport, _ request: HTTPRequest) async -> AttemptResult {
        do {
            return .response(try await transport.send(request))
        } catch {
            return classify(error, cancelled: Task.isCancelled)
        }
    }

    /// A transport's error as an attempt result; anything unexpected counts as `connection`.
    @inline(never)
    static func classify(_ error: any Error, cancelled: Bool) -> AttemptResult {
        if error is CancellationError { return .cancelled }
        if let error = error as? TransportError { return .error(error) }
        if cancelled { return .cancelled }
        return .error(TransportError(.connection, String(describing: type(of: error))))
    }

    /// Adds the idempotency keys the scope's compiled retry rules need (see
    /// ``RuleGraph/Scope/idempotencyKeys``) and returns the headers it generated.
    ///
    /// A request the caller gave a key keeps it. A rule that lists POST or PATCH in its own
    /// `methods` gets one generated value per request, sent on every attempt, so the server can
    /// recognise a repeat; a rule that does not list it does not retry it, whatever the key.
    func prepareIdempotency(_ request: inout HTTPRequest, _ scope: RuleGraph.Scope) -> [String] {
        guard let headers = scope.idempotencyKeys[request.method] else { return [] }
        var generated: [String] = []
        for header in headers where request.headers[header] == nil {
            request.headers.set(header, Self.idempotencyValue(options.random))
            generated.append(header)
        }
        return generated
    }

    static func idempotencyValue(_ random: any RandomSource) -> String {
        let a = random.nextBits()
        let b = random.nextBits()
        let hex = String(a, radix: 16) + String(b, radix: 16)
        return String(repeating: "0", count: max(0, 32 - hex.count)) + hex
    }

    /// Whether a refresh endpoint's answer matches a `logout` rule of the scope.
    /// (Classified as if it answered the request that triggered the refresh: its scope's rules,
    /// its method and path.)
    func endsSession(
        _ response: HTTPResponse, scope: RuleGraph.Scope, scopeIndex: Int, _ runtime: PolicyRuntime, method: String,
        path: String
    ) -> Bool {
        ruleAction(for: response, scope: scope, scopeIndex: scopeIndex, runtime, method: method, path: path) == .logout
    }

    /// The action of the rule `response` matches in `scope`, `nil` when none matches.
    func ruleAction(
        for response: HTTPResponse, scope: RuleGraph.Scope, scopeIndex: Int, _ runtime: PolicyRuntime, method: String,
        path: String
    ) -> ActionKind? {
        let code = runtime.code(of: response, scopeIndex: scopeIndex, scanLimit: options.bodyScanLimit)
        guard
            let index = scope.classifier.match(
                status: response.status, code: code, headers: response.headers, method: method, path: path)
        else { return nil }
        return scope.compiled[index].action
    }
}

extension PolicyEngineError {
    /// A short reason for the outcome event.
    /// The failure's class for ``PolicyMetrics``' labels.
    var category: PolicyEvent.Category? {
        switch self {
        case .retriesExhausted: return .retriesExhausted
        case .failed: return .rule
        case .refreshFailed: return .refreshFailed
        case .deadlineExceeded: return .deadline
        case .transport: return .transport
        case .loggedOut, .cancelled: return nil
        }
    }

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
