import Foundation

extension PolicyEngine {
    /// Ends the session: starts the cooldown, ends every other request in flight or waiting as
    /// logged out, and calls the logout plugin once.
    ///
    /// Many logout triggers arriving together make one logout: the first starts the cooldown,
    /// the others find it running and only end their own request.
    func logout(
        settings: LogoutSettings, plugins: PolicyRuntime.ScopePlugins, trigger: RequestMachine, reason: String
    ) {
        let now = clock.now
        let untilDate = clock.date.addingTimeInterval(settings.cooldown.seconds)
        let taken:
            (
                attempts: [AttemptCancellation], parked: [UnsafeContinuation<Void, Never>], credentials: Credentials?
            )? = state.withLock { state in
                if state.isLoggedOut(at: now) { return nil }
                state.loggedOutUntil = now + settings.cooldown
                state.loggedOutUntilDate = untilDate
                state.sessionEpoch += 1
                var attempts: [AttemptCancellation] = []
                var parked: [UnsafeContinuation<Void, Never>] = []
                // The refresh in flight runs on; its result is discarded (a new epoch began).
                // Its waiters end first, then the other requests, each in request order, so a
                // simulation's output is the same every run.
                if let flight = state.flight {
                    for machine in flight.live.sorted(by: { $0.context.number < $1.context.number })
                    where machine !== trigger {
                        if machine.endReason == nil { machine.endReason = .loggedOut }
                        machine.awaitedFlight = nil
                        if let continuation = machine.parked.take() { parked.append(continuation) }
                    }
                    flight.waiters.removeAll { $0 !== trigger }
                }
                for machine in state.requests where machine !== trigger {
                    // Waiting requests (a backoff, a dispatch queue) end whatever `cancel-in-flight` says.
                    guard settings.cancelInFlight || machine.phase == .backoff || machine.phase == .queued else {
                        continue
                    }
                    if machine.endReason == nil { machine.endReason = .loggedOut }
                    if let attempt = machine.attemptCancellation { attempts.append(attempt) }
                    // A backoff's timer is taken off the heap by the request itself, when its
                    // park ends; disarmed here, a firing in between does nothing.
                    machine.armedTimer = 0
                    if let continuation = machine.parked.take() { parked.append(continuation) }
                }
                // The ending session's credentials, read with the cooldown's start: a sign-in
                // right after must not make the plugin end the new session instead.
                return (attempts, parked, state.credentials)
            }
        guard let taken else { return }
        emit(trigger.runtime) {
            var event = PolicyEvent(.logout, time: now, request: trigger.context.id)
            if reason != Self.refreshFailedReason { event.rule = reason }
            event.reason = reason
            return event
        }
        for continuation in taken.parked { continuation.resume() }
        for attempt in taken.attempts { attempt.cancel() }
        let context = LogoutContext(
            requestID: trigger.context.id, reason: reason, credentials: taken.credentials, transport: transport,
            clock: clock)
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
