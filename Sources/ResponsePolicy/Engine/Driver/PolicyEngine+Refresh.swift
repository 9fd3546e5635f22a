import Foundation

/// The refresh's shell: it performs the work the refresh flight (``RefreshFlight``) names and
/// hands each result back to it as an event, under the engine's lock. It decides nothing: which
/// call is made, how long to wait, what an answer means and what the session takes are the
/// flight's transitions. What it does itself is what cannot run under a lock: call the plugin (in
/// a task of its own, raced against a bound), classify a token endpoint's answer with the policy's
/// rules (a code scan), talk to the coordinator, and keep the flight's timer on the timer heap.
///
/// Concurrency contract: every function here may run on any thread; each result is applied in one
/// transition (`state.withLock`), and the actions it returns are performed after unlocking. The
/// plugin's call is background work (``waitForBackgroundWork()`` waits for it), so a tool that
/// exits right after its last request still keeps the pair a late answer brings.
extension PolicyEngine {
    /// How the session is shared, for a refresh a request under `runtime` starts.
    func refreshCoordination(_ runtime: PolicyRuntime) -> RefreshFlight.Coordination {
        guard !coordinatorIsLocal else { return .local }
        return .shared(
            waits: runtime.policy.coordinationOnUnavailable == .wait,
            unavailable: coordinator is UnavailableSessionCoordinator)
    }

    /// Performs one piece of the flight's work (``RefreshWork``).
    func performRefresh(_ work: RefreshWork) {
        switch work {
        case .call(let call):
            // High priority: in a storm the pool's queue holds thousands of requests starting or
            // waking, and the refresh they all wait for must not queue behind them (its transport
            // has a connection pool of its own for the same reason).
            runInBackground(priority: .high) { [self] in await self.call(call) }
        case .ask(let id, let request, let runtime):
            let coordinator = coordinator
            runInBackground(priority: .high) { [self] in
                await publishUnpublished(runtime)
                let turn = await coordinator.beginRefresh(request)
                flightEvent(runtime) { state, now, date in
                    if case .unavailable(let reason) = turn {
                        state.noteCoordinationProblem(reason)
                    } else {
                        state.coordinationProblem = nil
                    }
                    return state.refresh.turn(id, turn, now: now, date: date)
                }
            }
        case .publishPending(let runtime):
            runInBackground(priority: .high) { [self] in await publishUnpublished(runtime) }
        case .endTurn(let lease, let reason, let retryAfter):
            let coordinator = coordinator
            runInBackground { await coordinator.endRefresh(lease, failure: reason, retryAfter: retryAfter) }
        case .noteAccepted(let generation):
            guard !coordinatorIsLocal else { return }
            let coordinator = coordinator
            runInBackground { await coordinator.noteAccepted(generation: generation) }
        case .arm(let timer):
            armFlightTimer(timer)
        case .disarm(let flight):
            disarmFlightTimer(flight)
        case .problem(let text, let runtime):
            problem(text, runtime)
        }
    }

    /// Applies one event of the flight in one transition and performs what it leads to.
    func flightEvent(
        _ runtime: PolicyRuntime, _ transition: (inout EngineState, Duration, Date) -> RefreshFlight.Step
    ) {
        let (now, date) = (clock.now, clock.date)
        let actions = state.withLock { state in
            state.flightStep(transition(&state, now, date), now: now, date: date)
        }
        perform(actions, for: nil, runtime: runtime)
    }

    // MARK: - The plugin's call

    /// Makes call `call` of the refresh plugin of the scope that started the flight, judges a
    /// failure's answer with that scope's rules (as if it answered the request that started the
    /// refresh: its method and path), and hands the answer to the flight.
    private func call(_ call: RefreshFlight.Call) async {
        let runtime = call.starter.context.runtime
        let plugins = runtime.scopes[call.starter.scopeIndex]
        // Under a lease, the refresh token is presented only within its term (issue 30): a request
        // that could not leave in time (the process was frozen or starved) is not sent.
        let transport: any Transport =
            call.presentBy.map { LeaseBoundTransport(inner: sessionTransport, clock: clock, presentBy: $0) }
            ?? sessionTransport
        let context = RefreshContext(
            credentials: call.credentials, transport: transport, clock: clock, reason: call.reason,
            tokenType: plugins.authorize?.tokenType ?? "bearer",
            report: { [weak self] text in self?.problem(text, runtime) })
        let outcome = await callOnce(plugins.refresh, context, giveUpAt: call.giveUpAt)
        let answer: RefreshFlight.Answer
        switch outcome {
        case .success(let received):
            // Stamped with when it arrived: the lifetime as issued travels with the pair (the
            // credentials file, the fleet's store), so `ahead` works on it after a restart and in
            // every process that adopts it (issue 30, case 7); never more than half of it.
            let credentials = received.stampedIssue(at: clock.date)
            answer = .pair(credentials, lifetime: credentials.expiresAt.map { $0.timeIntervalSince(clock.date) })
        case .failure(let failure):
            var judged = failure
            var logsOut = false
            if let response = failure.response {
                let scope = runtime.policy.graph.scopes[call.starter.scopeIndex]
                let action = ruleAction(
                    for: response, scope: scope, scopeIndex: call.starter.scopeIndex, runtime,
                    method: call.starter.context.method, path: call.starter.context.path)
                judged = TokenAnswer.judged(failure, ruleAction: action)
                // Only a definitive answer reaches on-failure; the answer may match a logout rule.
                logsOut = judged.isDefinitive && action == .logout
            }
            answer = .failed(judged, logsOut: logsOut)
        }
        flightEvent(runtime) { state, now, date in
            state.refresh.answered(
                call.flight, call: call.number, answer, state.sessionFacts(at: now), now: now, date: date)
        }
    }

    /// Calls the plugin once in a task of its own, raced against `giveUpAt` on the engine's
    /// clock: past it the call is cancelled and counts as no answer (the flight's own deadline
    /// came a timeout earlier; an answer in between is still kept).
    private func callOnce(
        _ choice: Result<any RefreshPlugin, PluginError>?, _ context: RefreshContext, giveUpAt: Duration
    ) async -> Result<Credentials, RefreshFailure> {
        let plugin: any RefreshPlugin
        switch choice {
        case nil: return .failure(RefreshFailure("no refresh plugin is configured (refresh.use)"))
        case .failure(let error)?: return .failure(RefreshFailure(error.description))
        case .success(let made)?: plugin = made
        }
        let executor = options.taskExecutor
        let waited = giveUpAt - clock.now
        // The bound's timer leaves the heap when the call ends first, and is forgotten: its
        // closure holds `bound` (to put a grace timer in its place), so a node kept here would
        // hold the call's task and closures in a cycle for the life of the process (about 6 KB
        // per token call, found by heaptrack over 1,500 refreshes of `policy simulate`).
        let bound = Locked<GiveUpBound>(GiveUpBound())
        defer { if let timer = bound.withLock({ $0.end() }) { timers.cancel(timer) } }
        return await withCheckedContinuation {
            (continuation: CheckedContinuation<Result<Credentials, RefreshFailure>, Never>) in
            let once = ResumeOnce(continuation)
            let task = Task(executorPreference: executor, priority: .high) {
                do {
                    once.resume(.success(try await plugin.refresh(context)))
                } catch let failure as RefreshFailure {
                    once.resume(.failure(failure))
                } catch is CancellationError {
                    once.resume(.failure(RefreshFailure("the refresh was cancelled", kind: .transient)))
                } catch {
                    once.resume(
                        .failure(RefreshFailure("the refresh plugin failed (\(type(of: error)))", kind: .transient)))
                }
            }
            let giveUp: @Sendable () -> Void = {
                // The bound's reason first: the cancelled plugin's own "cancelled" must not win.
                once.resume(
                    .failure(
                        RefreshFailure(
                            "the token endpoint did not answer within \(waited.policyText); the call was abandoned",
                            kind: .transient)))
                task.cancel()
            }
            let timer = scheduleGiveUp(at: giveUpAt, bound: bound, giveUp)
            if !bound.withLock({ $0.keep(timer) }) { timers.cancel(timer) }
        }
    }

    /// How late a give-up timer may fire before the engine takes it for a process that was frozen
    /// (SIGSTOP, a VM pause) or starved: then an answer may be waiting to be read.
    static let lateFiring = Duration.seconds(1)

    /// A call's give-up timer. One that fires more than ``lateFiring`` late gives the call a grace
    /// of the same length first: after a freeze every timer fires at once, and the token endpoint's
    /// answer (a pair the server issued, the refresh token already spent) may be waiting in the
    /// socket; it is read and kept rather than abandoned (issue 30, case 5).
    private func scheduleGiveUp(
        at deadline: Duration, bound: Locked<GiveUpBound>, _ giveUp: @escaping @Sendable () -> Void
    ) -> TimerNode {
        timers.schedule(at: deadline) { [weak self, clock] in
            guard let self, clock.now - deadline > Self.lateFiring else { return giveUp() }
            let grace = timers.schedule(at: clock.now + Self.lateFiring, giveUp)
            if !bound.withLock({ $0.keep(grace) }) { timers.cancel(grace) }
        }
    }

    /// The timer that bounds one token call, as long as the call lasts.
    struct GiveUpBound {
        private var timer: TimerNode?
        private var ended = false

        /// Keeps `timer` as the call's bound; false when the call has ended (cancel it).
        mutating func keep(_ timer: TimerNode) -> Bool {
            guard !ended else { return false }
            self.timer = timer
            return true
        }

        /// The call ended: the bound's timer, to cancel. Nothing is kept after this.
        mutating func end() -> TimerNode? {
            ended = true
            return timer.take()
        }
    }

    // MARK: - The flight's timer

    /// Schedules the flight's timer; a firing hands its token to the flight, which ignores a stale
    /// one. One timer per flight on the heap: a newer one replaces it (an older one armed late is
    /// not scheduled), and the flight's end takes it off (``disarmFlightTimer(_:)``).
    func armFlightTimer(_ timer: RefreshFlight.Timer) {
        flightTimers.withLock { registry in
            if let held = registry[timer.flight], held.token > timer.token { return }
            let node = timers.schedule(at: timer.at) { [weak self] in self?.flightTimerFired(timer) }
            if let held = registry.updateValue((timer.token, node), forKey: timer.flight) { timers.cancel(held.node) }
        }
    }

    /// Takes flight `id`'s timer off the heap (it ended).
    func disarmFlightTimer(_ id: UInt64) {
        let node = flightTimers.withLock { $0.removeValue(forKey: id)?.node }
        if let node { timers.cancel(node) }
    }

    private func flightTimerFired(_ timer: RefreshFlight.Timer) {
        flightTimers.withLock { registry in
            if registry[timer.flight]?.token == timer.token { registry.removeValue(forKey: timer.flight) }
        }
        flightEvent(state.withLock { $0.runtime }) { state, now, _ in
            state.refresh.timerFired(timer.flight, token: timer.token, state.sessionFacts(at: now), now: now)
        }
    }

    // MARK: - Publishing the pair

    /// Publishes the pair a refresh of this engine produced (``RefreshFlight/unpublished``), which
    /// the session took and saved first, under its lease's fencing check (it is stored only if
    /// nobody was granted a lease since). Asked again before every refresh turn and when the
    /// coordinator is back, until it is stored or refused.
    func publishUnpublished(_ runtime: PolicyRuntime) async {
        guard let (credentials, lease) = state.withLock({ $0.refresh.unpublished }) else { return }
        switch await coordinator.publish(credentials, with: lease) {
        case .unavailable(let reason):
            let first = state.withLock { state -> Bool in
                guard state.refresh.unpublished?.lease == lease, !state.refresh.unpublishedReported else {
                    return false
                }
                state.refresh.unpublishedReported = true
                return true
            }
            if first {
                problem(
                    "coordination unavailable (\(reason)); the new token is kept in this process and "
                        + "published when the coordinator is back", runtime)
            }
        case .published(let session):
            let held = state.withLock { state -> Bool in
                if state.refresh.unpublished?.lease == lease { state.refresh.unpublished = nil }
                guard state.credentials?.sameTokens(as: credentials) == true else { return false }
                if session.generation > state.sharedGeneration { state.sharedGeneration = session.generation }
                return true
            }
            // The credentials file says so too: the fleet has this pair, at this generation.
            if held { saveCredentials(runtime, again: true) }
        case .leaseLost(let current):
            // The pair the token endpoint returned is the newest it issued to this process: never
            // thrown away. Kept here, and reported.
            state.withLock { state in if state.refresh.unpublished?.lease == lease { state.refresh.unpublished = nil } }
            problem(
                "the refresh lease was taken over before this process's new token was published (generation "
                    + "\(current?.generation ?? 0) is stored); this process keeps the pair it got", runtime)
        }
    }
}

/// The transport of a refresh call made under a lease (``RefreshFlight/Call/presentBy``): a request
/// that could not leave before the lease's term ends is not sent, so a process frozen between its
/// turn and its call never presents a refresh token another holder may be presenting (issue 30).
struct LeaseBoundTransport: Transport {
    let inner: any Transport
    let clock: any PolicyClock
    let presentBy: Duration

    func send(_ request: HTTPRequest) async throws -> HTTPResponse {
        guard clock.now < presentBy else {
            throw TransportError(
                .connection, "the refresh lease's term ended before the token call could go out; it was not sent")
        }
        return try await inner.send(request)
    }

    var sessionCallTransport: any Transport { self }
    var connectionsPerHost: Int? { inner.connectionsPerHost }
}

extension EngineState {
    /// Lists `reason` in ``PolicyEngine/problems`` until the coordinator answers again.
    mutating func noteCoordinationProblem(_ reason: String) {
        coordinationProblem = PluginError(
            kind: .coordination, name: runtime.policy.coordination.name, reason: reason,
            range: runtime.policy.coordination.range)
    }
}
