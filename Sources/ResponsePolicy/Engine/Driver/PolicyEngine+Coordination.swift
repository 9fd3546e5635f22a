import Foundation
import Synchronization

/// What the engine does with its ``SessionCoordinator``: seeds it at start, and turns what it
/// hears from other engines into the same state changes a local refresh, sign-in or logout makes.
/// (The refresh turn itself is in `PolicyEngine+Refresh.swift`; the logout publication in
/// `PolicyEngine+Logout.swift`.)
///
/// Concurrency contract: updates may arrive on any thread, late, twice or out of order; each is
/// applied under the engine's lock and compared with what the engine holds (a generation not
/// newer, a cooldown not later, is ignored), so a repeated or stale update changes nothing.
extension PolicyEngine {
    /// Starts the coordinator with the store's credentials and adopts what it already shares.
    ///
    /// Requests wait for this join before their first attempt (``awaitJoin()``): a process started
    /// during a fleet cooldown must not send, and one restarted with an older token must sign with
    /// the shared one (issue 19, invariant c). The join is bounded by the coordinator's own
    /// timeout (`connect-timeout`): `start` answers within it, reachable or not.
    func startCoordination(saved: SharedSession?) {
        let coordinator = coordinator
        runInBackground { [weak self] in
            let shared = await coordinator.start(saved: saved) { [weak self] update in
                self?.coordinationUpdate(update)
            }
            guard let self else { return }
            if let shared {
                self.coordinationUpdate(.credentials(shared))
                if let until = shared.loggedOutUntil { self.logoutFromElsewhere(until: until, reason: "logged out") }
            }
            self.joined()
        }
    }

    /// Waits until the engine has joined the shared session (at once when it has, or when it
    /// shares none).
    func awaitJoin() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let waiting = joining.withLock { state -> Bool in
                guard state.pending else { return false }
                state.waiters.append(continuation)
                return true
            }
            if !waiting { continuation.resume() }
        }
    }

    private func joined() {
        let waiters = joining.withLock { state -> [CheckedContinuation<Void, Never>] in
            state.pending = false
            joinPending.store(false, ordering: .releasing)
            defer { state.waiters = [] }
            return state.waiters
        }
        for waiter in waiters { waiter.resume() }
    }

    /// Applies one piece of news from the coordinator.
    package func coordinationUpdate(_ update: SessionUpdate) {
        switch update {
        case .credentials(let session): adopt(session)
        case .loggedOut(let until, let reason): logoutFromElsewhere(until: until, reason: reason)
        case .retryAfter(let until, let reason):
            // Another process's token call was asked to wait: no call from here before it ends.
            let (now, date) = (clock.now, clock.date)
            state.withLock { state in
                state.refresh.heardRetryAfter(
                    until: RefreshFlight.engineTime(until, now: now, date: date), reason: reason, now: now)
            }
        case .problem(let reason):
            let runtime = state.withLock { state in
                state.coordinationProblem = PluginError(
                    kind: .coordination, name: state.runtime.policy.coordination.name, reason: reason)
                return state.runtime
            }
            problem("coordination: \(reason)", runtime)
        case .recovered:
            let runtime = state.withLock { state in
                state.coordinationProblem = nil
                return state.runtime
            }
            let republish = state.withLock { state -> (Date, String)? in
                // This engine's own logout, which the outage may have kept from the others: said
                // again (a store never shortens a cooldown, and the others ignore an end they hold).
                guard let until = state.loggedOutUntilDate, let reason = state.logoutReason,
                    until > clock.date
                else { return nil }
                if case .elsewhere = reason { return nil }
                return (until, reason.eventText)
            }
            let coordinator = coordinator
            runInBackground { [weak self] in
                await self?.publishUnpublished(runtime)
                if let (until, reason) = republish { await coordinator.publishLogout(until: until, reason: reason) }
            }
        }
    }

    /// Adopts credentials another engine published, when they are newer than those held. Requests
    /// waiting for this engine's refresh retry with them at once.
    func adopt(_ session: SharedSession) {
        let now = clock.now
        let adopted = state.withLock { state -> (PolicyRuntime, Actions)? in
            switch state.adopt(session, now: now) {
            case .ignored, .numbered: return nil
            case .adopted(let answered):
                // The waiters are re-sent with the fleet's credentials: not one of their refreshes
                // (issue 19, invariant d; a pair kept through an outage and published late may
                // be refused at once, which must lead to a refresh, not to on-exhausted).
                // Saved first, then the waiters go on.
                var woken: Actions = [.save]
                if let answered {
                    state.endWaits(answered, .adopted, into: &woken)
                    // A flight between calls ends here: its timer goes (one with a call out keeps
                    // it until the call returns).
                    if !answered.isOut {
                        woken.append(.refresh(.disarm(answered.id)))
                        // Its lease goes back: the fleet's credentials answered it.
                        if let lease = answered.lease {
                            woken.append(.refresh(.endTurn(lease, "answered by another process's credentials")))
                        }
                    }
                }
                // (A flight between calls ends here: whoever waits for the refresh to settle goes on.)
                if state.refresh.isIdle { woken += state.settled() }
                return (state.runtime, woken)
            }
        }
        guard let (runtime, woken) = adopted else { return }
        perform(woken, for: nil, runtime: runtime)
    }

    /// The coordinator stored this engine's sign-in as `session`: its generation is the one to
    /// compare later publications with.
    func signedIn(_ session: SharedSession, _ credentials: Credentials) {
        let stored = state.withLock { $0.signInStored(session, credentials) }
        if !stored { adopt(session) }
    }
}

extension PolicyEngine {
    /// What this engine has not been able to tell the fleet yet, in words without a secret: a pair
    /// its refresh got that the coordinator has not stored (it is in the credential store), a
    /// logout or a publication the coordinator still holds (``PendingPublications``). Empty when
    /// nothing is pending, or the session is not shared.
    package var unpublished: [String] {
        guard !coordinatorIsLocal else { return [] }
        var pending: [String] = []
        if state.withLock({ $0.refresh.unpublished != nil }) { pending.append("a new token pair") }
        if let coordinator = coordinator as? any PendingPublications { pending += coordinator.unpublished }
        return pending
    }

    /// Publishes what is pending (``unpublished``) for at most `timeout`, asking again while the
    /// coordinator cannot take it; returns what is still unpublished. What a tool calls before it
    /// exits (issue 30, case 4): a pair or a logout only this process knows must reach the fleet,
    /// or be named.
    package func publishPending(timeout: Duration) async -> [String] {
        let giveUp = clock.now + timeout
        let runtime = state.withLock { $0.runtime }
        var pause = Duration.milliseconds(50)
        while true {
            // Raced against what is left: a publication stuck on a paused store must not hold the
            // exit past the bound (it stays in flight meanwhile).
            await raced(until: giveUp) { await self.publishUnpublished(runtime) }
            if let coordinator = coordinator as? any PendingPublications {
                _ = await coordinator.flushPending(timeout: max(.zero, min(giveUp - clock.now, .seconds(1))))
            }
            let left = unpublished
            if left.isEmpty || clock.now >= giveUp { return left }
            try? await clock.sleep(until: min(giveUp, clock.now + pause))
            pause = min(pause * 2, .seconds(1))
        }
    }

    /// Runs `work` in a task of its own and returns when it ends or at `deadline`, whichever is
    /// first (the work goes on in the background).
    private func raced(until deadline: Duration, _ work: @escaping @Sendable () async -> Void) async {
        let bound = Locked<TimerNode?>(nil)
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let once = ResumeOnce(continuation)
            Task {
                await work(); once.resume(())
            }
            bound.withLock { $0 = timers.schedule(at: max(deadline, clock.now)) { once.resume(()) } }
        }
        if let timer = bound.withLock({ $0 }) { timers.cancel(timer) }
    }
}
