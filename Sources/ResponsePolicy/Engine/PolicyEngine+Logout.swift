import Foundation

extension PolicyEngine {
    /// Ends the session: starts the cooldown, ends every other request in flight or waiting as
    /// logged out, and calls the logout plugin once.
    ///
    /// Many logout triggers arriving together make one logout: the first starts the cooldown,
    /// the others find it running and only end their own request.
    func logout(
        settings: LogoutSettings, plugins: PolicyRuntime.ScopePlugins, trigger: RequestContext, reason: String
    ) async {
        let now = clock.now
        let untilDate = clock.date.addingTimeInterval(settings.cooldown.seconds)
        let taken: (attempts: [AttemptCancellation], sleepers: [CheckedContinuation<Bool, Never>], waiters: [EngineState.Waiter])? = state.withLock { state in
            if state.isLoggedOut(at: now) { return nil }
            state.loggedOutUntil = now + settings.cooldown
            state.loggedOutUntilDate = untilDate
            state.sessionEpoch += 1
            var attempts: [AttemptCancellation] = []
            var sleepers: [CheckedContinuation<Bool, Never>] = []
            // In request order, so a simulation's output is the same every run.
            for (number, var entry) in state.requests.sorted(by: { $0.key < $1.key }) where number != trigger.number {
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
                for (number, waiter) in flight.waiters.sorted(by: { $0.key < $1.key }) where number != trigger.number {
                    if state.requests[number]?.endReason == nil { state.requests[number]?.endReason = .loggedOut }
                    waiters.append(waiter)
                    flight.waiters.removeValue(forKey: number)
                }
                state.flight = flight
            }
            return (attempts, sleepers, waiters)
        }
        guard let taken else { return }
        var event = PolicyEvent(.logout, time: now, request: trigger.id)
        event.rule = reason
        event.reason = reason
        emit(event, trigger.runtime)
        for waiter in taken.waiters { waiter.resume(returning: .loggedOut) }
        for sleeper in taken.sleepers { sleeper.resume(returning: false) }
        for attempt in taken.attempts { attempt.cancel() }
        let context = LogoutContext(requestID: trigger.id, reason: reason, transport: transport)
        let plugin = plugins.logout
        Task(executorPreference: options.taskExecutor) { await plugin.logout(context) }
    }
}
