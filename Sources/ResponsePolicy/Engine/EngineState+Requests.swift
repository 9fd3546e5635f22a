/// What the shell does after a transition that ends or wakes requests, once it has unlocked.
struct Effects {
    /// Parked requests to resume.
    var resume: [UnsafeContinuation<Void, Never>] = []
    /// Attempts on the wire to cancel.
    var cancel: [AttemptCancellation] = []
}

/// The transitions that end or wake requests from outside their own loop: their caller's
/// cancellation, a timer, a logout. Each runs under the engine's lock and returns the
/// continuations to resume and the attempts to cancel, which the shell performs after unlocking.
extension EngineState {
    /// Ends `machine` from outside its loop (its caller, or a logout): marks why, disarms its
    /// timer (a backoff's leaves the heap when the request's park ends, in its own task), and
    /// hands back its attempt and its park.
    func end(insideLock machine: RequestMachine, _ reason: EndReason) -> Effects {
        if machine.endReason == nil { machine.endReason = reason }
        machine.armedTimer = 0
        var effects = Effects()
        if let attempt = machine.attemptCancellation { effects.cancel.append(attempt) }
        if let parked = machine.parked.take() { effects.resume.append(parked) }
        return effects
    }

    /// A request's timer fired: its attempt timed out, its backoff is over, or its deadline came
    /// while it waited for a refresh or a dispatch slot. A stale firing (the attempt ended, the
    /// request was ended, the refresh or the slot came first) finds another token armed, or a
    /// wake already set, and does nothing.
    func timerFired(insideLock machine: RequestMachine, token: UInt64) -> Effects {
        guard token != 0, machine.armedTimer == token, machine.endReason == nil else { return Effects() }
        machine.armedTimer = 0
        var effects = Effects()
        switch machine.phase {
        case .onWire:
            machine.timedOut = true
            if let attempt = machine.attemptCancellation { effects.cancel.append(attempt) }
        case .backoff, .awaitingRefresh, .queued:
            guard machine.wake == nil else { break }
            machine.wake = .timer
            if let parked = machine.parked.take() { effects.resume.append(parked) }
        case .running:
            break
        }
        return effects
    }

    /// A logout (its cooldown just started) ends every request but `trigger`: those waiting for
    /// the refresh in flight first (it runs on; its result is discarded, a new epoch began), then
    /// the others, each in request order so a simulation's output is the same every run. Waiting
    /// requests (a backoff, a dispatch queue) end whatever `cancelInFlight` says.
    func endRequests(insideLock trigger: RequestMachine?, cancelInFlight: Bool) -> Effects {
        var effects = Effects()
        if let flight {
            for machine in flight.live.sorted(by: { $0.context.number < $1.context.number }) where machine !== trigger {
                if machine.endReason == nil { machine.endReason = .loggedOut }
                machine.awaitedFlight = nil
                if let continuation = machine.parked.take() { effects.resume.append(continuation) }
            }
            flight.waiters.removeAll { $0 !== trigger }
        }
        for machine in requests where machine !== trigger {
            guard cancelInFlight || machine.phase == .backoff || machine.phase == .queued else { continue }
            if machine.endReason == nil { machine.endReason = .loggedOut }
            if let attempt = machine.attemptCancellation { effects.cancel.append(attempt) }
            // A backoff's timer is taken off the heap by the request itself, when its park
            // ends; disarmed here, a firing in between does nothing.
            machine.armedTimer = 0
            if let continuation = machine.parked.take() { effects.resume.append(continuation) }
        }
        return effects
    }
}
