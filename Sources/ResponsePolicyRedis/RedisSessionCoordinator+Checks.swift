import Foundation
import ResponsePolicy

/// Everything read from Redis is checked before use (issue 23): malformed or out-of-range values
/// are refused with a `problem` naming the key, and under `signing-key-env` every value must carry
/// the fleet's seal.
extension RedisSessionCoordinator {
    /// The session in a `{0, gen, creds, logout-until, epoch}` reply, every value checked. Under a
    /// key, a refused value is a `problem` naming the key and coordination trouble for the caller
    /// (never a logout, never the credentials); without one, malformed credentials are dropped.
    /// `seenBefore`: the newest generation this process knew when it sent the command (a session
    /// older than that is a replay; one that became old while the answer travelled is not).
    func session(_ items: [RedisReply], seenBefore: UInt64? = nil) -> Result<SharedSession, CoordinationError> {
        let generation = UInt64(max(0, items[1].integer ?? 0))
        let text = items[2].text ?? ""
        func refuse(_ reason: String) -> Result<SharedSession, CoordinationError> {
            send(.problem(reason))
            return .failure(CoordinationError(reason))
        }
        guard let signer else {
            let epoch = learnEpoch(items.count > 4 ? items[4].text : nil, generation: generation) ?? 0
            return .success(
                SharedSession(
                    credentials: credentials(text, generation: generation, source: "the session hash"),
                    generation: generation, loggedOutUntil: Self.until(items[3]), epoch: epoch))
        }
        var credentials: Credentials?
        if !text.isEmpty {
            switch SharedCredentialsCodec.check(text, signer: signer, generation: generation) {
            case .success(let value): credentials = value
            case .failure(let error): return refuse("the session hash \(keys.session) on \(endpoint): \(error.reason)")
            }
        } else if generation > 0 {
            return refuse(
                "the session hash \(keys.session) on \(endpoint) was refused: generation \(generation) without credentials"
            )
        }
        let seen = seenBefore ?? state.withLock { $0.memory.generation }
        if generation < seen {
            return refuse(
                "the session hash \(keys.session) on \(endpoint) was refused: its generation \(generation) is older than "
                    + "\(seen), already seen (replayed, or Redis restored from an older snapshot)")
        }
        // The session epoch stored with the session (its own seal): never past the generation.
        var stored: UInt64 = 0
        switch signer.checkEpoch(items.count > 4 ? items[4].text : nil) {
        case .failure(let error): return refuse("the session epoch in \(keys.session) on \(endpoint) \(error.reason)")
        case .success(let epoch) where epoch > generation:
            return refuse(
                "the session epoch in \(keys.session) on \(endpoint) was refused: epoch \(epoch) is past its "
                    + "generation \(generation)")
        case .success(let epoch): stored = epoch
        }
        let known = state.withLock { state -> UInt64 in
            state.memory.sawEpoch(stored)
            return state.memory.epoch
        }
        switch signer.checkLogoutEnd(items[3].text) {
        case .failure(let error): return refuse("the cooldown \(keys.logout) on \(endpoint) \(error.reason)")
        case .success(let end):
            let source = "the cooldown \(keys.logout) on \(endpoint)"
            var until = end?.until
            // An end decided before the sign-in of the known epoch (put back after it, or stored by
            // a process that ran an older logout script) ended only the session that sign-in
            // ended: a problem, and no cooldown. The session itself is the current one, so it is
            // not refused: refusing it paused every refresh turn and join until the end expired.
            if let end, let problem = epochProblem(end.epoch, known: known, source: source) {
                send(.problem(problem))
                until = nil
            }
            let now = Date().millisecondsSince1970
            return .success(
                SharedSession(
                    credentials: credentials, generation: generation,
                    loggedOutUntil: until.flatMap { $0 > now ? Date(milliseconds: $0) : nil }, epoch: stored))
        }
    }

    /// Under a key, `beginScript`'s fifth and sixth arguments: the fencing token this process asks
    /// for (after every one it has seen) and its lease's sealed expiry. Without one: none (the
    /// knowledge arguments fill the two places with empty strings).
    func sealedLeaseArguments(leaseMs: Int64) -> [String] {
        guard let signer else { return [] }
        let fence = state.withLock { $0.memory.fence } + 1
        return [String(fence), signer.leaseSuffix(fence: fence, expires: Date().millisecondsSince1970 + leaseMs)]
    }

    /// Why a granted lease may not be used: the session it starts from is older than one this
    /// process has seen (a rolled-back record the script did not see as such). Nil when it may.
    func grantProblem(_ granted: RefreshLease) -> String? {
        let seen = state.withLock { $0.memory.generation }
        guard granted.generation < seen else { return nil }
        return "the session hash \(keys.session) on \(endpoint) was refused: its generation \(granted.generation) is "
            + "older than \(seen), already seen (replayed, or Redis restored from an older snapshot)"
    }

    /// The fencing token of the lease another process holds, checked under a key.
    func leaseHolder(_ reply: RedisReply) -> Result<UInt64?, CoordinationError> {
        let text = reply.text ?? ""
        guard let signer else {
            let fence = UInt64(text.prefix { $0 != ":" })
            if let fence { state.withLock { $0.memory.sawFence(fence) } }
            return .success(fence)
        }
        switch signer.checkLease(text, notBefore: Date().millisecondsSince1970) {
        case .failure(let error):
            let problem = "the lease \(keys.lease) on \(endpoint) \(error.reason)"
            send(.problem(problem))
            return .failure(CoordinationError(problem))
        case .success(let lease):
            state.withLock { $0.memory.sawFence(lease.fence) }
            return .success(lease.fence)
        }
    }

    /// Under a key, the loops that make `refresh.limit` used up must each be sealed
    /// (`<generation>:<ms>:<seal>`, ``loopMember(_:)``) within the limit's window: a forged or
    /// replayed one is refused (a problem), not counted.
    func limitProblem(_ members: [RedisReply], perMs: Int64) -> String? {
        guard let signer else { return nil }
        let notBefore = Date().millisecondsSince1970 - perMs
        for member in members {
            let parts = (member.text ?? "").split(separator: ":", maxSplits: 2).map(String.init)
            var refusal = "was refused: it is not a sealed loop"
            if parts.count == 3, let at = Int64(parts[1]) {
                if let why = signer.check(parts[2], "loop", [parts[0], parts[1]]).refusal {
                    refusal = "was refused: \(why)"
                } else if at < notBefore {
                    refusal = "was refused: it is older than the limit's window (replayed)"
                } else {
                    continue
                }
            }
            let problem = "a refresh.limit loop in \(keys.loops) on \(endpoint) \(refusal)"
            send(.problem(problem))
            return problem
        }
        return nil
    }

    /// `beginScript`'s loop member for `generation`: the generation, sealed under a key with when
    /// this process counts it (`<generation>:<ms>:<seal>`).
    func loopMember(_ generation: UInt64) -> String {
        guard let signer else { return "" }
        let at = String(Date().millisecondsSince1970)
        return "\(generation):\(at):" + signer.seal("loop", [String(generation), at])
    }

    /// `endScript`'s arguments for a wait the token endpoint asked for (none without one): its end
    /// (at most ``CoordinationRecord/longestEmbargoMs`` ahead; under a key sealed with the reason,
    /// `<ms>:<seal>`), the reason and its announcement `{"t":"r",…}`.
    func retryAfterArguments(_ retryAfter: Date?, reason: String?) -> [String] {
        let now = Date().millisecondsSince1970
        guard let retryAfter, retryAfter.millisecondsSince1970 > now else { return [] }
        let until = min(retryAfter.millisecondsSince1970, now + CoordinationRecord.longestEmbargoMs)
        let why = String((reason ?? "the token endpoint asked to wait").prefix(300))
        var value = String(until)
        var announcement: [String: Any] = ["t": "r", "u": until, "w": why]
        if let signer {
            let seal = signer.seal("retry-after", [String(until), why])
            value += ":" + seal
            announcement["s"] = seal
        }
        return [value, why, Self.json(announcement)]
    }

    /// The token endpoint's wait in a `{6, retry-after, why}` reply (or an announcement's `u`, `w`
    /// and seal): its end at most ``CoordinationRecord/longestEmbargoMs`` from now. Under a key an
    /// unsealed or forged one is a problem and refused (the caller has Redis remove it): it must
    /// not let a writer without the key hold every refresh.
    func retryAfter(_ value: RedisReply, reason: String) -> Result<RefreshTurn, CoordinationError> {
        let text = value.text ?? value.integer.map(String.init) ?? ""
        let parts = text.split(separator: ":", maxSplits: 1).map(String.init)
        guard let first = parts.first, let until = Int64(first), until >= 0 else {
            let problem = "the Retry-After end in \(keys.session) on \(endpoint) was refused: it is not a number"
            send(.problem(problem))
            return .failure(CoordinationError(problem))
        }
        if let signer,
            let refusal = signer.check(parts.count > 1 ? parts[1] : nil, "retry-after", [first, reason]).refusal
        {
            let problem = "the Retry-After end in \(keys.session) on \(endpoint) was refused: \(refusal)"
            send(.problem(problem))
            return .failure(CoordinationError(problem))
        }
        let bounded = min(until, Date().millisecondsSince1970 + CoordinationRecord.longestEmbargoMs)
        return .success(.retryAfter(until: Date(milliseconds: bounded), reason: String(reason.prefix(300))))
    }

    /// The fencing counter moved past this process's guess: the next guess goes after it. Its
    /// value is never trusted otherwise (a lower one is simply passed).
    func counterProblem(_ reply: RedisReply) -> String? {
        guard let current = reply.integer, current >= 0, current < 9_000_000_000_000_000 else {
            let problem = "the fencing counter \(keys.fence) on \(endpoint) was refused: it is out of range"
            send(.problem(problem))
            return problem
        }
        state.withLock { $0.memory.sawFence(UInt64(current)) }
        return nil
    }

    /// Credentials read from Redis, or nil (with a `problem` naming where they came from) when
    /// they are malformed or out of range: a forged or corrupted value never reaches the engine.
    func credentials(_ text: String?, generation: UInt64, source: String) -> Credentials? {
        guard let text, !text.isEmpty else { return nil }
        switch SharedCredentialsCodec.check(text, signer: signer, generation: generation) {
        case .success(let credentials): return credentials
        case .failure(let error):
            send(.problem("\(source) of \(keys.session) on \(endpoint) was refused: \(error.reason)"))
            return nil
        }
    }

    func credentials(object: Any, generation: UInt64, source: String) -> Credentials? {
        switch SharedCredentialsCodec.check(object: object, signer: signer, generation: generation) {
        case .success(let credentials): return credentials
        case .failure(let error):
            send(.problem("\(source) on \(keys.channel) was refused: \(error.reason)"))
            return nil
        }
    }

    /// `logoutScript` refused a logout decided before the sign-in that started the stored epoch
    /// (`{0, epoch}`): its request was signed with an older session's token, or this process had
    /// not heard of that sign-in. Nothing was stored or announced (it ended only the session the
    /// sign-in had already ended); the epoch is learned. An epoch that fails its seal is a
    /// problem, and is not learned.
    func learnFromRefusedLogout(_ reply: RedisReply) {
        let items = reply.items
        guard items.first?.integer == 0, items.count > 1 else { return }
        guard let signer else {
            if let epoch = Self.plainEpoch(items[1].text) { state.withLock { $0.memory.sawEpoch(epoch) } }
            return
        }
        switch signer.checkEpoch(items[1].text) {
        case .success(let epoch): state.withLock { $0.memory.sawEpoch(epoch) }
        case .failure(let error): send(.problem("the session epoch in \(keys.session) on \(endpoint) \(error.reason)"))
        }
    }

    /// A logout's announcement, signed when the fleet has a key (with the session epoch it was
    /// decided in).
    func logoutMessage(_ untilMs: Int64, _ reason: String, epoch: UInt64) -> String {
        let text = String(reason.prefix(300))
        var object: [String: Any] = ["t": "l", "u": untilMs, "r": text]
        if let signer {
            object["e"] = epoch
            object["s"] = signer.seal("logout", [String(untilMs), text, String(epoch)])
        }
        return Self.json(object)
    }

    /// Why a logout decided in session `epoch` may not be applied: this process knows of a later
    /// sign-in (`known`), which already ended that session. Nil when it may.
    func epochProblem(_ epoch: UInt64, known: UInt64, source: String) -> String? {
        guard signer != nil, epoch < known else { return nil }
        return "\(source) was refused: it was decided in session epoch \(epoch), before the sign-in of epoch "
            + "\(known) that ended it (a logout put back after a sign-in: replayed; signing-key-env)"
    }

    /// The session epoch a sign-in's (or publication's) announcement or the session hash carries,
    /// checked, remembered when later than the one known, and returned. A refused one is a
    /// problem, is never learned and returns nil.
    @discardableResult
    func learnEpoch(_ value: Any?, generation: UInt64) -> UInt64? {
        guard let text = value as? String else { return nil }
        guard let signer else {
            // Unsigned: a number, trusted as everything else is without a key; it only keeps a
            // logout decided before it from being stored.
            guard let epoch = Self.plainEpoch(text), epoch <= generation else { return nil }
            state.withLock { $0.memory.sawEpoch(epoch) }
            return epoch
        }
        switch signer.checkEpoch(text) {
        case .failure(let error):
            send(.problem("the session epoch of a publication on \(keys.channel) \(error.reason)"))
        case .success(let epoch) where epoch <= generation:
            state.withLock { $0.memory.sawEpoch(epoch) }
            return epoch
        case .success(let epoch):
            send(
                .problem(
                    "the session epoch of a publication on \(keys.channel) was refused: epoch \(epoch) is past its "
                        + "generation \(generation)"))
        }
        return nil
    }

    static func until(_ reply: RedisReply) -> Date? {
        // A keyed peer stores `<ms>:<seal>`; the number comes first.
        let number = reply.integer ?? reply.text.flatMap { Int64($0.prefix { $0 != ":" }) }
        guard let milliseconds = number, milliseconds > Date().millisecondsSince1970 else { return nil }
        return Date(milliseconds: min(milliseconds, SharedCredentialsCodec.maxMilliseconds))
    }

    /// The number a session epoch starts with (sealed or not), when it is one.
    static func plainEpoch(_ text: String?) -> UInt64? {
        guard let text, let epoch = UInt64(text.prefix { $0 != ":" }), epoch < 9_000_000_000_000_000 else { return nil }
        return epoch
    }
}
