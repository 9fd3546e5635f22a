import Foundation

/// What one process remembers of the shared session, so that a store that forgets (FLUSHALL, an
/// eviction, a restart with no persistence, a failover to an empty replica) or is put back to an
/// older state never takes the fleet backwards (issue 30).
///
/// Why each process keeps it: a store that lost its data cannot say what it lost. Before this, an
/// unsigned fleet whose Redis was flushed granted a lease on the empty key at generation 0; the
/// holder published generation 1, which every process had already seen and ignored, and the next
/// holder presented a spent refresh token. Each process now remembers
/// - the newest session it has seen, saved or published (its pair, generation and epoch): the
///   store must not be behind it (``CoordinationRecord/Knowledge/generation``), and when it is,
///   this pair re-seeds it (``seed(now:leaseMs:)``);
/// - the highest fencing token it has seen: a grant goes past it, so a store whose counter was
///   lost never hands a token out twice;
/// - the latest lease another process was granted, as announced, with its end by this process's
///   clock: honoured for its whole term even if the store forgets it (put back by the next
///   question or re-seed);
/// - since when it has heard every announcement without a break (`listeningSince`): a process
///   that cannot vouch for the last lease length (it just started, or its subscription dropped)
///   re-seeds with a quarantine instead (a lease nobody holds, one lease long), because a holder
///   it never heard of may have its token call at the server.
///
/// Times are milliseconds on the process's own monotonic clock (the store's clock for the
/// in-memory store): a lease's end is the moment this process heard of the grant plus its
/// length, never earlier than the end the store keeps.
///
/// ```swift
/// var memory = CoordinationMemory()
/// memory.saw(session)                                       // a publication, a join, a save
/// memory.heardGrant(fence: 7, generation: 3, value: "7", leaseMs: 15_000, now: now)
/// record.begin(failedGeneration: 3, knows: memory.knowledge(now: now), …)
/// ```
///
/// Concurrency contract: a value; the coordinator keeps it behind its own lock.
package struct CoordinationMemory: Sendable, Equatable {
    /// A lease another process was granted, as heard.
    package struct HeardLease: Sendable, Equatable {
        package var fence: UInt64
        /// The generation it refreshes from: a publication past it ends it.
        package var generation: UInt64
        /// The value the store keeps for it (sealed under a key), to put back as it was.
        package var value: String
        /// Its end by this process's clock (ms).
        package var endsAt: Int64
    }

    /// The newest session seen, saved or published by this process.
    package private(set) var newest: SharedSession?
    /// The highest fencing token seen.
    package private(set) var fence: UInt64 = 0
    /// The latest session epoch known (the generation of the last sign-in heard of).
    package private(set) var epoch: UInt64 = 0
    /// The latest lease another process was granted whose end has not been heard.
    package private(set) var lease: HeardLease?
    /// Since when this process has heard every announcement without a break; nil while it is
    /// not listening.
    package private(set) var listeningSince: Int64?
    /// Whether this process has seen the store hold a session (read it, seeded it, published to
    /// it): a store that then holds none forgot it.
    package private(set) var sawSession = false

    package init() {}

    /// The newest generation known: the store must not be behind it.
    package var generation: UInt64 { newest?.generation ?? 0 }

    /// A session seen (a join, a publication heard, an answer), saved (the credentials file's) or
    /// published here. Kept when it is newer than the one known (or as new, with credentials
    /// where the known one had none); a publication past a heard lease's generation ends it.
    package mutating func saw(_ session: SharedSession) {
        epoch = max(epoch, min(session.epoch, session.generation))
        if let lease, session.generation > lease.generation { self.lease = nil }
        guard let known = newest else {
            newest = session
            return
        }
        if session.generation > known.generation
            || (session.generation == known.generation && known.credentials == nil && session.credentials != nil)
        {
            newest = session
            newest?.epoch = max(session.epoch, known.generation == session.generation ? known.epoch : 0)
        }
    }

    /// The store was seen holding a session (credentials).
    package mutating func sawStoreSession() { sawSession = true }

    /// A session epoch learned on its own (a refused logout's answer, an announcement).
    package mutating func sawEpoch(_ value: UInt64) { epoch = max(epoch, value) }

    /// A fencing token seen (a grant, a lease held, the counter).
    package mutating func sawFence(_ value: UInt64) { fence = max(fence, value) }

    /// Another process was granted lease `fence` on `generation` (its value as the store keeps
    /// it), `leaseMs` long, heard at `now`.
    package mutating func heardGrant(fence: UInt64, generation: UInt64, value: String, leaseMs: Int64, now: Int64) {
        sawFence(fence)
        guard generation >= self.generation || newest?.credentials == nil else { return }
        if let lease, lease.fence > fence, lease.endsAt > now { return }
        lease = HeardLease(fence: fence, generation: generation, value: value, endsAt: now + max(1, leaseMs))
    }

    /// Lease `fence` ended (its holder published, failed or gave it back).
    package mutating func heardEnd(fence: UInt64) {
        if lease?.fence == fence { lease = nil }
    }

    /// This process's own lease: past every token, and not one to honour as another's.
    package mutating func holds(fence: UInt64) {
        sawFence(fence)
        if lease?.fence == fence { lease = nil }
    }

    /// The subscription (or watch) is in place from `now`: every announcement from then on is heard.
    package mutating func listening(since now: Int64) {
        if listeningSince == nil { listeningSince = now }
    }

    /// The subscription dropped: announcements may be missed until it is back.
    package mutating func stoppedListening() { listeningSince = nil }

    /// Whether a session the store announced (or holds) is older than the newest this process
    /// knows: the store forgot, and was re-seeded by a process that missed what this one saw. This
    /// process then corrects it at once (re-seeds it with its newer pair), while the re-seed's
    /// quarantine keeps anyone from presenting the older pair's refresh token.
    package func isBehind(_ session: SharedSession) -> Bool {
        guard let newest, newest.credentials != nil else { return false }
        return session.generation < newest.generation
    }

    /// The heard lease when its term has not ended at `now`.
    package func leaseInTerm(now: Int64) -> HeardLease? {
        lease.flatMap { $0.endsAt > now ? $0 : nil }
    }

    /// What this process tells the store when it asks for a turn.
    package func knowledge(now: Int64) -> CoordinationRecord.Knowledge {
        CoordinationRecord.Knowledge(
            generation: generation, fence: fence,
            lease: leaseInTerm(now: now).map { .init(fence: $0.fence, leftMs: $0.endsAt - now) },
            hasPair: sawSession && newest?.credentials != nil)
    }

    /// Whether this process has heard every grant of the last `leaseMs`: then no lease the store
    /// may have forgotten is unknown to it.
    package func vouches(now: Int64, leaseMs: Int64) -> Bool {
        listeningSince.map { now - $0 >= leaseMs } ?? false
    }

    /// What this process would re-seed a store with: its newest pair, generation, epoch and fence,
    /// and the lease to put back (a heard one in term; else, unless it vouches, a quarantine:
    /// fencing token 0, `leaseMs` long). A process that has never seen the store hold a session
    /// and knows no generation takes an empty store for a new one (a fleet's first start: no
    /// quarantine); one that saw it hold a session, or knows a generation, takes it for a store
    /// that forgot. Nil without a pair.
    package func seed(now: Int64, leaseMs: Int64) -> CoordinationRecord.Seed? {
        guard let newest, let credentials = newest.credentials else { return nil }
        var lease: CoordinationRecord.KnownLease?
        if (sawSession || newest.generation > 0) && !vouches(now: now, leaseMs: leaseMs) {
            // It may have missed a grant, or a publication (its pair then newer than this one):
            // a whole lease, for that holder to publish and for a process that knows better to
            // correct the store (``CoordinationMemory/isBehind(_:)``), before anyone presents.
            let heardLeft = leaseInTerm(now: now).map { $0.endsAt - now } ?? 0
            lease = .init(fence: 0, leftMs: max(1, leaseMs, heardLeft))
        } else if let heard = leaseInTerm(now: now) {
            lease = .init(fence: heard.fence, leftMs: min(heard.endsAt - now, max(1, leaseMs)))
        }
        return CoordinationRecord.Seed(
            credentials: credentials, generation: newest.generation,
            epoch: min(max(newest.epoch, epoch), newest.generation),
            fence: fence,
            lease: lease)
    }
}

extension ContinuousClock.Instant {
    /// Milliseconds since an arbitrary fixed point of this process: the time base of a
    /// ``CoordinationMemory`` kept by a coordinator on the real clock.
    package var coordinationMilliseconds: Int64 {
        (self - Self.processStart).milliseconds(atLeast: 0)
    }

    private static let processStart = ContinuousClock.now
}
