import Foundation

extension PolicyEngine {
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
        let settings = runtime.policy.graph.topLevel.logout
        endSession(
            cooldown: settings.cooldown, cancelInFlight: settings.cancelInFlight, reason: .host(reason),
            plugin: runtime.scopes[runtime.scopes.count - 1].logout, runtime: runtime, publish: true)
    }

    /// Another process logged the session out (a ``SessionUpdate/loggedOut(until:reason:)``):
    /// the same cooldown here, without calling the logout plugin or publishing again. A logout
    /// whose end is not later than the cooldown already kept is old news and ignored.
    func logoutFromElsewhere(until: Date, reason: String) {
        let runtime = state.withLock { $0.runtime }
        let settings = runtime.policy.graph.topLevel.logout
        // A cooldown read from a shared store is never longer than this policy's own: a forged or
        // corrupted logout costs at most what a real one costs (issue 23).
        let bounds = CoordinationBounds(maxCooldown: runtime.maxCooldown, maxLease: .zero)
        let until = bounds.cooldown(until: until, now: clock.date)
        let remaining = until.timeIntervalSince(clock.date)
        guard remaining > 0 else { return }
        endSession(
            cooldown: .seconds(remaining), cancelInFlight: settings.cancelInFlight, reason: .elsewhere(reason),
            plugin: nil, runtime: runtime, publish: false, until: until)
    }

    /// Ends the session from outside any request (the host, another process): the transition
    /// every logout shares (``EngineState/logOut(_:cancelInFlight:reason:trigger:context:plugin:publishes:until:now:date:into:)``),
    /// then its actions. (A request's own logout is a transition of that request.)
    private func endSession(
        cooldown: Duration, cancelInFlight: Bool, reason: LogoutReason, plugin: (any LogoutPlugin)?,
        runtime: PolicyRuntime, publish: Bool, until: Date? = nil
    ) {
        let (now, date) = (clock.now, clock.date)
        var actions: Actions = []
        _ = state.withLock { state in
            state.endSession(
                cooldown: cooldown, cancelInFlight: cancelInFlight, reason: reason, trigger: nil, context: nil,
                plugin: plugin, publishes: publish, until: until, now: now, date: date, into: &actions)
        }
        perform(actions, for: nil, runtime: runtime)
    }

    /// Tells the coordinator that the session ended (unless it is the local one, or the news came
    /// from it), then calls the logout plugin, in the background (``Action/publish(_:)``).
    func publish(_ notice: LogoutNotice) {
        let coordinator = coordinatorIsLocal || !notice.publishes ? nil : coordinator
        guard notice.plugin != nil || coordinator != nil else { return }
        let plugin = notice.plugin
        let context = LogoutContext(
            requestID: notice.requestID, reason: notice.reason.eventText, credentials: notice.credentials,
            transport: sessionTransport, clock: clock)
        let (until, text, epoch) = (notice.until, notice.reason.eventText, notice.epoch)
        runInBackground {
            // Published first: the other processes stop sending while the plugin ends the session.
            // In the epoch of the credentials it was decided on (issue 30, case 6): a store where a
            // sign-in started a later one refuses it.
            if epoch > 0 {
                await coordinator?.publishLogout(until: until, reason: text, epoch: epoch)
            } else {
                await coordinator?.publishLogout(until: until, reason: text)
            }
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
            for task in pending { await task.value }
            state.withLock { state in
                for (id, task) in state.background where pending.contains(task) {
                    state.background.removeValue(forKey: id)
                }
            }
            // A refresh between two calls (a backoff, a Retry-After) runs no task: wait for it to
            // settle too (bounded by its refresh.timeout; a call out by twice that).
            await withUnsafeContinuation { (continuation: UnsafeContinuation<Void, Never>) in
                let settled = state.withLock { state -> Bool in
                    guard !state.refresh.isIdle else { return true }
                    state.refreshSettled.append(continuation)
                    return false
                }
                if settled { continuation.resume() }
            }
            if pending.isEmpty, state.withLock({ $0.background.isEmpty && $0.refresh.isIdle }) { return }
        }
    }
}
