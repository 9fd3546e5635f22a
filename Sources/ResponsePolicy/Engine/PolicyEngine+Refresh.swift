import Synchronization

extension PolicyEngine {
    /// Notes that a server accepted a request signed with `generation` (see
    /// ``EngineState/acceptedGeneration``). The lock is taken once per generation, not per response.
    func noteAccepted(_ generation: UInt64) {
        guard acceptedHint.load(ordering: .relaxed) < generation else { return }
        state.withLock { $0.accepted(generation) }
        _ = acceptedHint.max(generation, ordering: .relaxed)
    }

    /// Starts the refresh a transition of `machine`'s began (``Action/startRefresh(_:)``), with
    /// the policy's rules as the judge of the token endpoint's answer (classified as if it
    /// answered `machine`'s request: its scope's rules, its method and path).
    func startRefresh(_ start: RefreshStart, for machine: RequestMachine) {
        let (scope, scopeIndex, method, path, context) = (
            machine.scope, machine.scopeIndex, machine.method, machine.path, machine.context
        )
        let judge: @Sendable (HTTPResponse) -> ActionKind? = { [self] response in
            ruleAction(for: response, scope: scope, scopeIndex: scopeIndex, context.runtime, method: method, path: path)
        }
        startRefresh(
            start.flight, credentials: start.credentials, settings: start.settings, plugins: machine.plugins, context,
            reason: start.reason, judge: judge)
    }

    /// Starts the refresh task. It outlives the request that started it, and it is background
    /// work: ``waitForBackgroundWork()`` waits for it (bounded by `refresh.timeout`), so a tool
    /// that exits right after its last request (a logout ended them all during the refresh)
    /// still saves the pair the token endpoint returned — with rotation the old refresh token
    /// is already spent.
    private func startRefresh(
        _ flight: EngineState.Flight, credentials: Credentials?, settings: RefreshSettings,
        plugins: PolicyRuntime.ScopePlugins, _ context: RequestContext, reason: String,
        judge: @escaping @Sendable (HTTPResponse) -> ActionKind?
    ) {
        emit(PolicyEvent(.refreshStart, time: clock.now, context: context), context.runtime)
        let refreshContext = RefreshContext(
            credentials: credentials, transport: sessionTransport, clock: clock, reason: reason)
        let calls = RefreshCalls(
            settings: settings, countsTowardLimit: flight.countsTowardLimit, judge: judge, context: context,
            stillWanted: { [self] in state.withLock { $0.flight?.id == flight.id } })
        // High priority: in a storm the pool's queue holds thousands of requests starting or
        // waking, and the refresh they all wait for must not queue behind them (its transport
        // has a connection pool of its own for the same reason).
        runInBackground(priority: .high) {
            let (outcome, shared, trouble, adopted) = await self.coordinatedRefresh(
                plugins.refresh, refreshContext, calls, failedGeneration: flight.sharedGeneration, context.runtime)
            let now = self.clock.now
            let date = self.clock.date
            // The lifetime as issued, for `ahead` (never more than half of it).
            let lifetime = (try? outcome.get())?.expiresAt.map { $0.timeIntervalSince(date) }
            // Only a definitive failure reaches on-failure; the answer may match a logout rule.
            var logsOut = false
            if case .failure(let failure) = outcome, failure.isDefinitive, let response = failure.response {
                logsOut = judge(response) == .logout
            }
            // One transition: the session takes the result, a failure's logout starts, and only
            // then are the waiters woken (see `EngineState.refreshEnded(insideLock:…)`).
            let (_, _, actions) = self.state.withLock { state in
                state.refreshEnded(
                    insideLock: flight, outcome: outcome, shared: shared, lifetime: lifetime, answerLogsOut: logsOut,
                    coordinationTrouble: trouble, adopted: adopted, context: context, now: now, date: date)
            }
            self.perform(actions, for: nil, runtime: context.runtime)
        }
    }

    /// Takes the refresh turn from the coordinator, calls the plugin when the turn is this
    /// process's, and publishes what it returned. Returns the credentials to use, their shared
    /// generation when the coordinator shares them, whether a failure is coordination trouble
    /// (which fails requests but never logs anyone out), and whether the credentials are the
    /// fleet's, newer than those that failed, taken without a token call (`.newer`).
    ///
    /// The built-in local coordinator is answered inline: it grants every turn and shares
    /// nothing, so one process pays nothing for the seam.
    ///
    /// While the coordinator is unavailable, `on-unavailable` decides: `wait` (the default) asks
    /// again with backoff until `refresh.timeout` has passed, then fails the refresh as
    /// coordination trouble; `local` refreshes in this process alone, which presents the same
    /// refresh token as every other process doing so (fatal with single-use refresh tokens).
    private func coordinatedRefresh(
        _ choice: Result<any RefreshPlugin, PluginError>?, _ context: RefreshContext, _ calls: RefreshCalls,
        failedGeneration: UInt64, _ runtime: PolicyRuntime
    ) async -> (Result<Credentials, RefreshFailure>, shared: UInt64?, trouble: Bool, adopted: Bool) {
        let settings = calls.settings
        guard !coordinatorIsLocal else { return (await callRefresh(choice, context, calls), nil, false, false) }
        await publishUnpublished(runtime)
        var failedGeneration = failedGeneration
        let started = clock.now
        let waits = runtime.policy.coordinationOnUnavailable == .wait
        var turn = RefreshTurn.unavailable("not asked")
        var asked = 0
        var reported = false
        while true {
            let remaining = settings.timeout - (clock.now - started)
            turn = await coordinator.beginRefresh(
                RefreshTurnRequest(
                    failedGeneration: failedGeneration, timeout: max(remaining, .milliseconds(1)),
                    limit: calls.countsTowardLimit ? settings.limit.map { ($0.count, $0.per) } : nil))
            asked += 1
            // A "newer" session holding the very credentials that failed only numbers them (a
            // store that seeded the coordinator learns its generation this way): ask again.
            if case .newer(let session) = turn, session.credentials?.sameTokens(as: context.credentials) == true,
                session.generation > failedGeneration, asked < 4
            {
                failedGeneration = session.generation
                continue
            }
            if case .unavailable(let reason) = turn {
                noteCoordinationProblem(reason)
            } else {
                state.withLock { $0.coordinationProblem = nil }
            }
            guard case .unavailable(let reason) = turn, waits, !(coordinator is UnavailableSessionCoordinator) else {
                break
            }
            let left = settings.timeout - (clock.now - started)
            guard left > .zero else {
                return (
                    .failure(
                        RefreshFailure(
                            "coordination unavailable for refresh.timeout (\(settings.timeout.policyText)): \(reason); "
                                + "the request fails and the session stays (on-unavailable: wait)", kind: .transient)), nil, true, false
                )
            }
            if !reported {
                reported = true
                problem(
                    "coordination unavailable (\(reason)); the refresh waits up to \(settings.timeout.policyText) "
                        + "for it (on-unavailable: wait)", runtime)
            }
            let pause = min(left, .milliseconds(min(1000, 50 << min(asked - 1, 5))))
            try? await clock.sleep(until: clock.now + pause)
            if Task.isCancelled { break }
        }
        switch turn {
        case .newer(let session), .published(let session):
            guard let credentials = session.credentials, !credentials.sameTokens(as: context.credentials) else {
                return (
                    .failure(RefreshFailure("the shared session holds no newer credentials", kind: .transient)), nil,
                    true, false
                )
            }
            // `.newer`: the fleet held these before this refresh asked (no token call for it).
            if case .newer = turn { return (.success(credentials), session.generation, false, true) }
            return (.success(credentials), session.generation, false, false)
        case .failedElsewhere(let reason):
            // The holder's own failure (a definitive one logs it out, and that logout is
            // published); here it only fails the requests that waited for it.
            return (
                .failure(RefreshFailure("the refresh failed in another process: \(reason)", kind: .transient)), nil,
                true, false
            )
        case .limited:
            // The fleet-wide count is of lease grants, healthy rotations included: reaching it
            // fails the requests (a refresh loop across processes is stopped) but logs nobody out.
            return (
                .failure(RefreshFailure("refresh.limit is used up across the processes sharing the session", kind: .transient)),
                nil,
                true, false
            )
        case .unavailable(let reason):
            if waits {
                return (.failure(RefreshFailure("coordination unavailable: \(reason)", kind: .transient)), nil, true, false)
            }
            problem(
                "coordination unavailable (\(reason)); refreshing in this process alone (on-unavailable: local)",
                runtime)
            return (await callRefresh(choice, context, calls), nil, false, false)
        case .lease(let lease):
            let outcome = await callRefresh(choice, context, calls)
            switch outcome {
            case .failure(let failure):
                await coordinator.endRefresh(lease, failure: failure.reason)
                return (outcome, nil, false, false)
            case .success(let credentials):
                switch await coordinator.publish(credentials, with: lease) {
                case .published(let session):
                    return (.success(session.credentials ?? credentials), session.generation, false, false)
                case .leaseLost(let current):
                    // The pair the token endpoint returned is the newest it issued to this process:
                    // never thrown away (issue 19, invariant f). Kept here, and reported.
                    problem(
                        "the refresh lease was taken over before its token was published (generation "
                            + "\(current?.generation ?? 0) is stored); this process keeps the pair it got", runtime)
                    return (.success(credentials), nil, false, false)
                case .unavailable(let reason):
                    problem(
                        "coordination unavailable (\(reason)); the new token is kept in this process and "
                            + "published when the coordinator is back", runtime)
                    state.withLock { $0.unpublished = (credentials, lease) }
                    return (outcome, nil, false, false)
                }
            }
        }
    }

    /// Lists `reason` in ``problems`` until the coordinator answers again.
    func noteCoordinationProblem(_ reason: String) {
        state.withLock { state in
            state.coordinationProblem = PluginError(
                kind: .coordination, name: state.runtime.policy.coordination.name, reason: reason,
                range: state.runtime.policy.coordination.range)
        }
    }

    /// Publishes the pair a refresh produced while the coordinator was unavailable, under its
    /// lease's fencing check (it is stored only if nobody was granted a lease since).
    func publishUnpublished(_ runtime: PolicyRuntime) async {
        guard let (credentials, lease) = state.withLock({ $0.unpublished }) else { return }
        switch await coordinator.publish(credentials, with: lease) {
        case .unavailable: return
        case .published(let session):
            state.withLock { state in
                if state.unpublished?.lease == lease { state.unpublished = nil }
                if session.generation > state.sharedGeneration, state.credentials?.sameTokens(as: credentials) == true {
                    state.sharedGeneration = session.generation
                }
            }
        case .leaseLost(let current):
            state.withLock { state in if state.unpublished?.lease == lease { state.unpublished = nil } }
            problem(
                "the token kept during the coordination outage could not be published: another process refreshed "
                    + "since (generation \(current?.generation ?? 0))", runtime)
            if let current { adopt(current) }
        }
    }

    /// Calls the plugin until it succeeds, fails definitively, or transient trouble outlasts
    /// `refresh.timeout`: between calls it waits on the engine's clock (`refresh.transient`'s
    /// backoff, or the answer's `Retry-After`), while the requests waiting for the refresh stay
    /// parked. A wait that would end past the timeout is not started: the refresh fails at once
    /// with the last trouble's reason, as transient (the session goes on).
    private func callRefresh(
        _ choice: Result<any RefreshPlugin, PluginError>?, _ context: RefreshContext, _ calls: RefreshCalls
    ) async -> Result<Credentials, RefreshFailure> {
        let settings = calls.settings
        let deadline = clock.now + settings.timeout
        var call = 0
        /// The last call's own trouble: when the next call is cut short by the timeout, its
        /// reason says more than "took longer than".
        var previous: RefreshFailure?
        while true {
            call += 1
            let outcome = await callRefreshOnce(choice, context, timeout: deadline - clock.now, total: settings.timeout)
            guard case .failure(let raw) = outcome else { return outcome }
            var failure = calls.judged(raw)
            guard !failure.isDefinitive, !failure.endsRefresh, let transient = settings.transient else {
                return .failure(failure)
            }
            if clock.now >= deadline, let previous { failure = previous }
            previous = failure
            let requested =
                failure.retryAfter
                ?? failure.response?.headers["Retry-After"].flatMap { RetryTiming.retryAfter($0, now: clock.date) }
            let delay = transient.delay(afterCall: call, requested: requested)
            let now = clock.now
            guard now + delay < deadline, calls.stillWanted() else {
                var outlasted = failure
                if call > 1 || now < deadline {
                    outlasted.reason =
                        "\(failure.reason); transient trouble outlasted refresh.timeout"
                        + " (\(settings.timeout.policyText), \(call) call\(call == 1 ? "" : "s"))"
                }
                return .failure(outlasted)
            }
            emit(calls.context.runtime) {
                var event = PolicyEvent(.refreshRetry, time: now, context: calls.context)
                event.attempt = call
                event.delay = delay
                event.status = failure.response?.status
                event.reason = failure.reason
                return event
            }
            do {
                try await clock.sleep(until: now + delay)
            } catch {
                return .failure(RefreshFailure("the refresh was cancelled", kind: .transient))
            }
        }
    }

    /// Calls the plugin once, raced against `timeout` (what is left of `total`, `refresh.timeout`).
    private func callRefreshOnce(
        _ choice: Result<any RefreshPlugin, PluginError>?, _ context: RefreshContext, timeout: Duration,
        total: Duration
    ) async -> Result<Credentials, RefreshFailure> {
        let plugin: any RefreshPlugin
        switch choice {
        case nil: return .failure(RefreshFailure("no refresh plugin is configured (refresh.use)"))
        case .failure(let error)?: return .failure(RefreshFailure(error.description))
        case .success(let made)?: plugin = made
        }
        // The plugin runs in a task of its own, raced against an engine timer: at the timeout the
        // refresh has failed, whether or not the plugin honours its cancellation (a late answer is
        // dropped).
        let executor = options.taskExecutor
        // The timeout's timer leaves the heap when the refresh ends first, rather than holding
        // the plugin's task until its deadline.
        let timeoutTimer = Locked<TimerNode?>(nil)
        defer { if let timer = timeoutTimer.withLock({ $0 }) { timers.cancel(timer) } }
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
                    once.resume(.failure(RefreshFailure("the refresh plugin failed (\(type(of: error)))", kind: .transient)))
                }
            }
            let timer = timers.schedule(at: clock.now + timeout) {
                // The timeout's reason first: the cancelled plugin's own "cancelled" must not win the race.
                once.resume(
                    .failure(RefreshFailure("the refresh took longer than \(total.policyText)", kind: .transient)))
                task.cancel()
            }
            timeoutTimer.withLock { $0 = timer }
        }
    }
}

/// What one refresh's calls share: its settings, how the policy's rules judge the token
/// endpoint's answers, the request that started it (for events), and whether the refresh is still
/// the one in flight (a logout or an adoption may have answered it: no more calls then).
struct RefreshCalls: Sendable {
    let settings: RefreshSettings
    /// Whether `refresh.limit` counts this refresh (fleet-wide too): see `Flight.countsTowardLimit`.
    let countsTowardLimit: Bool
    let judge: @Sendable (HTTPResponse) -> ActionKind?
    let context: RequestContext
    let stillWanted: @Sendable () -> Bool

    /// `failure` with the policy's rules on top of the plugin's own kind: an answer a `refresh`,
    /// `fail` or `logout` rule matches is definitive (a code or status the policy names); the rules
    /// never make a definitive answer transient.
    func judged(_ failure: RefreshFailure) -> RefreshFailure {
        guard !failure.isDefinitive, let response = failure.response, let action = judge(response) else { return failure }
        switch action {
        case .refresh, .fail, .logout:
            var definitive = failure
            definitive.kind = .definitive
            return definitive
        case .retry, .deliver:
            return failure
        }
    }
}
