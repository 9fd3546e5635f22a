import Foundation

extension PolicyEngine {
    /// Ends the session because a request's response (or its refresh) said so: starts the
    /// cooldown, ends every other request in flight or waiting as logged out, calls the logout
    /// plugin once and tells the coordinator.
    ///
    /// Many logout triggers arriving together make one logout: the first starts the cooldown,
    /// the others find it running and only end their own request.
    ///
    /// `started`: the state part of this logout (the cooldown, the other requests ended) was
    /// already done by the transition that ended a failed refresh
    /// (``EngineState/logOutForFailedRefresh(insideLock:_:answerLogsOut:now:date:)``); only its
    /// effects remain (the event, the plugin, the coordinator).
    func logout(
        settings: LogoutSettings, plugins: PolicyRuntime.ScopePlugins, trigger: RequestMachine, reason: LogoutReason,
        started: Bool = false
    ) {
        endSession(
            cooldown: settings.cooldown, cancelInFlight: settings.cancelInFlight, reason: reason, trigger: trigger,
            plugin: plugins.logout, runtime: trigger.runtime, publish: true, started: started)
    }

    /// Signs the user out because the host says so: the same as a `logout` rule matching (the
    /// cooldown of the policy's `logout:` section, `cancel-in-flight`, the logout plugin called
    /// once, the coordinator told), with ``LogoutReason/host(_:)`` as the reason every request
    /// it ends carries. Does nothing when the session is already in its cooldown.
    ///
    /// ```swift
    /// engine.logout(reason: "the user signed out")
    /// await engine.waitForBackgroundWork()   // the logout plugin's call, before the app exits
    /// ```
    public func logout(reason: String) {
        let runtime = state.withLock { $0.runtime }
        let index = runtime.policy.graph.scopes.count - 1
        let settings = runtime.policy.graph.scopes[index].logout
        endSession(
            cooldown: settings.cooldown, cancelInFlight: settings.cancelInFlight, reason: .host(reason), trigger: nil,
            plugin: runtime.scopes[index].logout, runtime: runtime, publish: true)
    }

    /// Another process logged the session out (a ``SessionUpdate/loggedOut(until:reason:)``):
    /// the same cooldown here, without calling the logout plugin or publishing again. A logout
    /// whose end is not later than the cooldown already kept is old news and ignored.
    func logoutFromElsewhere(until: Date, reason: String) {
        let runtime = state.withLock { $0.runtime }
        let settings = runtime.policy.logout
        // A cooldown read from a shared store is never longer than this policy's own: a forged or
        // corrupted logout costs at most what a real one costs (issue 23).
        let bounds = CoordinationBounds(maxCooldown: runtime.maxCooldown, maxLease: .zero)
        let until = bounds.cooldown(until: until, now: clock.date)
        let remaining = until.timeIntervalSince(clock.date)
        guard remaining > 0 else { return }
        endSession(
            cooldown: .seconds(remaining), cancelInFlight: settings.cancelInFlight, reason: .elsewhere(reason),
            trigger: nil, plugin: nil, runtime: runtime, publish: false, until: until)
    }

    /// The one place a session ends. (See ``logout(settings:plugins:trigger:reason:)``.)
    private func endSession(
        cooldown: Duration, cancelInFlight: Bool, reason: LogoutReason, trigger: RequestMachine?,
        plugin: (any LogoutPlugin)?, runtime: PolicyRuntime, publish: Bool, until: Date? = nil, started: Bool = false
    ) {
        let now = clock.now
        var untilDate = until ?? clock.date.addingTimeInterval(cooldown.seconds)
        let taken = state.withLock { state -> (actions: Actions, credentials: Credentials?)? in
            if started {
                // The cooldown the refresh's end started: publish that one.
                if let started = state.loggedOutUntilDate { untilDate = started }
                return ([], state.credentials)
            }
            // A later end from elsewhere extends the cooldown; anything else is the same logout.
            guard
                state.startCooldown(
                    until: now + cooldown, untilDate: untilDate, reason: reason, extendOnly: until != nil, now: now)
            else { return nil }
            // The ending session's credentials, read with the cooldown's start: a sign-in right
            // after must not make the plugin end the new session instead.
            return (
                state.endRequests(insideLock: trigger?.context.number, cancelInFlight: cancelInFlight),
                state.credentials
            )
        }
        guard let taken else { return }
        emit(runtime) {
            var event = PolicyEvent(.logout, time: now, context: trigger?.context)
            event.rule = reason.ruleName
            event.reason = reason.eventText
            return event
        }
        perform(taken.actions, for: nil)
        let coordinator = coordinatorIsLocal || !publish ? nil : coordinator
        guard plugin != nil || coordinator != nil else { return }
        let context = LogoutContext(
            requestID: trigger?.context.id, reason: reason.eventText, credentials: taken.credentials,
            transport: sessionTransport, clock: clock)
        let text = reason.eventText
        let publishedUntil = untilDate
        runInBackground {
            // Published first: the other processes stop sending while the plugin ends the session.
            await coordinator?.publishLogout(until: publishedUntil, reason: text)
            await plugin?.logout(context)
        }
    }

    /// Runs `work` in a task of its own that ``waitForBackgroundWork()`` waits for.
    /// `priority`: `nil` (the caller's) by default; the refresh runs at `.high`.
    func runInBackground(priority: TaskPriority? = nil, _ work: @escaping @Sendable () async -> Void) {
        let id = state.withLock { state -> UInt64 in
            state.nextBackground += 1
            return state.nextBackground
        }
        let task = Task(executorPreference: options.taskExecutor, priority: priority) { [weak self] in
            await work()
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
    package static let refreshFailedReason = "refresh failed"

    /// Waits until the work the engine started in the background has finished (refreshes in
    /// flight, each bounded by its `refresh.timeout`, and the saving of what they returned;
    /// logout calls; publications to the coordinator), e.g. before a command-line tool exits
    /// right after its last request. A refresh that a logout overtook still ends and its
    /// rotated tokens are saved: exiting before would leave a spent refresh token in the store.
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
