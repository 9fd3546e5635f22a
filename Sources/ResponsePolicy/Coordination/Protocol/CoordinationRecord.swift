import Foundation

/// The lease protocol of fleet coordination, as a value over the one shared record every store
/// keeps: the generation, the credentials, the lease with its fencing token, the logout cooldown's
/// end, the last failed refresh, the token endpoint's `Retry-After` (its embargo) and the
/// generations `refresh.limit` counts (loops), with the newest generation a process saw accepted.
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
/// Fencing: every lease carries a token larger than every earlier one (`fence`), and larger than
/// every token the asking process has seen, so a store that lost its counter never hands out a
/// token again. A publication is stored when nobody published since its lease was granted (the
/// generation it started from is still the stored one, or the store is behind it): the token
/// endpoint issues one pair per refresh token, so the first publication from a generation holds
/// the newest pair, whether its lease still holds, lapsed or was forgotten by the store (issue
/// 30: a pair that arrives after a pause, a timeout or a freeze reaches the fleet). The lease
/// decides who may *present* the refresh token, never whose pair is kept.
///
/// A store may forget (a flush, an eviction, a restart with no persistence) or be put back to
/// an older state. Generations never go backwards: a process tells ``begin`` what it knows
/// (``Knowledge``: the newest generation it has seen or saved, the highest fencing token, a lease
/// it saw whose term has not ended), and a store behind that answers ``Begin/behind(stored:)``:
/// the process re-seeds it (``reseed(_:now:)``) from its newest pair and asks again. A re-seed
/// keeps what the store still holds when it is newer, puts back a lease the process saw in term,
/// or, when the process cannot vouch that it heard every lease granted within the last lease
/// length, a quarantine: a lease with fencing token 0 that nobody holds, for one lease length,
/// so a holder the store forgot (its token call at the server) publishes before anyone else
/// presents the same refresh token.
///
/// `Retry-After` and `refresh.limit` are fleet-wide (issue 29). A holder whose token call was
/// asked to wait ends its turn with that wait (``end(_:failure:retryAfter:now:)``): no lease is
/// granted before it ends, and every question is answered ``Begin/embargoed(untilMs:reason:)``
/// (bounded by ``longestEmbargoMs``: a forged or corrupted end delays refreshes no longer than
/// the token endpoint itself may). `refresh.limit` counts generations, not grants: a trigger on
/// the newest generation, made by a refresh (never the initial token or a sign-in's), whose
/// token the asking process saw refused and no process saw accepted (``accept(_:)``), counts
/// that generation once. A grant that ended without a pair made no generation, so it never
/// counts.
package struct CoordinationRecord: Sendable, Equatable {
    /// The lease held now.
    struct Lease: Sendable, Equatable {
        /// Its fencing token; 0 for a re-seed's quarantine (held by nobody).
        var fence: UInt64
        /// Who holds it (a process id for the file store; any number elsewhere). 0: unknown.
        var holder: Int64
        /// Its end, in milliseconds since 1970.
        var expires: Int64
        /// Which coordinator asked for it (a random number per coordinator; 0: unknown): a client
        /// that gave up on its question after the store granted it finds its own lease again.
        var asker: UInt64 = 0
    }

    /// The last refresh that failed, by its lease's fencing token.
    struct Failure: Sendable, Equatable {
        var fence: UInt64
        var reason: String
    }

    /// The token endpoint asked to wait (`Retry-After`) until `until` (ms since 1970): no lease
    /// before then. `reason`: the answer's reason, without a secret.
    struct Embargo: Sendable, Equatable {
        var until: Int64
        var reason: String
    }

    /// A generation `refresh.limit` counts (its token was refused before any response accepted
    /// it), and when that was found out (ms since 1970).
    struct Loop: Sendable, Equatable {
        var generation: UInt64
        var at: Int64
    }

    /// The longest embargo a store holds, from now: the longest `Retry-After` the engine obeys
    /// (``TokenAnswer/maxRequestedWait``). A longer one (forged, a clock far off) is cut to it.
    package static let longestEmbargoMs: Int64 = TokenAnswer.maxRequestedWait.milliseconds()

    /// What the process asking for a turn knows of the shared session (``CoordinationMemory``
    /// keeps it): nothing by default, which is how a store that forgets nothing is asked.
    package struct Knowledge: Sendable, Equatable {
        /// The newest generation the process has seen or saved: the store must not be behind it.
        package var generation: UInt64 = 0
        /// The highest fencing token the process has seen: a new grant goes past it.
        package var fence: UInt64 = 0
        /// A lease the process saw (another's) whose term has not ended by its own clock.
        package var lease: KnownLease?
        /// The process holds a pair (saved or shared): a store with no session at all forgot it,
        /// whatever the generation (a fleet still at generation 0 included).
        package var hasPair = false

        package init(generation: UInt64 = 0, fence: UInt64 = 0, lease: KnownLease? = nil, hasPair: Bool = false) {
            self.generation = generation
            self.fence = fence
            self.lease = lease
            self.hasPair = hasPair
        }
    }

    /// A lease as a process remembers it: its fencing token and what is left of its term.
    package struct KnownLease: Sendable, Equatable {
        package var fence: UInt64
        package var leftMs: Int64

        package init(fence: UInt64, leftMs: Int64) {
            self.fence = fence
            self.leftMs = leftMs
        }
    }

    /// What a re-seed puts back into a store that forgot (or holds an older session).
    package struct Seed: Sendable, Equatable {
        package var credentials: Credentials
        package var generation: UInt64
        /// The session epoch of those credentials (the generation of their sign-in).
        package var epoch: UInt64 = 0
        /// The highest fencing token the seeding process has seen.
        package var fence: UInt64 = 0
        /// The lease to put back unless one is held: one the process saw in term, or a quarantine
        /// (fencing token 0) for one lease length; nil for none (a first seed, or a process that
        /// heard every grant of the last lease length).
        package var lease: KnownLease?

        package init(
            credentials: Credentials, generation: UInt64, epoch: UInt64 = 0, fence: UInt64 = 0, lease: KnownLease? = nil
        ) {
            self.credentials = credentials
            self.generation = generation
            self.epoch = epoch
            self.fence = fence
            self.lease = lease
        }
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
    /// Lease grants recorded by earlier versions (ms); no longer counted, kept only so a record
    /// sealed by them still checks, and cleared by the next question that counts.
    var refreshes: [Int64] = []
    /// The token endpoint's `Retry-After`, given to a holder: no lease before it ends.
    var embargo: Embargo?
    /// The generations `refresh.limit` counts within its window, oldest first.
    var loops: [Loop] = []
    /// The newest generation a process saw a response accept: never counted by `refresh.limit`.
    var accepted: UInt64 = 0

    /// What a refresh trigger gets (``begin(failedGeneration:knows:leaseMs:limit:holder:now:isAlive:)``).
    enum Begin: Sendable, Equatable {
        /// Credentials newer than the failed ones are stored.
        case newer(SharedSession)
        /// Another holder refreshes now (fencing token 0: a re-seed's quarantine): wait (at most
        /// `leftMs`) for its publication.
        case wait(holder: UInt64, leftMs: Int64)
        /// This caller refreshes.
        case granted(RefreshLease)
        /// `refresh.limit` is used up across the fleet.
        case limited
        /// The token endpoint asked a holder to wait (`Retry-After`) until `untilMs`: no lease
        /// before then. The caller waits for it (or fails its requests past `refresh.timeout`
        /// with `reason`); never a logout.
        case embargoed(untilMs: Int64, reason: String)
        /// The store holds an older generation (`stored`) than the caller has seen or saved: it
        /// forgot, or was put back. The caller re-seeds it and asks again.
        case behind(stored: UInt64)
    }

    /// The session as shared, the cooldown only while it runs at `now`.
    func session(now: Int64) -> SharedSession {
        SharedSession(
            credentials: credentials, generation: generation,
            loggedOutUntil: loggedOutUntil.flatMap { $0 > now ? Date(milliseconds: $0) : nil }, epoch: epoch)
    }

    /// Whether anything is shared yet.
    var isEmpty: Bool { credentials == nil && loggedOutUntil == nil && generation == 0 }

    /// A process joins: seeds the record from its local credentials when nothing is shared, else
    /// returns what is shared (nil: it seeded, or nothing is shared at all).
    mutating func join(local: Credentials?, now: Int64) -> SharedSession? {
        join(seed: local.map { Seed(credentials: $0, generation: 0) }, now: now)
    }

    /// A process joins with what it saved (its credentials file's pair, generation and epoch):
    /// seeds the record when nothing is shared or what is shared is older than `seed` (a store
    /// that forgot, or an old copy put back: ``reseed(_:now:)``), else returns what is shared
    /// (nil: it seeded, or nothing is shared at all).
    mutating func join(seed: Seed?, now: Int64) -> SharedSession? {
        if let seed, credentials == nil || generation < seed.generation {
            reseed(seed, now: now)
            return nil
        }
        guard credentials != nil || (loggedOutUntil ?? 0) > now else { return nil }
        return session(now: now)
    }

    /// Puts `seed` back when the record holds no credentials or an older generation; returns
    /// whether it did. Generations never go backwards: a newer session stored is kept as it is.
    /// The fencing counter goes past every token the seeding process has seen; the epoch is the
    /// later of the two; a lease held in term is kept, else `seed.lease` is put in place (a lease
    /// the process saw, or a quarantine), so no process is granted a lease while a holder the
    /// store forgot may still publish.
    @discardableResult
    mutating func reseed(_ seed: Seed, now: Int64) -> Bool {
        guard credentials == nil || generation < seed.generation else { return false }
        credentials = seed.credentials
        generation = max(generation, seed.generation)
        epoch = min(max(epoch, seed.epoch), generation)
        fence = max(fence, seed.fence)
        if let known = seed.lease, known.leftMs > 0, !(lease.map { $0.expires > now } ?? false) {
            lease = Lease(fence: known.fence, holder: 0, expires: now + known.leftMs)
            fence = max(fence, known.fence)
        }
        return true
    }

    /// A refresh trigger for credentials of `failedGeneration`, from a process that `knows` what
    /// ``Knowledge`` says. `isAlive` tells whether a lease's holder still runs (the file store
    /// checks the pid; others answer `true`).
    mutating func begin(
        failedGeneration: UInt64, knows: Knowledge = Knowledge(), leaseMs: Int64, limit: (count: Int, perMs: Int64)?,
        holder: Int64, asker: UInt64 = 0, now: Int64, isAlive: (Int64) -> Bool = { _ in true }
    ) -> Begin {
        if generation < knows.generation || (credentials == nil && knows.hasPair) {
            return .behind(stored: generation)
        }
        if generation > failedGeneration { return .newer(session(now: now)) }
        // The trigger is evidence whoever refreshes: counted before any lease is looked at.
        let loop = limit.map {
            $0.count > 0 && countLoop(failedGeneration: failedGeneration, perMs: $0.perMs, now: now)
        }
        if let held = lease, held.expires > now, asker != 0, held.asker == asker, held.fence > 0 {
            // Its own lease, granted to a question whose answer it never got (its client gave up
            // after the store ran it): granted again, for what is left of it, rather than waited for.
            return .granted(RefreshLease(fencingToken: held.fence, generation: generation))
        }
        if var held = lease, held.expires > now, isAlive(held.holder) {
            // A lease longer than this process would grant is forged or from a misconfigured
            // peer: it is cut to one lease from now, so it delays refreshes no more than a dead holder.
            if held.expires - now > max(1, leaseMs) {
                held.expires = now + max(1, leaseMs)
                lease = held
            }
            return .wait(holder: held.fence, leftMs: held.expires - now)
        }
        // A lease the caller saw in term that the store no longer holds (forgotten, evicted): put
        // back and honoured, unless a later lease was granted since (the store then knew it ended).
        if let known = knows.lease, known.leftMs > 0, known.fence >= fence {
            let left = min(known.leftMs, max(1, leaseMs))
            lease = Lease(fence: known.fence, holder: 0, expires: now + left)
            fence = known.fence
            return .wait(holder: known.fence, leftMs: left)
        }
        if var held = embargo, held.until > now {
            // Longer than the engine obeys: forged, or a clock far off. Cut, so it delays
            // refreshes no longer than the token endpoint itself may.
            if held.until - now > Self.longestEmbargoMs {
                held.until = now + Self.longestEmbargoMs
                embargo = held
            }
            return .embargoed(untilMs: held.until, reason: held.reason)
        }
        if loop == true, let limit, loops.count >= limit.count { return .limited }
        fence = max(fence, knows.fence) + 1
        lease = Lease(fence: fence, holder: holder, expires: now + max(1, leaseMs), asker: asker)
        return .granted(RefreshLease(fencingToken: fence, generation: generation))
    }

    /// `refresh.limit`: the caller saw the token of `failedGeneration` refused (a refresh trigger
    /// that is no refresh ahead). Counts that generation once when it is the newest, a refresh
    /// made it (not the initial token, not a sign-in) and no process saw it accepted; drops
    /// loops older than the window. Returns whether the trigger is a loop (then the limit applies).
    private mutating func countLoop(failedGeneration: UInt64, perMs: Int64, now: Int64) -> Bool {
        refreshes = []
        loops.removeAll { $0.at <= now - perMs }
        guard failedGeneration == generation, generation > epoch, generation > accepted else { return false }
        if !loops.contains(where: { $0.generation == generation }) {
            loops.append(Loop(generation: generation, at: now))
        }
        return true
    }

    /// A process saw a response accept the token of `seen`: that generation is no loop, whether
    /// found out before or after. Returns whether it changed the record.
    @discardableResult
    mutating func accept(_ seen: UInt64) -> Bool {
        guard seen <= generation, seen > accepted || loops.contains(where: { $0.generation == seen }) else {
            return false
        }
        accepted = max(accepted, seen)
        loops.removeAll { $0.generation == seen }
        return true
    }

    /// What a waiter for lease `holder` finds now: a publication, the holder's failure, or nothing
    /// yet (nil: ask ``begin(failedGeneration:knows:leaseMs:limit:holder:now:isAlive:)`` again).
    func outcome(for holder: UInt64, failedGeneration: UInt64, now: Int64) -> RefreshTurn? {
        if generation > failedGeneration { return .published(session(now: now)) }
        if let failure, failure.fence == holder {
            // The holder was asked to wait (`Retry-After`): the waiter asks again, and is told how long.
            if let embargo, embargo.until > now { return nil }
            return .failedElsewhere(failure.reason)
        }
        return nil
    }

    /// The holder of `held` publishes what its refresh produced: stored when nobody published
    /// since the lease was granted (the stored generation is the one it started from, or older:
    /// the store forgot), whether the lease still holds or not (see the fencing rule above). The
    /// same pair published again (a retry after an answer lost on the way) is answered as stored.
    mutating func publish(_ fresh: Credentials, with held: RefreshLease, now: Int64) -> PublishResult {
        if generation > held.generation {
            if generation == held.generation + 1, credentials == fresh {
                return .published(SharedSession(credentials: fresh, generation: generation, epoch: epoch))
            }
            return .leaseLost(current: credentials == nil ? nil : session(now: now))
        }
        generation = held.generation + 1
        credentials = fresh
        // Any lease on the older generation is moot now; its holder's publication is refused.
        lease = nil
        return .published(SharedSession(credentials: fresh, generation: generation, epoch: epoch))
    }

    /// Ends a refresh that produced nothing; a failure is kept for the lease's waiters. With
    /// `retryAfter` (the end of the wait the token endpoint asked for, ms since 1970), no lease is
    /// granted before it ends (at most ``longestEmbargoMs`` from `now`; a longer one held is kept).
    mutating func end(_ held: RefreshLease, failure reason: String?, retryAfter: Int64? = nil, now: Int64 = 0) {
        if lease?.fence == held.fencingToken { lease = nil }
        if let reason { failure = Failure(fence: held.fencingToken, reason: String(reason.prefix(300))) }
        if let retryAfter, retryAfter > now {
            let until = min(retryAfter, now + Self.longestEmbargoMs)
            if until > (embargo.map { $0.until > now ? $0.until : 0 } ?? 0) {
                embargo = Embargo(
                    until: until, reason: String((reason ?? "the token endpoint asked to wait").prefix(300)))
            }
        }
    }

    /// Logs the session out until `until`, decided in session epoch `decided` (the epoch of the
    /// token the refused request was signed with); never shortens a longer cooldown. A logout
    /// decided before the last sign-in (by a process that had not heard of it, or on a request
    /// signed with the old session's token) changes nothing: that sign-in already ended the
    /// session it ended. Returns whether it changed the record.
    @discardableResult
    mutating func logout(until: Int64, epoch decided: UInt64) -> Bool {
        guard decided >= epoch, until > (loggedOutUntil ?? 0) else { return false }
        loggedOutUntil = until
        return true
    }

    /// A sign-in replaces the session, ends a cooldown and voids a refresh in progress. Its
    /// generation goes past `floor` too (the newest the signing process knows), so a store that
    /// forgot never numbers a sign-in below a generation the fleet has seen.
    mutating func signIn(_ signedIn: Credentials, after floor: UInt64 = 0) -> SharedSession {
        generation = max(generation, floor) + 1
        epoch = generation
        credentials = signedIn
        lease = nil
        loggedOutUntil = nil
        // The token endpoint answered the sign-in: a wait it asked for earlier is over.
        embargo = nil
        return SharedSession(credentials: signedIn, generation: generation, epoch: epoch)
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
