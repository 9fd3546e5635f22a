import Foundation
import ResponsePolicy

/// The subscriber: a connection of its own, read by its own thread, that hears every announcement
/// on the channel (publications, grants, ends, failures, logouts), turns them into updates for the
/// engine and into what this process remembers, and resynchronises after a reconnect.
extension RedisSessionCoordinator {
    /// Reads the channel on its own connection; reconnects with backoff after a problem.
    func subscriberLoop() {
        var connection: RedisConnection?
        while !state.withLock({ $0.stopped }) {
            if state.withLock({ $0.health.down }) { connection = nil }
            if connection == nil {
                state.withLock { $0.memory.stoppedListening() }
                if state.withLock({ $0.health.down }) { pause(state.withLock { $0.health.backoff }) }
                if state.withLock({ $0.stopped }) { break }
                do {
                    let subscribed = try connect()
                    try subscribed.send(["SUBSCRIBE", keys.channel])
                    try resync()
                    connection = subscribed
                    if let update = state.withLock({ $0.health.recover() }) {
                        queue.async { [box] in box.connection = nil }  // it died with the outage
                        send(update)
                    }
                } catch {
                    fail(error.message)
                    continue
                }
            }
            do {
                if let reply = try connection?.nextReply(waitingAtMost: 50) { receive(reply) }
            } catch {
                connection = nil
                fail(error.message)
            }
        }
    }

    /// After (re)connecting: publishes a logout the outage kept back, reads what was missed, and
    /// re-seeds a session Redis lost (or holds older than this process knows).
    func resync() throws(RedisError) {
        let reader = try connect()
        try publishPendingLogout(on: reader)
        // Sent as EVAL: one command on a connection used once (its count in INFO commandstats is
        // also the tests' signal that a subscriber has read the session).
        let seen = state.withLock { $0.memory.generation }
        let reply = try reader.command(seedCommand())
        let items = reply.items
        guard items.count >= 4, items[0].integer == 0, case .success(let session) = session(items, seenBefore: seen)
        else {
            signal.bump()
            return
        }
        if session.credentials != nil, isNewer(session) {
            remember(session)
            send(.credentials(session))
        }
        if let until = session.loggedOutUntil { send(.loggedOut(until: until, reason: "logged out elsewhere")) }
        signal.bump()
    }

    /// Publishes a logout that could not be published while Redis was unreachable, unless its
    /// cooldown is over by now.
    func publishPendingLogout(on connection: RedisConnection) throws(RedisError) {
        guard let (untilMs, reason, epoch) = state.withLock({ $0.pendingLogout }) else { return }
        let ttl = untilMs - Date().millisecondsSince1970
        if ttl > 0 {
            let command = logoutCommand(untilMs, ttl: ttl, reason: reason, epoch: epoch)
            learnFromRefusedLogout(try connection.command(command))
        }
        state.withLock { state in if state.pendingLogout?.until == untilMs { state.pendingLogout = nil } }
    }

    func receive(_ reply: RedisReply) {
        let items = reply.items
        if items.count == 3, items[0].text == "subscribe" {
            // From here on every announcement is heard.
            state.withLock { $0.memory.listening(since: Self.monotonicNow) }
            return
        }
        guard items.count == 3, items[0].text == "message", let payload = items[2].text,
            let object = try? JSONSerialization.jsonObject(with: Data(payload.utf8)) as? [String: Any],
            let type = object["t"] as? String
        else { return }
        switch type {
        case "c":
            guard let number = object["g"] as? NSNumber, number.doubleValue.isFinite, number.doubleValue >= 0,
                number.doubleValue < 9e15, case let generation = number.uint64Value,
                let credentials = object["c"].flatMap({
                    credentials(object: $0, generation: generation, source: "a publication")
                })
            else { break }
            let epoch = learnEpoch(object["e"], generation: generation)
            let session = SharedSession(credentials: credentials, generation: generation, epoch: epoch ?? 0)
            if let fence = Self.number(object["f"]) { state.withLock { $0.memory.heardEnd(fence: fence) } }
            if isNewer(session) {
                remember(session)
                send(.credentials(session))
            } else if state.withLock({ $0.memory.isBehind(session) }) {
                correct()
            }
        case "g":
            heardGrant(object)
        case "e":
            guard let fence = Self.number(object["f"]) else { break }
            if let refusal = signer?.check(object["s"] as? String, "end", [String(fence)]).refusal {
                send(.problem("a lease's end on \(keys.channel) was refused: \(refusal)"))
                break
            }
            state.withLock { $0.memory.heardEnd(fence: fence) }
        case "l":
            guard let number = object["u"] as? NSNumber, number.doubleValue.isFinite, number.doubleValue >= 0,
                number.doubleValue <= Double(SharedCredentialsCodec.maxMilliseconds)
            else {
                send(.problem("a logout on \(keys.channel) was refused: its end is out of range"))
                break
            }
            let until = number.int64Value
            let reason = object["r"] as? String ?? "logged out elsewhere"
            let sealedEpoch = object["e"] as? NSNumber
            let epoch = sealedEpoch.map { $0.doubleValue.isFinite && $0.doubleValue >= 0 ? $0.uint64Value : 0 } ?? 0
            if let refusal = signer?.check(object["s"] as? String, "logout", [String(until), reason, String(epoch)])
                .refusal
            {
                send(.problem("a logout on \(keys.channel) was refused: \(refusal)"))
                break
            }
            let known = state.withLock { $0.memory.epoch }
            if let problem = epochProblem(epoch, known: known, source: "a logout on \(keys.channel)") {
                send(.problem(problem))
                break
            }
            send(.loggedOut(until: Date(milliseconds: until), reason: reason))
        case "r":
            // A holder's token call was asked to wait (`Retry-After`): no call from here before it
            // ends. Under a key only a sealed one is heard; at most the longest wait the engine obeys.
            guard let until = Self.number(object["u"]), until < 9_000_000_000_000_000 else { break }
            let why = object["w"] as? String ?? "the token endpoint asked to wait"
            if let refusal = signer?.check(object["s"] as? String, "retry-after", [String(until), why]).refusal {
                send(.problem("a Retry-After notice on \(keys.channel) was refused: \(refusal)"))
                break
            }
            let now = Date().millisecondsSince1970
            let bounded = min(Int64(until), now + CoordinationRecord.longestEmbargoMs)
            if bounded > now { send(.retryAfter(until: Date(milliseconds: bounded), reason: String(why.prefix(300)))) }
        case "f":
            guard let fence = Self.number(object["f"]) else { break }
            let reason = object["w"] as? String ?? "the refresh failed in another process"
            if let refusal = signer?.check(object["s"] as? String, "failure", [String(fence), reason]).refusal {
                send(.problem("a failed-refresh notice on \(keys.channel) was refused: \(refusal)"))
                break
            }
            state.withLock { state in
                if state.failures.count > 64 { state.failures.removeAll() }
                state.failures[fence] = reason
                state.memory.heardEnd(fence: fence)
            }
        default: break
        }
        signal.bump()
    }

    /// A lease granted (or put back) to another process: remembered with its end by this
    /// process's clock, and honoured for its term should Redis forget it. Under a key the value
    /// must be a sealed lease; a quarantine (fencing token 0) is not remembered.
    private func heardGrant(_ object: [String: Any]) {
        guard let value = object["v"] as? String, !value.isEmpty, value.utf8.count < 512,
            let generation = Self.number(object["g"]), let leaseMs = Self.number(object["l"])
        else { return }
        let fence: UInt64
        if let signer {
            switch signer.checkLease(value, notBefore: Date().millisecondsSince1970) {
            case .failure(let error):
                send(.problem("a lease announced on \(keys.channel) \(error.reason)"))
                return
            case .success(let lease): fence = lease.fence
            }
        } else {
            guard let plain = UInt64(value.prefix { $0 != ":" }), plain < 9_000_000_000_000_000 else { return }
            fence = plain
        }
        guard fence > 0 else { return }
        let length = Int64(min(leaseMs, UInt64(configuration.lease.milliseconds() * 4)))
        state.withLock { state in
            if state.own.contains(fence) {
                state.memory.sawFence(fence)
            } else {
                state.memory.heardGrant(
                    fence: fence, generation: generation, value: value, leaseMs: length, now: Self.monotonicNow)
            }
        }
    }

    /// Re-seeds Redis with this process's newer pair (a re-seed announced an older one: the
    /// re-seeding process missed what this one saw). At most once a second; on the command queue.
    func correct() {
        let now = Self.monotonicNow
        let due = state.withLock { state -> Bool in
            guard now - state.lastCorrection >= 1000 else { return false }
            state.lastCorrection = now
            return true
        }
        guard due else { return }
        Task { _ = await run(seedCommand()) }
    }

    static func number(_ value: Any?) -> UInt64? {
        guard let number = value as? NSNumber, number.doubleValue.isFinite, number.doubleValue >= 0,
            number.doubleValue < 9e15
        else { return nil }
        return number.uint64Value
    }

    func pause(_ duration: Duration) {
        let end = ContinuousClock.now + duration
        while ContinuousClock.now < end, !state.withLock({ $0.stopped }) {
            Thread.sleep(forTimeInterval: 0.02)
        }
    }
}
