extension PolicyEngine {
    /// Decides what a refresh trigger does now: an outcome, or `nil` when the request must park
    /// until the refresh in flight ends (which this may just have started). The request is then
    /// already registered as a waiter, in the same critical section that saw the refresh
    /// running, so no ending can slip between the decision and the wait.
    ///
    /// A request whose token is already older than the current one retries at once; within
    /// `share-window` after a refresh it retries without refreshing; beyond `limit` the refresh
    /// fails without a call. Cancelling the waiting request ends its park; the refresh goes on
    /// for the others.
    @inline(never)
    func decideRefresh(
        _ machine: RequestMachine, failedGeneration: UInt64, settings: RefreshSettings, proactive: Bool,
        route: EngineState.RefreshRoute?
    ) -> EngineState.FlightResult? {
        enum Decision {
            case retryNow, wait, loggedOut, cancelled
            case start(EngineState.Flight, credentials: Credentials?)
            case fail(RefreshFailure)
        }
        let now = clock.now
        let context = machine.context
        let decision: Decision = state.withLock { state in
            let id = context.number
            if state.slots[id]?.endReason != nil { return .cancelled }
            switch state.decideRefresh(
                failedGeneration: failedGeneration, settings: settings, proactive: proactive, now: now)
            {
            case .loggedOut: return .loggedOut
            case .retryNow: return .retryNow
            case .limited(let failure): return .fail(failure)
            case .join:
                state.join(insideLock: id, route: route)
                return .wait
            case .start(let flight, let credentials):
                state.join(insideLock: id, route: route)
                return .start(flight, credentials: credentials)
            }
        }
        switch decision {
        case .retryNow: return .ok
        case .loggedOut: return .loggedOut
        case .cancelled: return .cancelled
        case .wait: return nil
        case .fail(let failure):
            emit(context.runtime) {
                var start = PolicyEvent(.refreshStart, time: now, context: context)
                start.reason = "limit"
                return start
            }
            emit(context.runtime) {
                var end = PolicyEvent(.refreshEnd, time: now, context: context)
                end.ok = false
                end.reason = failure.reason
                return end
            }
            return .failed(failure)
        case .start(let flight, let credentials):
            let scope = machine.scope
            let (scopeIndex, method, path) = (machine.scopeIndex, machine.method, machine.path)
            let options = self.options
            // Whether the token endpoint's answer matches a logout rule: classified as the answer
            // to the request that started the refresh, outside the lock (it scans the body).
            let answerLogsOut: @Sendable (HTTPResponse) -> Bool = { response in
                guard scope.compiled.contains(where: { $0.refreshAnswer != nil }) else { return false }
                let code = context.runtime.code(of: response, scopeIndex: scopeIndex, scanLimit: options.bodyScanLimit)
                guard
                    let index = scope.classifier.match(
                        status: response.status, code: code, headers: response.headers, method: method, path: path)
                else { return false }
                return scope.rules[index].action == .logout
            }
            startRefresh(
                flight, credentials: credentials, settings: settings, plugins: machine.plugins, context,
                reason: machine.refreshReason, answerLogsOut: answerLogsOut)
            return nil
        }
    }

    /// Starts the refresh task. It outlives the request that started it, and it is background
    /// work: ``waitForBackgroundWork()`` waits for it (bounded by `refresh.timeout`), so a tool
    /// that exits right after its last request (a logout ended them all during the refresh)
    /// still saves the pair the token endpoint returned — with rotation the old refresh token
    /// is already spent.
    private func startRefresh(
        _ flight: EngineState.Flight, credentials: Credentials?, settings: RefreshSettings,
        plugins: PolicyRuntime.ScopePlugins, _ context: RequestContext, reason: String,
        answerLogsOut: @escaping @Sendable (HTTPResponse) -> Bool
    ) {
        emit(PolicyEvent(.refreshStart, time: clock.now, context: context), context.runtime)
        let refreshContext = RefreshContext(
            credentials: credentials, transport: sessionTransport, clock: clock, reason: reason)
        runInBackground {
            let (outcome, shared) = await self.coordinatedRefresh(
                plugins.refresh, refreshContext, settings: settings, failedGeneration: flight.sharedGeneration,
                context.runtime)
            let now = self.clock.now
            let date = self.clock.date
            var logsOut = false
            if case .failure(let failure) = outcome, let response = failure.response {
                logsOut = answerLogsOut(response)
            }
            let (ended, waiters, logout) = self.state.withLock { state in
                let ended = state.refreshEnded(flight, outcome: outcome, shared: shared, now: now)
                // A failure that logs out does so here, before any waiter is woken.
                var logout: Effects?
                if let waiting = ended.waiting, case .failed(let failure) = ended.result {
                    logout =
                        state.logOutForFailedRefresh(
                            insideLock: waiting, failure, answerLogsOut: logsOut, now: now, date: date)?.effects
                }
                return (ended, ended.waiting.map { state.endWaits(insideLock: $0, ended.result) } ?? [], logout)
            }
            let (refreshed, discarded, keptAfterLogout) = (ended.saved, ended.discarded, ended.keptAfterLogout)
            if refreshed { self.saveCredentials(context.runtime) }
            var end = PolicyEvent(.refreshEnd, time: now, context: context)
            switch outcome {
            case .success where discarded:
                end.ok = false
                end.reason = "the session was signed in again during the refresh; its token was discarded"
            case .success where keptAfterLogout:
                end.ok = false
                end.reason =
                    "the session was logged out during the refresh; its new tokens were saved, and the session stays logged out"
            case .success: end.ok = true
            case .failure(let failure):
                end.ok = false
                end.reason = failure.reason
                end.status = failure.response?.status
            }
            self.emit(end, context.runtime)
            for waiter in waiters { waiter.resume() }
            if let logout {
                for continuation in logout.resume { continuation.resume() }
                for attempt in logout.cancel { attempt.cancel() }
            }
        }
    }

    /// Takes the refresh turn from the coordinator, calls the plugin when the turn is this
    /// process's, and publishes what it returned. Returns the credentials to use and, when the
    /// coordinator shares them, their shared generation.
    ///
    /// The built-in local coordinator is answered inline: it grants every turn and shares
    /// nothing, so one process pays nothing for the seam.
    private func coordinatedRefresh(
        _ choice: Result<any RefreshPlugin, PluginError>?, _ context: RefreshContext, settings: RefreshSettings,
        failedGeneration: UInt64, _ runtime: PolicyRuntime
    ) async -> (Result<Credentials, RefreshFailure>, shared: UInt64?) {
        guard !coordinatorIsLocal else { return (await callRefresh(choice, context, timeout: settings.timeout), nil) }
        var failedGeneration = failedGeneration
        var turn = RefreshTurn.unavailable("not asked")
        // A "newer" session holding the very credentials that failed only numbers them (a store
        // that seeded the coordinator learns its generation this way): ask again from there.
        for _ in 0..<3 {
            turn = await coordinator.beginRefresh(
                RefreshTurnRequest(
                    failedGeneration: failedGeneration, timeout: settings.timeout,
                    limit: settings.limit.map { ($0.count, $0.per) }))
            guard case .newer(let session) = turn, session.credentials == context.credentials,
                session.generation > failedGeneration
            else { break }
            failedGeneration = session.generation
        }
        switch turn {
        case .newer(let session), .published(let session):
            guard let credentials = session.credentials, credentials != context.credentials else {
                return (.failure(RefreshFailure("the shared session holds no newer credentials")), nil)
            }
            return (.success(credentials), session.generation)
        case .failedElsewhere(let reason):
            return (.failure(RefreshFailure("the refresh failed in another process: \(reason)")), nil)
        case .limited:
            return (.failure(RefreshFailure("refresh.limit is used up across the processes sharing the session")), nil)
        case .unavailable(let reason):
            problem("coordination unavailable (\(reason)); refreshing in this process alone", runtime)
            return (await callRefresh(choice, context, timeout: settings.timeout), nil)
        case .lease(let lease):
            let outcome = await callRefresh(choice, context, timeout: settings.timeout)
            switch outcome {
            case .failure(let failure):
                await coordinator.endRefresh(lease, failure: failure.reason)
                return (outcome, nil)
            case .success(let credentials):
                switch await coordinator.publish(credentials, with: lease) {
                case .published(let session):
                    return (.success(session.credentials ?? credentials), session.generation)
                case .leaseLost(let current):
                    if let current, let shared = current.credentials { return (.success(shared), current.generation) }
                    return (.failure(RefreshFailure("the refresh lease expired before its token was published")), nil)
                case .unavailable(let reason):
                    problem("coordination unavailable (\(reason)); the new token is kept in this process", runtime)
                    return (outcome, nil)
                }
            }
        }
    }

    /// Calls the plugin with the refresh timeout.
    private func callRefresh(
        _ choice: Result<any RefreshPlugin, PluginError>?, _ context: RefreshContext, timeout: Duration
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
            let task = Task(executorPreference: executor) {
                do {
                    once.resume(.success(try await plugin.refresh(context)))
                } catch let failure as RefreshFailure {
                    once.resume(.failure(failure))
                } catch is CancellationError {
                    once.resume(.failure(RefreshFailure("the refresh was cancelled")))
                } catch {
                    once.resume(.failure(RefreshFailure("the refresh plugin failed (\(type(of: error)))")))
                }
            }
            let timer = timers.schedule(at: clock.now + timeout) {
                // The timeout's reason first: the cancelled plugin's own "cancelled" must not win the race.
                once.resume(.failure(RefreshFailure("the refresh took longer than \(timeout.policyText)")))
                task.cancel()
            }
            timeoutTimer.withLock { $0 = timer }
        }
    }
}
