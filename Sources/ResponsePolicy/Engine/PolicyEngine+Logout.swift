import Foundation

extension PolicyEngine {
    /// Ends the session: starts the cooldown, ends every other request in flight or waiting as
    /// logged out, and calls the logout plugin once.
    ///
    /// Many logout triggers arriving together make one logout: the first starts the cooldown,
    /// the others find it running and only end their own request.
    @inline(never)  // a frame of its own, held only while this is awaited
    func logout(
        settings: LogoutSettings, plugins: PolicyRuntime.ScopePlugins, trigger: RequestContext, reason: String
    ) async {
        let now = clock.now
        let untilDate = clock.date.addingTimeInterval(settings.cooldown.seconds)
        let taken:
            (
                attempts: [AttemptCancellation], sleepers: [CheckedContinuation<Bool, Never>],
                waiters: [EngineState.Waiter]
            )? = state.withLock { state in
                if state.isLoggedOut(at: now) { return nil }
                state.loggedOutUntil = now + settings.cooldown
                state.loggedOutUntilDate = untilDate
                state.sessionEpoch += 1
                var attempts: [AttemptCancellation] = []
                var sleepers: [CheckedContinuation<Bool, Never>] = []
                // In request order, so a simulation's output is the same every run.
                for (number, var entry) in state.requests.sorted(by: { $0.key < $1.key }) where number != trigger.number
                {
                    guard settings.cancelInFlight || entry.phase == .waiting else { continue }
                    if entry.endReason == nil { entry.endReason = .loggedOut }
                    if let attempt = entry.attempt { attempts.append(attempt) }
                    if let waiter = entry.waiter { sleepers.append(waiter) }
                    entry.waiter = nil
                    state.requests[number] = entry
                }
                var waiters: [EngineState.Waiter] = []
                if var flight = state.flight {
                    // The refresh itself runs on; its result is discarded (a new epoch began).
                    for (number, waiter) in flight.waiters.sorted(by: { $0.key < $1.key })
                    where number != trigger.number {
                        if state.requests[number]?.endReason == nil { state.requests[number]?.endReason = .loggedOut }
                        waiters.append(waiter)
                        flight.waiters.removeValue(forKey: number)
                    }
                    state.flight = flight
                }
                return (attempts, sleepers, waiters)
            }
        guard let taken else { return }
        emit(trigger.runtime) {
            var event = PolicyEvent(.logout, time: now, request: trigger.id)
            if reason != Self.refreshFailedReason { event.rule = reason }
            event.reason = reason
            return event
        }
        for waiter in taken.waiters { waiter.resume(returning: .loggedOut) }
        for sleeper in taken.sleepers { sleeper.resume(returning: false) }
        for attempt in taken.attempts { attempt.cancel() }
        let credentials = state.withLock { $0.credentials }
        let context = LogoutContext(
            requestID: trigger.id, reason: reason, credentials: credentials, transport: transport)
        let plugin = plugins.logout
        let id = state.withLock { state -> UInt64 in
            state.nextBackground += 1
            return state.nextBackground
        }
        let task = Task(executorPreference: options.taskExecutor) { [weak self] in
            await plugin.logout(context)
            self?.state.withLock { state in
                if state.background.removeValue(forKey: id) == nil { state.finishedBackground.insert(id) }
            }
        }
        state.withLock { state in
            // The task may have finished before this line; then it left its id behind.
            if state.finishedBackground.remove(id) == nil { state.background[id] = task }
        }
    }

    /// The reason of a logout caused by a failed refresh (a rule name cannot contain a space).
    static let refreshFailedReason = "refresh failed"

    /// Waits until the logout calls the engine started in the background have finished, e.g.
    /// before a command-line tool exits right after its last request.
    public func waitForBackgroundWork() async {
        while true {
            let pending = state.withLock { Array($0.background.values) }
            guard !pending.isEmpty else { return }
            for task in pending { await task.value }
            state.withLock { state in
                for (id, task) in state.background where pending.contains(task) {
                    state.background.removeValue(forKey: id)
                }
            }
        }
    }
}
