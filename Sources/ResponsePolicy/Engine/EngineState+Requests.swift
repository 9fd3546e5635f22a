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
    /// What the top of a request's loop may do (``gate(insideLock:cancelled:now:)``).
    enum Gate { case go, ended, loggedOut, held, queued }

    /// The top of request `id`'s loop: it goes out now with the credentials and generation
    /// returned, or it was ended, or the session is in its cooldown, or it waits. It waits for
    /// the refresh in flight when its scope holds new requests (it has not gone out yet, so it
    /// waits for the fresh token rather than going out with one already known to be stale), and
    /// in its host's dispatch queue when the host's slots are taken.
    mutating func gate(insideLock id: UInt64, cancelled: Bool, now: Duration) -> (Gate, CredentialsBox?, UInt64) {
        guard let slot = slots[id], !cancelled, slot.endReason == nil else { return (.ended, nil, 0) }
        if isLoggedOut(at: now) { return (.loggedOut, nil, 0) }
        if slot.holdsNewRequests, flight != nil {
            join(insideLock: id)
            return (.held, nil, 0)
        }
        if slot.host != nil, !acquireDispatchSlot(insideLock: id) { return (.queued, nil, 0) }
        return (.go, credentialsBox, generation)
    }

    /// Ends request `id` from outside its loop (its caller, or a logout): marks why, disarms its
    /// timer (a backoff's leaves the heap when the request's park ends, in its own task), and
    /// hands back its attempt and its park.
    mutating func end(insideLock id: UInt64, _ reason: EndReason) -> Effects {
        modifySlot(id) { slot in
            if slot.endReason == nil { slot.endReason = reason }
            slot.armedTimer = 0
            var effects = Effects()
            if let attempt = slot.attemptCancellation { effects.cancel.append(attempt) }
            if let parked = slot.parked.take() { effects.resume.append(parked) }
            return effects
        } ?? Effects()
    }

    /// What a request does with the attempt that just ended (``attemptEnded(insideLock:responseArrived:callerCancelled:)``).
    enum AttemptDisposition: Equatable {
        /// Its result counts (a response, an error, or a timeout when `timedOut`).
        case result(timedOut: Bool)
        /// A response arrived, but a logout was decided while it was on its way in: the
        /// response is still classified, and delivered (or failed) when its rule says so; a
        /// refresh or retry it asks for ends the request logged out.
        case arrivedAfterLogout
        /// The request was ended (its caller, or a logout before any response): the result is dropped.
        case ended
    }

    /// Request `id`'s attempt ended (`responseArrived`: the transport returned a response):
    /// disarms it and says what counts. A response that has arrived is the server's answer,
    /// which a logout decided a moment later does not unsay; only the caller's cancellation
    /// drops it.
    mutating func attemptEnded(insideLock id: UInt64, responseArrived: Bool, callerCancelled: Bool)
        -> AttemptDisposition
    {
        modifySlot(id) { slot in
            slot.attemptCancellation = nil
            slot.armedTimer = 0
            slot.phase = .running
            if callerCancelled { return .ended }
            switch slot.endReason {
            case nil: return .result(timedOut: slot.timedOut)
            case .loggedOut? where responseArrived: return .arrivedAfterLogout
            default: return .ended
            }
        } ?? .ended
    }

    /// Request `id`'s timer fired: its attempt timed out, its backoff is over, or its deadline
    /// came while it waited for a refresh or a dispatch slot. A stale firing (the attempt ended,
    /// the request was ended, the refresh or the slot came first) finds another token armed, or
    /// a wake already set, and does nothing.
    mutating func timerFired(insideLock id: UInt64, token: UInt64) -> Effects {
        modifySlot(id) { slot in
            var effects = Effects()
            // An attempt a logout left to finish (its response was arriving) still times out.
            guard token != 0, slot.armedTimer == token, slot.endReason == nil || slot.phase == .onWire else {
                return effects
            }
            slot.armedTimer = 0
            switch slot.phase {
            case .onWire:
                slot.timedOut = true
                if let attempt = slot.attemptCancellation { effects.cancel.append(attempt) }
            case .backoff, .awaitingRefresh, .queued:
                guard slot.wake == nil else { break }
                slot.wake = .timer
                if let parked = slot.parked.take() { effects.resume.append(parked) }
            case .running:
                break
            }
            return effects
        } ?? Effects()
    }

    /// A logout (its cooldown just started) ends every request but `trigger`: those waiting for
    /// the refresh in flight first (it runs on; its result is discarded, a new epoch began), then
    /// the others, each in request order so a simulation's output is the same every run. Waiting
    /// requests (a backoff, a dispatch queue) end whatever `cancelInFlight` says. An attempt
    /// whose response is arriving (``AttemptCancellation/responseArriving()``) is not cancelled:
    /// it is marked ended and handled by its rule when its response is in.
    mutating func endRequests(insideLock trigger: UInt64?, cancelInFlight: Bool) -> Effects {
        var effects = Effects()
        if let flight {
            for id in live(flight) where id != trigger {
                modifySlot(id) { slot in
                    if slot.endReason == nil { slot.endReason = .loggedOut }
                    slot.awaitedFlight = nil
                    if let continuation = slot.parked.take() { effects.resume.append(continuation) }
                }
            }
            self.flight?.waiters.removeAll { $0 != trigger }
        }
        for id in requestNumbers where id != trigger {
            modifySlot(id) { slot in
                guard cancelInFlight || slot.phase == .backoff || slot.phase == .queued else { return }
                if slot.endReason == nil { slot.endReason = .loggedOut }
                if slot.phase == .onWire, let attempt = slot.attemptCancellation, attempt.isArriving {
                    // Its response is coming in: the server answered before it knew of the
                    // logout. It is read to the end (its timer stays armed) and handled by its
                    // rule (``attemptEnded(insideLock:responseArrived:callerCancelled:)``).
                    return
                }
                if let attempt = slot.attemptCancellation { effects.cancel.append(attempt) }
                // A backoff's timer is taken off the heap by the request itself, when its park
                // ends; disarmed here, a firing in between does nothing.
                slot.armedTimer = 0
                if let continuation = slot.parked.take() { effects.resume.append(continuation) }
            }
        }
        return effects
    }
}
