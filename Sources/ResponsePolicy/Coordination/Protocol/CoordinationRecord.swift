import Foundation

/// The lease protocol of fleet coordination, as a value over the one shared record every store
/// keeps: the generation, the credentials, the lease with its fencing token, the logout cooldown's
/// end, the last failed refresh and the recent lease grants (for `refresh.limit`).
///
/// Why a value: the same turn logic used to live three times (the lock-file coordinator, the Redis
/// coordinator and its Lua scripts). Here each event is a `mutating func` that takes the time
/// (milliseconds since 1970) and returns what it decided; it never awaits, locks or reads a
/// clock. The file store runs it under `flock`, the in-memory store under a mutex, and the Redis
/// scripts are checked against it case for case; the invariants are tested on the value with
/// random event sequences.
///
/// ```swift
/// var record = CoordinationRecord()
/// if case .granted(let lease) = record.begin(failedGeneration: 0, leaseMs: 15_000, limit: nil, holder: 1, now: t) {
///     _ = record.publish(fresh, with: lease, now: t + 300)
/// }
/// ```
///
/// Fencing: every lease carries a token larger than every earlier one (`fence`). A publication is
/// accepted while its lease holds, or, when the lease has lapsed, only if no lease was granted
/// since (`fence` still equals its token) and nobody published since (the generation is the one
/// the lease started from): then no other process can have presented the same refresh token, and
/// the pair the token endpoint returned is the newest the server issued, so it is kept (issue 19,
/// invariant f) instead of being thrown away.
struct CoordinationRecord: Sendable, Equatable {
    /// The lease held now.
    struct Lease: Sendable, Equatable {
        var fence: UInt64
        /// Who holds it (a process id for the file store; any number elsewhere). 0: unknown.
        var holder: Int64
        /// Its end, in milliseconds since 1970.
        var expires: Int64
    }

    /// The last refresh that failed, by its lease's fencing token.
    struct Failure: Sendable, Equatable {
        var fence: UInt64
        var reason: String
    }

    var generation: UInt64 = 0
    /// How many times a store wrote the record (the file store; others leave it 0). Sealed with
    /// the record under `signing-key-env`, so a process refuses an older copy put back.
    var revision: UInt64 = 0
    var credentials: Credentials?
    /// The last fencing token handed out.
    var fence: UInt64 = 0
    var lease: Lease?
    /// The end of a fleet-wide cooldown, in milliseconds since 1970.
    var loggedOutUntil: Int64?
    /// The session epoch: the generation the last sign-in stored its credentials at (refreshes
    /// keep it; 0 before any sign-in). A logout decided in an older epoch ended a session that
    /// sign-in had already ended.
    var epoch: UInt64 = 0
    var failure: Failure?
    /// When recent leases were granted (ms), for `refresh.limit` across the fleet.
    var refreshes: [Int64] = []

    /// What a refresh trigger gets (``begin(failedGeneration:leaseMs:limit:holder:now:isAlive:)``).
    enum Begin: Sendable, Equatable {
        /// Credentials newer than the failed ones are stored.
        case newer(SharedSession)
        /// Another holder refreshes now: wait (at most `leftMs`) for its publication.
        case wait(holder: UInt64, leftMs: Int64)
        /// This caller refreshes.
        case granted(RefreshLease)
        /// `refresh.limit` is used up across the fleet.
        case limited
    }

    /// The session as shared, the cooldown only while it runs at `now`.
    func session(now: Int64) -> SharedSession {
        SharedSession(
            credentials: credentials, generation: generation,
            loggedOutUntil: loggedOutUntil.flatMap { $0 > now ? Date(milliseconds: $0) : nil })
    }

    /// Whether anything is shared yet.
    var isEmpty: Bool { credentials == nil && loggedOutUntil == nil && generation == 0 }

    /// A process joins: seeds the record from its local credentials when nothing is shared, else
    /// returns what is shared (nil: it seeded, or nothing is shared at all).
    mutating func join(local: Credentials?, now: Int64) -> SharedSession? {
        if credentials == nil, let local {
            credentials = local
            return nil
        }
        guard credentials != nil || (loggedOutUntil ?? 0) > now else { return nil }
        return session(now: now)
    }

    /// A refresh trigger for credentials of `failedGeneration`. `isAlive` tells whether a lease's
    /// holder still runs (the file store checks the pid; others answer `true`).
    mutating func begin(
        failedGeneration: UInt64, leaseMs: Int64, limit: (count: Int, perMs: Int64)?, holder: Int64, now: Int64,
        isAlive: (Int64) -> Bool = { _ in true }
    ) -> Begin {
        if generation > failedGeneration { return .newer(session(now: now)) }
        if var held = lease, held.expires > now, isAlive(held.holder) {
            // A lease longer than this process would grant is forged or from a misconfigured
            // peer: it is cut to one lease from now, so it delays refreshes no more than a dead holder.
            if held.expires - now > max(1, leaseMs) {
                held.expires = now + max(1, leaseMs)
                lease = held
            }
            return .wait(holder: held.fence, leftMs: held.expires - now)
        }
        if let limit, limit.count > 0 {
            refreshes.removeAll { $0 <= now - limit.perMs }
            if refreshes.count >= limit.count { return .limited }
            refreshes.append(now)
        }
        fence += 1
        lease = Lease(fence: fence, holder: holder, expires: now + max(1, leaseMs))
        return .granted(RefreshLease(fencingToken: fence, generation: generation))
    }

    /// What a waiter for lease `holder` finds now: a publication, the holder's failure, or nothing
    /// yet (nil: ask ``begin(failedGeneration:leaseMs:limit:holder:now:isAlive:)`` again).
    func outcome(for holder: UInt64, failedGeneration: UInt64, now: Int64) -> RefreshTurn? {
        if generation > failedGeneration { return .published(session(now: now)) }
        if let failure, failure.fence == holder { return .failedElsewhere(failure.reason) }
        return nil
    }

    /// The holder of `lease` publishes what its refresh produced (see the fencing rule above).
    mutating func publish(_ fresh: Credentials, with held: RefreshLease, now: Int64) -> PublishResult {
        let holds = lease.map { $0.fence == held.fencingToken && $0.expires > now } ?? false
        let nobodySince = fence == held.fencingToken && (lease == nil || lease?.fence == held.fencingToken)
        guard generation == held.generation, holds || nobodySince else {
            return .leaseLost(current: credentials == nil ? nil : session(now: now))
        }
        generation += 1
        credentials = fresh
        lease = nil
        return .published(SharedSession(credentials: fresh, generation: generation))
    }

    /// Ends a refresh that produced nothing; a failure is kept for the lease's waiters.
    mutating func end(_ held: RefreshLease, failure reason: String?) {
        if lease?.fence == held.fencingToken { lease = nil }
        if let reason { failure = Failure(fence: held.fencingToken, reason: String(reason.prefix(300))) }
    }

    /// Logs the session out until `until`, decided in session epoch `decided` (the latest the
    /// deciding process knew); never shortens a longer cooldown. A logout decided before the last
    /// sign-in (by a process that had not heard of it) changes nothing: that sign-in already
    /// ended the session it ended. Returns whether it changed the record.
    @discardableResult
    mutating func logout(until: Int64, epoch decided: UInt64) -> Bool {
        guard decided >= epoch, until > (loggedOutUntil ?? 0) else { return false }
        loggedOutUntil = until
        return true
    }

    /// A sign-in replaces the session, ends a cooldown and voids a refresh in progress.
    mutating func signIn(_ signedIn: Credentials) -> SharedSession {
        generation += 1
        epoch = generation
        credentials = signedIn
        lease = nil
        loggedOutUntil = nil
        return SharedSession(credentials: signedIn, generation: generation)
    }
}

/// The bounds a process puts on what it reads from a shared store (issue 23): a cooldown no
/// longer than the policy's own, a lease no longer than the process would grant. A forged or
/// corrupted record then costs at most what a real logout or a dead holder costs.
struct CoordinationBounds: Sendable, Equatable {
    /// The longest cooldown the policy allows (its `logout.cooldown`, or the longest of its scopes).
    var maxCooldown: Duration
    /// The longest a lease may last (the coordinator's `lease`).
    var maxLease: Duration

    /// `until` clamped to `now + maxCooldown`.
    func cooldown(until: Date, now: Date) -> Date {
        min(until, now.addingTimeInterval(maxCooldown.seconds))
    }

    /// A lease's remaining milliseconds clamped to `maxLease`.
    func leaseLeft(_ milliseconds: Int64) -> Int64 {
        min(max(0, milliseconds), maxLease.milliseconds())
    }
}
