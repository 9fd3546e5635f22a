extension PolicyEngine {
    /// Waits until a token newer than `failedGeneration` exists, starting the one refresh that
    /// makes it when none is running (single flight).
    ///
    /// A request whose token is already older than the current one retries at once; within
    /// `share-window` after a refresh it retries without refreshing; beyond `limit` the refresh
    /// fails without a call. Cancelling the waiting request removes it from the waiters; the
    /// refresh goes on for the others. (The deciding is synchronous, in ``decideRefresh``: this
    /// async part only waits, so the frame a waiting request keeps stays small.)
    @inline(never)  // a frame of its own, held only while this is awaited
    func awaitFreshToken(
        failedGeneration: UInt64, settings: RefreshSettings, plugins: PolicyRuntime.ScopePlugins,
        _ context: RequestContext, proactive: Bool
    ) async -> EngineState.FlightResult {
        while true {
            if let decided = decideRefresh(
                failedGeneration: failedGeneration, settings: settings, plugins: plugins, context, proactive: proactive)
            {
                return decided
            }
            if let result = await waitForFlight(context.number) { return result }
        }
    }

    /// Decides what a refresh trigger does now: an outcome, or `nil` to wait for the refresh in
    /// flight (which this may just have started).
    @inline(never)  // its temporaries stay out of the waiting request's async frame
    private func decideRefresh(
        failedGeneration: UInt64, settings: RefreshSettings, plugins: PolicyRuntime.ScopePlugins,
        _ context: RequestContext, proactive: Bool
    ) -> EngineState.FlightResult? {
        enum Decision {
            case retryNow, wait, loggedOut
            case start(epoch: UInt64, credentials: Credentials?)
            case fail(RefreshFailure)
        }
        let now = clock.now
        let decision: Decision = state.withLock { state in
            if state.isLoggedOut(at: now) { return .loggedOut }
            if state.generation > failedGeneration { return .retryNow }
            if state.flight != nil { return .wait }
            if !proactive, let last = state.lastRefresh, now - last < settings.shareWindow { return .retryNow }
            if let limit = settings.limit {
                state.refreshCalls.removeAll { now - $0 >= limit.per }
                if state.refreshCalls.count >= limit.count {
                    return .fail(
                        RefreshFailure("more than \(limit.count) refreshes in \(limit.per.policyText) (refresh.limit)"))
                }
            }
            if settings.limit != nil { state.refreshCalls.append(now) }
            state.flight = EngineState.Flight(sessionEpoch: state.sessionEpoch)
            return .start(epoch: state.sessionEpoch, credentials: state.credentials)
        }
        switch decision {
        case .retryNow: return .ok
        case .loggedOut: return .loggedOut
        case .wait: return nil
        case .fail(let failure):
            emit(context.runtime) {
                var start = PolicyEvent(.refreshStart, time: now, request: context.id)
                start.reason = "limit"
                return start
            }
            emit(context.runtime) {
                var end = PolicyEvent(.refreshEnd, time: now, request: context.id)
                end.ok = false
                end.reason = failure.reason
                return end
            }
            return .failed(failure)
        case .start(let epoch, let credentials):
            startRefresh(epoch: epoch, credentials: credentials, settings: settings, plugins: plugins, context)
            return nil
        }
    }

    /// Suspends until the refresh in flight ends; `nil` when it ended before the wait began
    /// (decide again).
    @inline(never)  // a frame of its own, held only while this is awaited
    private func waitForFlight(_ number: UInt64) async -> EngineState.FlightResult? {
        enum Registration { case waiting, ended, cancelled }
        let result: EngineState.FlightResult? = await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<EngineState.FlightResult?, Never>) in
                let registration: Registration = state.withLock { state in
                    guard state.flight != nil else { return .ended }
                    // Checked under the lock the cancellation handler takes: either the handler
                    // finds this waiter, or this sees the cancellation.
                    if Task.isCancelled { return .cancelled }
                    state.flight?.waiters[number] = continuation
                    return .waiting
                }
                switch registration {
                case .waiting: break
                case .ended: continuation.resume(returning: nil)
                case .cancelled: continuation.resume(returning: .cancelled)
                }
            }
        } onCancel: {
            let waiter = state.withLock { $0.flight?.waiters.removeValue(forKey: number) }
            waiter?.resume(returning: .cancelled)
        }
        return result
    }

    /// Starts the refresh task. It outlives the request that started it.
    private func startRefresh(
        epoch: UInt64, credentials: Credentials?, settings: RefreshSettings, plugins: PolicyRuntime.ScopePlugins,
        _ context: RequestContext
    ) {
        emit(PolicyEvent(.refreshStart, time: clock.now, request: context.id), context.runtime)
        let refreshContext = RefreshContext(credentials: credentials, transport: transport, clock: clock)
        Task(executorPreference: options.taskExecutor) {
            let outcome = await self.callRefresh(plugins.refresh, refreshContext, timeout: settings.timeout)
            let now = self.clock.now
            var saved: Credentials?
            var discarded = false
            let waiters = self.state.withLock { state -> [EngineState.Waiter] in
                // In request order, so a simulation's output is the same every run.
                let waiters = (state.flight?.waiters ?? [:]).sorted { $0.key < $1.key }.map(\.value)
                state.flight = nil
                if case .success(let fresh) = outcome {
                    if state.sessionEpoch == epoch {
                        state.credentials = fresh
                        state.generation += 1
                        state.lastRefresh = now
                        saved = fresh
                    } else {
                        discarded = true
                    }
                }
                return waiters
            }
            if let saved { self.save(saved, context.runtime) }
            var end = PolicyEvent(.refreshEnd, time: now, request: context.id)
            switch outcome {
            case .success where discarded:
                end.ok = false
                end.reason = "the session was logged out during the refresh; its token was discarded"
            case .success: end.ok = true
            case .failure(let failure):
                end.ok = false
                end.reason = failure.reason
                end.status = failure.response?.status
            }
            self.emit(end, context.runtime)
            let result: EngineState.FlightResult
            switch outcome {
            case .success: result = .ok
            case .failure(let failure): result = .failed(failure)
            }
            for waiter in waiters { waiter.resume(returning: result) }
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
            timers.schedule(at: clock.now + timeout) {
                task.cancel()
                once.resume(.failure(RefreshFailure("the refresh took longer than \(timeout.policyText)")))
            }
        }
    }
}
