import Foundation
import TestSupport
import Testing

@testable import ResponsePolicy
@testable import ResponsePolicyRedis

/// Redis's Lua scripts, case for case against ``CoordinationRecord`` (the value the in-memory and
/// file stores run): from one shared state, an operation gives the same answer and leaves the same
/// state in Redis as in the value. A table of cases (every branch of each script) and seeded random
/// sequences of operations, on a `redis-server` of the test's own.
///
/// How Redis keeps the record (see ``RedisSessionCoordinator``): `gen`/`creds`/`epoch` in the session hash,
/// the fencing counter, the lease as a key with a TTL, the cooldown's end as a key with a TTL, the
/// grants in a sorted set. Redis keeps no holder id and no failure (a failure is published), and a
/// lapsed lease or cooldown is gone rather than kept: states are compared as Redis can hold them.
/// Redis reads its own clock (`PTTL`, `TIME`), a few milliseconds after the test's: times are
/// compared within `tolerance`, far above that gap on a quiet machine (a few ms) and far below the
/// differences the cases tell apart (a 15 s lease from a 120 s one, 10 s and more between times).
@Suite(.enabled(if: RedisServerFixture.isInstalled, "needs redis-server: apt-get install redis-server"))
struct RedisScriptConformanceTests {
    static let tolerance: Int64 = 5_000

    // MARK: - The table

    struct Case: Sendable, CustomTestStringConvertible {
        let name: String
        let state: @Sendable (Int64) -> CoordinationRecord
        let operation: @Sendable (Int64) -> Operation
        var testDescription: String { name }
    }

    static let cases: [Case] = [
        Case(name: "join: an empty store is seeded from the local credentials", state: { _ in .init() }) { _ in
            .join(local: creds("local"))
        },
        Case(name: "join: an empty store and no local credentials share nothing", state: { _ in .init() }) { _ in
            .join(local: nil)
        },
        Case(name: "join: shared credentials win over the local ones", state: { _ in record(gen: 3) }) { _ in
            .join(local: creds("local"))
        },
        Case(
            name: "join: a running cooldown is shared even without credentials",
            state: { now in record(gen: 0, credentials: nil, loggedOutUntil: now + 30_000) }
        ) { _ in .join(local: nil) },
        Case(
            name: "join: a cooldown without credentials is seeded from the local ones",
            state: { now in record(gen: 0, credentials: nil, loggedOutUntil: now + 30_000) }
        ) { _ in .join(local: creds("local")) },
        Case(
            name: "begin: newer credentials stored (with a cooldown) are returned",
            state: { now in record(gen: 4, loggedOutUntil: now + 20_000) }
        ) { _ in .begin(failedGeneration: 3, leaseMs: 15_000, limit: nil) },
        Case(name: "begin: nobody holds the lease: granted", state: { _ in record(gen: 2, fence: 5) }) { _ in
            .begin(failedGeneration: 2, leaseMs: 15_000, limit: nil)
        },
        Case(
            name: "begin: another holder: wait for what is left of its lease",
            state: { now in record(gen: 2, fence: 5, lease: (5, now + 8_000)) }
        ) { _ in .begin(failedGeneration: 2, leaseMs: 15_000, limit: nil) },
        Case(
            name: "begin: a lease longer than this process grants is cut to one lease",
            state: { now in record(gen: 2, fence: 5, lease: (5, now + 120_000)) }
        ) { _ in .begin(failedGeneration: 2, leaseMs: 15_000, limit: nil) },
        Case(
            name: "begin: a lapsed lease: granted with a larger fencing token",
            state: { now in record(gen: 2, fence: 5, lease: (5, now - 1_000)) }
        ) { _ in .begin(failedGeneration: 2, leaseMs: 15_000, limit: nil) },
        Case(
            name: "begin: refresh.limit used up across the fleet (this generation is the second loop)",
            state: { now in record(gen: 2, fence: 5, loops: [(1, now - 20_000)]) }
        ) { _ in .begin(failedGeneration: 2, leaseMs: 15_000, limit: (2, 60_000)) },
        Case(
            name: "begin: a generation already counted is counted once",
            state: { now in record(gen: 2, fence: 5, loops: [(2, now - 20_000)]) }
        ) { _ in .begin(failedGeneration: 2, leaseMs: 15_000, limit: (2, 60_000)) },
        Case(
            name: "begin: loops older than the window no longer count",
            state: { now in record(gen: 3, fence: 5, loops: [(1, now - 200_000), (2, now - 150_000)]) }
        ) { _ in .begin(failedGeneration: 3, leaseMs: 15_000, limit: (2, 60_000)) },
        Case(
            name: "begin: a generation a process saw accepted is no loop",
            state: { now in record(gen: 2, fence: 5, loops: [(1, now - 20_000)], accepted: 2) }
        ) { _ in .begin(failedGeneration: 2, leaseMs: 15_000, limit: (2, 60_000)) },
        Case(
            name: "begin: a sign-in's token is no loop",
            state: { now in record(gen: 2, fence: 5, loops: [(1, now - 20_000)], epoch: 2) }
        ) { _ in .begin(failedGeneration: 2, leaseMs: 15_000, limit: (1, 60_000)) },
        Case(
            name: "begin: the trigger counts even while another holds the lease",
            state: { now in record(gen: 2, fence: 5, lease: (5, now + 8_000)) }
        ) { _ in .begin(failedGeneration: 2, leaseMs: 15_000, limit: (3, 60_000)) },
        Case(
            name: "accept: a counted loop is dropped and the generation recorded",
            state: { now in record(gen: 3, fence: 5, loops: [(2, now - 9_000), (3, now - 1_000)]) }
        ) { _ in .accept(3) },
        Case(
            name: "accept: a generation Redis does not hold changes nothing",
            state: { now in record(gen: 3, fence: 5, loops: [(3, now - 1_000)]) }
        ) { _ in .accept(4) },
        Case(
            name: "end: the token endpoint's Retry-After is kept, and no lease is granted before it ends",
            state: { now in record(gen: 2, fence: 5, lease: (5, now + 8_000)) }
        ) { now in .end(RefreshLease(fencingToken: 5, generation: 2), failure: "HTTP 429", retryAfter: now + 30_000) },
        Case(
            name: "end: a shorter Retry-After never shortens a longer one",
            state: { now in record(gen: 2, fence: 5, embargo: (now + 60_000, "first")) }
        ) { now in .end(RefreshLease(fencingToken: 5, generation: 2), failure: "second", retryAfter: now + 30_000) },
        Case(
            name: "begin: a Retry-After running: no lease, its end and reason",
            state: { now in record(gen: 2, fence: 5, embargo: (now + 30_000, "HTTP 429")) }
        ) { _ in .begin(failedGeneration: 2, leaseMs: 15_000, limit: nil) },
        Case(
            name: "begin: a Retry-After over: granted",
            state: { now in record(gen: 2, fence: 5, embargo: (now - 1_000, "HTTP 429")) }
        ) { _ in .begin(failedGeneration: 2, leaseMs: 15_000, limit: nil) },
        Case(
            name: "begin: a Retry-After far ahead (forged) is cut to the longest the engine obeys",
            state: { now in record(gen: 2, fence: 5, embargo: (now + 400 * 86_400_000, "forged")) }
        ) { _ in .begin(failedGeneration: 2, leaseMs: 15_000, limit: nil) },
        Case(
            name: "begin: newer credentials are answered whatever the Retry-After",
            state: { now in record(gen: 3, fence: 5, embargo: (now + 30_000, "HTTP 429")) }
        ) { _ in .begin(failedGeneration: 2, leaseMs: 15_000, limit: nil) },
        Case(
            name: "signIn: ends a Retry-After",
            state: { now in record(gen: 2, fence: 5, embargo: (now + 30_000, "HTTP 429")) }
        ) { _ in .signIn(creds("signed-in")) },
        Case(
            name: "publish: the lease holds: stored with the next generation",
            state: { now in record(gen: 2, fence: 5, lease: (5, now + 8_000)) }
        ) { _ in .publish(creds("fresh"), RefreshLease(fencingToken: 5, generation: 2)) },
        Case(
            name: "publish: lapsed, nobody granted or published since: kept (invariant f)",
            state: { now in record(gen: 2, fence: 5, lease: (5, now - 500)) }
        ) { _ in .publish(creds("late"), RefreshLease(fencingToken: 5, generation: 2)) },
        Case(
            name: "publish: lapsed and another lease granted since, nobody published: stored, the lease dropped",
            state: { now in record(gen: 2, fence: 6, lease: (6, now + 8_000)) }
        ) { _ in .publish(creds("late"), RefreshLease(fencingToken: 5, generation: 2)) },
        Case(
            name: "publish: lapsed and a lease granted and ended since: stored",
            state: { _ in record(gen: 2, fence: 6) }
        ) { _ in .publish(creds("late"), RefreshLease(fencingToken: 5, generation: 2)) },
        Case(
            name: "publish: another publication since: refused with it",
            state: { _ in record(gen: 3, fence: 6) }
        ) { _ in .publish(creds("stale"), RefreshLease(fencingToken: 5, generation: 2)) },
        Case(
            name: "publish: the same pair again (its answer was lost): answered as stored",
            state: { _ in record(gen: 3, credentials: creds("again"), fence: 5, epoch: 1) }
        ) { _ in .publish(creds("again"), RefreshLease(fencingToken: 5, generation: 2)) },
        Case(
            name: "publish: Redis forgot and was re-seeded older: stored past the lease's generation",
            state: { now in record(gen: 1, fence: 2, lease: (0, now + 8_000)) }
        ) { _ in .publish(creds("held"), RefreshLease(fencingToken: 7, generation: 3)) },
        Case(
            name: "begin: Redis is behind what the process knows: behind, nothing granted",
            state: { _ in record(gen: 2, fence: 5) }
        ) { _ in .begin(failedGeneration: 2, leaseMs: 15_000, limit: nil, knows: .init(generation: 5, fence: 9)) },
        Case(
            name: "begin: a process that holds a pair finds no session (a flush at generation 0): behind",
            state: { _ in .init() }
        ) { _ in .begin(failedGeneration: 0, leaseMs: 15_000, limit: nil, knows: .init(hasPair: true)) },
        Case(
            name: "begin: an empty Redis and a process that knows a generation: behind",
            state: { _ in .init() }
        ) { _ in .begin(failedGeneration: 4, leaseMs: 15_000, limit: nil, knows: .init(generation: 4)) },
        Case(
            name: "begin: a lease the process saw, forgotten by Redis: put back and waited for",
            state: { _ in record(gen: 2, fence: 5) }
        ) { _ in
            .begin(
                failedGeneration: 2, leaseMs: 15_000, limit: nil,
                knows: .init(generation: 2, fence: 7, lease: .init(fence: 7, leftMs: 9_000)))
        },
        Case(
            name: "begin: a lease the process saw, ended since (a later one was granted): granted",
            state: { _ in record(gen: 2, fence: 8) }
        ) { _ in
            .begin(
                failedGeneration: 2, leaseMs: 15_000, limit: nil,
                knows: .init(generation: 2, fence: 7, lease: .init(fence: 7, leftMs: 9_000)))
        },
        Case(
            name: "begin: granted past the highest fencing token the process has seen",
            state: { _ in record(gen: 2, fence: 3) }
        ) { _ in .begin(failedGeneration: 2, leaseMs: 15_000, limit: nil, knows: .init(generation: 2, fence: 40)) },
        Case(
            name: "reseed: an empty Redis gets the pair, its epoch, the fence and a quarantine",
            state: { _ in .init() }
        ) { _ in
            .reseed(
                .init(
                    credentials: creds("newest"), generation: 6, epoch: 4, fence: 11,
                    lease: .init(fence: 0, leftMs: 15_000)))
        },
        Case(
            name: "reseed: an older session is replaced, the lease heard of put back",
            state: { _ in record(gen: 2, fence: 3, epoch: 1) }
        ) { _ in
            .reseed(
                .init(
                    credentials: creds("newest"), generation: 6, epoch: 4, fence: 11,
                    lease: .init(fence: 11, leftMs: 7_000)))
        },
        Case(
            name: "reseed: a newer session is kept",
            state: { _ in record(gen: 9, fence: 3, epoch: 8) }
        ) { _ in .reseed(.init(credentials: creds("older"), generation: 6, epoch: 4, fence: 11)) },
        Case(
            name: "reseed: a lease held is kept rather than the quarantine",
            state: { now in record(gen: 2, credentials: nil, fence: 3, lease: (3, now + 8_000)) }
        ) { _ in
            .reseed(
                .init(credentials: creds("newest"), generation: 6, fence: 1, lease: .init(fence: 0, leftMs: 15_000)))
        },
        Case(name: "signIn: numbered past what the process knows", state: { _ in record(gen: 2) }) { _ in
            .signIn(creds("signed-in"), after: 6)
        },
        Case(
            name: "publish: a sign-in since (the generation moved): refused",
            state: { now in record(gen: 3, fence: 5, loggedOutUntil: now + 9_000) }
        ) { _ in .publish(creds("stale"), RefreshLease(fencingToken: 5, generation: 2)) },
        Case(
            name: "publish: refused on an empty store",
            state: { _ in record(gen: 0, credentials: nil, fence: 1) }
        ) { _ in .publish(creds("stale"), RefreshLease(fencingToken: 1, generation: 1)) },
        Case(
            name: "end: the holder's own lease is released",
            state: { now in record(gen: 2, fence: 5, lease: (5, now + 8_000)) }
        ) { _ in .end(RefreshLease(fencingToken: 5, generation: 2), failure: "invalid_grant") },
        Case(
            name: "end: another holder's lease is kept",
            state: { now in record(gen: 2, fence: 6, lease: (6, now + 8_000)) }
        ) { _ in .end(RefreshLease(fencingToken: 5, generation: 2), failure: nil) },
        Case(name: "logout: starts a cooldown", state: { _ in record(gen: 2) }) { now in
            .logout(until: now + 30_000, epoch: 0)
        },
        Case(
            name: "logout: never shortens a longer cooldown",
            state: { now in record(gen: 2, loggedOutUntil: now + 60_000) }
        ) { now in .logout(until: now + 30_000, epoch: 0) },
        Case(
            name: "logout: a cooldown that is over is replaced",
            state: { now in record(gen: 2, loggedOutUntil: now - 5_000) }
        ) { now in .logout(until: now + 30_000, epoch: 0) },
        Case(
            name: "logout: decided in the current session epoch: starts a cooldown",
            state: { _ in record(gen: 4, epoch: 3) }
        ) { now in .logout(until: now + 30_000, epoch: 3) },
        Case(
            name: "logout: decided before the last sign-in: stores nothing",
            state: { _ in record(gen: 4, epoch: 3) }
        ) { now in .logout(until: now + 30_000, epoch: 2) },
        Case(
            name: "logout: decided before the last sign-in: keeps a running cooldown as it is",
            state: { now in record(gen: 4, loggedOutUntil: now + 10_000, epoch: 3) }
        ) { now in .logout(until: now + 30_000, epoch: 1) },
        Case(
            name: "signIn: replaces the session, ends the cooldown, voids the lease",
            state: { now in record(gen: 2, fence: 5, lease: (5, now + 8_000), loggedOutUntil: now + 30_000) }
        ) { _ in .signIn(creds("signed-in")) },
        Case(name: "signIn: on an empty store", state: { _ in .init() }) { _ in .signIn(creds("first")) },
    ]

    @Test(arguments: cases)
    func theScriptAnswersAndStoresWhatTheValueDoes(_ testCase: Case) throws {
        let server = try RedisServerFixture()
        defer { server.kill() }
        let redis = try ScriptedRecord(server, key: "case")
        let now = try redis.now()
        let start = testCase.state(now)
        try redis.store(start, now: now)
        var value = start
        let operation = testCase.operation(now)
        let expected = value.apply(operation, now: now)
        let answer = try redis.apply(operation, now: now)
        let stored = try redis.load()
        Self.expectSame(expected, answer, testCase.name)
        Self.expectSame(value, stored, now: try redis.now(), testCase.name)
    }

    // MARK: - Random sequences

    /// Seeded random operations from a random fleet's point of view (stale and current
    /// generations, current and stale leases, leases and cooldowns that lapse), applied to the
    /// value and to Redis alike: after every step the answers and the states agree.
    @Test(arguments: [1, 2, 3, 4] as [UInt64])
    func randomSequencesLeaveRedisAndTheValueInOneState(seed: UInt64) throws {
        let server = try RedisServerFixture()
        defer { server.kill() }
        let redis = try ScriptedRecord(server, key: "random-\(seed)")
        var random = SeededGenerator(seed: seed)
        var value = CoordinationRecord()
        var leases: [RefreshLease] = []
        // The newest generation any process has seen (Redis may have forgotten it).
        var seen: UInt64 = 0
        var (behind, reseeded, waits) = (0, 0, 0)
        for step in 0..<240 {
            let now = try redis.now()
            let operation: Operation
            switch Int.random(in: 0..<23, using: &random) {
            case 0..<2: operation = .join(local: Bool.random(using: &random) ? creds("local-\(step)") : nil)
            case 2..<8:
                let failed = value.generation &- UInt64.random(in: 0...1, using: &random)
                let limit: (Int, Int64)? =
                    Bool.random(using: &random) ? (Int.random(in: 1...4, using: &random), 60_000) : nil
                // What the asking process knows: nothing, the stored generation, or more (Redis forgot).
                var knows = CoordinationRecord.Knowledge()
                if value.generation < seen || Bool.random(using: &random) {
                    let newest = max(seen, value.generation)
                    knows.generation = newest - min(newest, UInt64.random(in: 0...1, using: &random))
                    knows.fence = value.fence + UInt64.random(in: 0...3, using: &random)
                    knows.hasPair = Bool.random(using: &random)
                    if let heard = leases.last, Int.random(in: 0..<3, using: &random) == 0 {
                        let left = Int64.random(in: 1_000...14_000, using: &random)
                        knows.lease = .init(fence: heard.fencingToken, leftMs: left)
                    }
                }
                // Sometimes the asker of the lease held (its question's answer was lost: granted again).
                let asker = [0, 5, 6].randomElement(using: &random) ?? 0
                operation = .begin(
                    failedGeneration: value.generation == 0 ? 0 : failed, leaseMs: 15_000, limit: limit, knows: knows,
                    asker: UInt64(asker))
            case 8..<12:
                guard let lease = leases.randomElement(using: &random) else { continue }
                operation = .publish(creds("pair-\(step)"), lease)
            case 12..<14:
                guard let lease = leases.randomElement(using: &random) else { continue }
                // Sometimes the token endpoint asked to wait (Retry-After), a little or a lot.
                let retryAfter: Int64? =
                    Int.random(in: 0..<4, using: &random) == 0
                    ? now + Int64.random(in: 1_000...40_000, using: &random) : nil
                operation = .end(
                    lease, failure: Bool.random(using: &random) ? "failed \(step)" : nil, retryAfter: retryAfter)
            case 21:
                // A process saw the newest generation (or the one before) accepted.
                operation = .accept(value.generation &- min(value.generation, UInt64.random(in: 0...1, using: &random)))
            case 14..<16:
                // Decided in the current session epoch, or (a process that missed a sign-in) the one before.
                let epoch = value.epoch &- min(value.epoch, UInt64.random(in: 0...1, using: &random))
                operation = .logout(until: now + Int64.random(in: 10_000...90_000, using: &random), epoch: epoch)
            case 16: operation = .signIn(creds("sign-in-\(step)"), after: Bool.random(using: &random) ? seen : 0)
            case 19:
                // Redis forgets everything (FLUSHALL); the fleet has seen `seen`.
                value = CoordinationRecord()
                _ = try redis.call(["FLUSHALL"])
                continue
            case 20:
                let fence = Bool.random(using: &random) ? 0 : value.fence
                let lease: CoordinationRecord.KnownLease? =
                    Bool.random(using: &random) ? .init(fence: fence, leftMs: 9_000) : nil
                operation = .reseed(
                    .init(
                        credentials: creds("reseed-\(step)"),
                        generation: seen - min(seen, UInt64.random(in: 0...1, using: &random)),
                        epoch: min(value.epoch, seen), fence: value.fence, lease: lease))
            case 17..<19:
                // Time passes beyond the lease: its holder died, or is slow.
                if value.lease != nil { value.lease?.expires = now - 1 } else { continue }
                _ = try redis.call(["DEL", redis.keys.lease])
                _ = try redis.call(["HDEL", redis.keys.session, "lease", "lease-until"])
                continue
            case 22:
                // Time passes beyond a Retry-After.
                if value.embargo != nil { value.embargo?.until = now - 1 } else { continue }
                _ = try redis.call(["HSET", redis.keys.session, "retry-after", String(now - 1)])
                continue
            default:
                // The cooldown ends.
                if value.loggedOutUntil != nil { value.loggedOutUntil = now - 1 } else { continue }
                _ = try redis.call(["DEL", redis.keys.logout])
                continue
            }
            let expected = value.apply(operation, now: now)
            let answer = try redis.apply(operation, now: now)
            if case .begin(.granted(let lease)) = expected { leases.append(lease) }
            if case .begin(.behind) = expected { behind += 1 }
            if case .reseeded = expected { reseeded += 1 }
            if case .begin(.wait) = expected { waits += 1 }
            seen = max(seen, value.generation)
            let label = "seed \(seed) step \(step): \(operation)"
            Self.expectSame(expected, answer, label)
            let stored = try redis.load()
            Self.expectSame(value, stored, now: try redis.now(), label)
            // Continue from what Redis holds (its clock decided the times), so drift never adds up.
            value = Self.merged(value, stored)
        }
        // The paths of a Redis that forgot were taken, so they were compared.
        #expect(
            behind > 0 && reseeded > 0 && waits > 0,
            "seed \(seed): \(behind) behind, \(reseeded) re-seeds asked, \(waits) waits")
    }

    // MARK: - Comparing

    static func expectSame(
        _ expected: Answer, _ answer: Answer, _ label: String, sourceLocation: SourceLocation = #_sourceLocation
    ) {
        switch (expected, answer) {
        case (.begin(.wait(let holder, let left)), .begin(.wait(let redisHolder, let redisLeft))):
            #expect(holder == redisHolder, "\(label)", sourceLocation: sourceLocation)
            #expect(
                abs(left - redisLeft) <= tolerance, "\(label): \(left) vs \(redisLeft)", sourceLocation: sourceLocation)
        case (.begin(.embargoed(let until, let why)), .begin(.embargoed(let redisUntil, let redisWhy))):
            // (A cut end is measured from each one's clock.)
            #expect(why == redisWhy, "\(label)", sourceLocation: sourceLocation)
            #expect(
                abs(until - redisUntil) <= tolerance, "\(label): \(until) vs \(redisUntil)",
                sourceLocation: sourceLocation)
        case (.publish(.leaseLost(let current)), .publish(.leaseLost(let redisCurrent))):
            // Redis answers a refused publication from the session hash alone (no cooldown).
            var current = current
            current?.loggedOutUntil = nil
            #expect(current == redisCurrent, "\(label)", sourceLocation: sourceLocation)
        default:
            #expect(expected == answer, "\(label)", sourceLocation: sourceLocation)
        }
    }

    static func expectSame(
        _ value: CoordinationRecord, _ stored: CoordinationRecord, now: Int64, _ label: String,
        sourceLocation: SourceLocation = #_sourceLocation
    ) {
        #expect(value.generation == stored.generation, "\(label): generation", sourceLocation: sourceLocation)
        #expect(value.credentials == stored.credentials, "\(label): credentials", sourceLocation: sourceLocation)
        #expect(value.fence == stored.fence, "\(label): fencing counter", sourceLocation: sourceLocation)
        #expect(value.epoch == stored.epoch, "\(label): session epoch", sourceLocation: sourceLocation)
        let lease = value.lease.flatMap { $0.expires > now ? $0 : nil }
        #expect(lease?.fence == stored.lease?.fence, "\(label): lease", sourceLocation: sourceLocation)
        if let lease, let held = stored.lease {
            #expect(
                abs(lease.expires - held.expires) <= tolerance, "\(label): lease end", sourceLocation: sourceLocation)
        }
        let cooldown = value.loggedOutUntil.flatMap { $0 > now ? $0 : nil }
        #expect(cooldown == stored.loggedOutUntil, "\(label): cooldown", sourceLocation: sourceLocation)
        #expect(
            value.loops.map(\.generation).sorted() == stored.loops.map(\.generation).sorted(), "\(label): loops",
            sourceLocation: sourceLocation)
        for (a, b) in zip(
            value.loops.sorted { $0.generation < $1.generation }, stored.loops.sorted { $0.generation < $1.generation })
        {
            #expect(abs(a.at - b.at) <= tolerance, "\(label): loop times", sourceLocation: sourceLocation)
        }
        #expect(value.accepted == stored.accepted, "\(label): accepted", sourceLocation: sourceLocation)
        let embargo = value.embargo.flatMap { $0.until > now ? $0 : nil }
        let held = stored.embargo.flatMap { $0.until > now ? $0 : nil }
        #expect(embargo?.reason == held?.reason, "\(label): Retry-After", sourceLocation: sourceLocation)
        #expect(
            abs((embargo?.until ?? 0) - (held?.until ?? 0)) <= tolerance, "\(label): Retry-After end",
            sourceLocation: sourceLocation)
    }

    /// The value with Redis's times (lease end, grants) and Redis's forgetting of what lapsed.
    static func merged(_ value: CoordinationRecord, _ stored: CoordinationRecord) -> CoordinationRecord {
        var next = value
        next.lease = stored.lease
        next.loggedOutUntil = stored.loggedOutUntil
        next.loops = stored.loops
        next.embargo = stored.embargo
        return next
    }
}

// MARK: - Operations on the value and on Redis

enum Operation: Sendable, CustomStringConvertible {
    case join(local: Credentials?)
    case begin(
        failedGeneration: UInt64, leaseMs: Int64, limit: (count: Int, perMs: Int64)?,
        knows: CoordinationRecord.Knowledge = .init(), asker: UInt64 = 0)
    case reseed(CoordinationRecord.Seed)
    case publish(Credentials, RefreshLease)
    case end(RefreshLease, failure: String?, retryAfter: Int64? = nil)
    case accept(UInt64)
    case logout(until: Int64, epoch: UInt64)
    case signIn(Credentials, after: UInt64 = 0)

    var description: String {
        switch self {
        case .join(let local): return "join(local: \(local?.accessToken ?? "nil"))"
        case .begin(let failed, let leaseMs, let limit, let knows, let asker):
            return
                "begin(failed: \(failed), lease: \(leaseMs), limit: \(limit.map { "\($0.count)/\($0.perMs)" } ?? "-"), asker \(asker), "
                + "knows: gen \(knows.generation) fence \(knows.fence) lease \(knows.lease.map { "\($0.fence)/\($0.leftMs)" } ?? "-"))"
        case .reseed(let seed):
            return "reseed(\(seed.credentials.accessToken) at \(seed.generation), epoch \(seed.epoch), "
                + "fence \(seed.fence), "
                + "lease \(seed.lease.map { "\($0.fence)/\($0.leftMs)" } ?? "-"))"
        case .publish(let credentials, let lease):
            return "publish(\(credentials.accessToken), fence \(lease.fencingToken), gen \(lease.generation))"
        case .end(let lease, let failure, let retryAfter):
            return
                "end(fence \(lease.fencingToken), failure: \(failure ?? "nil"), retry-after: \(retryAfter.map(String.init) ?? "-"))"
        case .accept(let generation): return "accept(\(generation))"
        case .logout(let until, let epoch): return "logout(until: \(until), epoch: \(epoch))"
        case .signIn(let credentials, let floor): return "signIn(\(credentials.accessToken), after: \(floor))"
        }
    }
}

enum Answer: Equatable {
    case joined(SharedSession?)
    case reseeded(Bool)
    case begin(CoordinationRecord.Begin)
    case publish(PublishResult)
    case done
    case accepted(Bool)
    case signedIn(SharedSession)
}

extension CoordinationRecord {
    mutating func apply(_ operation: Operation, now: Int64) -> Answer {
        switch operation {
        case .join(let local): return .joined(join(local: local, now: now))
        case .begin(let failed, let leaseMs, let limit, let knows, let asker):
            return .begin(
                begin(
                    failedGeneration: failed, knows: knows, leaseMs: leaseMs, limit: limit, holder: 7, asker: asker,
                    now: now))
        case .reseed(let seed): return .reseeded(reseed(seed, now: now))
        case .publish(let credentials, let lease): return .publish(publish(credentials, with: lease, now: now))
        case .end(let lease, let failure, let retryAfter):
            end(lease, failure: failure, retryAfter: retryAfter, now: now)
            return .done
        case .accept(let generation): return .accepted(accept(generation))
        case .logout(let until, let epoch):
            logout(until: until, epoch: epoch)
            return .done
        case .signIn(let credentials, let floor): return .signedIn(signIn(credentials, after: floor))
        }
    }
}

/// The record as Redis keeps it, driven through the coordinator's scripts with the arguments
/// their documentation names (``RedisSessionCoordinator``'s `…Script`s).
final class ScriptedRecord {
    let connection: RedisConnection
    let keys: RedisSessionCoordinator.Keys

    init(_ server: RedisServerFixture, key: String) throws {
        guard case .success(let endpoint) = RedisEndpoint.parse(server.url) else { throw FixtureError("bad url") }
        connection = try RedisConnection(endpoint, password: nil, timeout: .seconds(5))
        keys = RedisSessionCoordinator.Keys(key)
    }

    @discardableResult
    func call(_ arguments: [String]) throws -> RedisReply {
        let reply = try connection.command(arguments)
        if case .error(let message) = reply { throw FixtureError("\(arguments.prefix(2)): \(message)") }
        return reply
    }

    /// Redis's clock, in ms since 1970.
    func now() throws -> Int64 {
        let items = try call(["TIME"]).items
        return (items.first?.integer ?? 0) * 1000 + (items.count > 1 ? (items[1].integer ?? 0) / 1000 : 0)
    }

    func store(_ record: CoordinationRecord, now: Int64) throws {
        try call(["DEL", keys.session, keys.lease, keys.fence, keys.logout, keys.loops])
        if record.generation > 0 || record.credentials != nil {
            var arguments = ["HSET", keys.session, "gen", String(record.generation)]
            if let credentials = record.credentials {
                arguments += ["creds", SharedCredentialsCodec.encode(credentials)]
            }
            try call(arguments)
        }
        if record.epoch > 0 { try call(["HSET", keys.session, "epoch", String(record.epoch)]) }
        if record.fence > 0 { try call(["SET", keys.fence, String(record.fence)]) }
        if let lease = record.lease, lease.expires > now {
            try call(["SET", keys.lease, String(lease.fence), "PX", String(lease.expires - now)])
        }
        if let until = record.loggedOutUntil, until > now {
            try call(["SET", keys.logout, String(until), "PX", String(until - now)])
        }
        for loop in record.loops { try call(["ZADD", keys.loops, String(loop.at), String(loop.generation)]) }
        if record.accepted > 0 { try call(["HSET", keys.session, "accepted", String(record.accepted)]) }
        if let embargo = record.embargo {
            try call(["HSET", keys.session, "retry-after", String(embargo.until), "retry-after-why", embargo.reason])
        }
    }

    func load() throws -> CoordinationRecord {
        var record = CoordinationRecord()
        let now = try self.now()
        record.generation = UInt64(try call(["HGET", keys.session, "gen"]).integer ?? 0)
        record.credentials = try call(["HGET", keys.session, "creds"]).text.flatMap {
            SharedCredentialsCodec.decode($0)
        }
        record.fence = UInt64(try call(["GET", keys.fence]).integer ?? 0)
        record.epoch = UInt64(try call(["HGET", keys.session, "epoch"]).integer ?? 0)
        if let fence = try call(["GET", keys.lease]).integer {
            let left = try call(["PTTL", keys.lease]).integer ?? 0
            let asker = UInt64(try call(["HGET", keys.session, "lease-asker"]).integer ?? 0)
            record.lease = .init(fence: UInt64(fence), holder: 0, expires: now + left, asker: asker)
        }
        record.loggedOutUntil = try call(["GET", keys.logout]).integer
        let scored = try call(["ZRANGE", keys.loops, "0", "-1", "WITHSCORES"]).items
        record.loops = stride(from: 1, to: scored.count, by: 2).compactMap { index in
            guard let generation = scored[index - 1].text.flatMap({ UInt64($0) }), let at = scored[index].integer
            else { return nil }
            return .init(generation: generation, at: at)
        }
        record.accepted = UInt64(try call(["HGET", keys.session, "accepted"]).integer ?? 0)
        if let until = try call(["HGET", keys.session, "retry-after"]).integer {
            record.embargo = .init(
                until: until, reason: try call(["HGET", keys.session, "retry-after-why"]).text ?? "")
        }
        return record
    }

    func apply(_ operation: Operation, now: Int64) throws -> Answer {
        typealias Script = RedisSessionCoordinator
        func session(_ generation: RedisReply, _ credentials: RedisReply, _ logout: RedisReply?, _ epoch: RedisReply?)
            -> SharedSession
        {
            let until = logout?.integer.flatMap { $0 > now ? Date(milliseconds: $0) : nil }
            return SharedSession(
                credentials: credentials.text.flatMap { SharedCredentialsCodec.decode($0) },
                generation: UInt64(generation.integer ?? 0), loggedOutUntil: until,
                epoch: UInt64(epoch?.integer ?? 0))
        }
        func seed(_ seed: CoordinationRecord.Seed?) -> [String] {
            [
                "EVAL", Script.seedScript, "4", keys.session, keys.logout, keys.lease, keys.fence,
                seed.map { SharedCredentialsCodec.encode($0.credentials) } ?? "", String(seed?.generation ?? 0),
                (seed?.epoch ?? 0) > 0 ? String(seed?.epoch ?? 0) : "", seed?.lease.map { String($0.fence) } ?? "",
                String(seed?.lease?.leftMs ?? 0), String(seed?.fence ?? 0), keys.channel,
            ]
        }
        switch operation {
        case .join(let local):
            let items = try call(seed(local.map { CoordinationRecord.Seed(credentials: $0, generation: 0) })).items
            guard items.count >= 4, items[0].integer == 0 else { return .joined(nil) }
            let shared = session(items[1], items[2], items[3], items.count > 4 ? items[4] : nil)
            return .joined(shared.credentials != nil || shared.loggedOutUntil != nil ? shared : nil)
        case .reseed(let value):
            let items = try call(seed(value)).items
            return .reseeded(items.first?.integer == 1)
        case .begin(let failed, let leaseMs, let limit, let knows, let asker):
            let items = try call([
                "EVAL", Script.beginScript, "5", keys.session, keys.lease, keys.fence, keys.logout, keys.loops,
                String(failed), String(leaseMs), String(limit?.count ?? 0), String(limit?.perMs ?? 0), "", "",
                String(knows.generation), String(knows.fence), knows.lease.map { String($0.fence) } ?? "",
                String(knows.lease?.leftMs ?? 0), keys.channel, asker == 0 ? "" : String(asker),
                knows.hasPair ? "1" : "", "", "", String(CoordinationRecord.longestEmbargoMs),
            ]).items
            switch items.first?.integer {
            case 0 where items.count >= 4:
                return .begin(.newer(session(items[1], items[2], items[3], items.count > 4 ? items[4] : nil)))
            case 5 where items.count >= 2: return .begin(.behind(stored: UInt64(items[1].integer ?? 0)))
            case 1 where items.count >= 3:
                return .begin(
                    .granted(
                        RefreshLease(
                            fencingToken: UInt64(items[1].integer ?? 0), generation: UInt64(items[2].integer ?? 0))))
            case 2 where items.count >= 3:
                return .begin(.wait(holder: UInt64(items[1].integer ?? 0), leftMs: items[2].integer ?? 0))
            case 3: return .begin(.limited)
            case 6 where items.count >= 3:
                return .begin(.embargoed(untilMs: items[1].integer ?? 0, reason: items[2].text ?? ""))
            default: throw FixtureError("begin: unexpected reply \(items)")
            }
        case .publish(let credentials, let lease):
            let items = try call([
                "EVAL", Script.publishScript, "3", keys.session, keys.lease, keys.fence, String(lease.fencingToken),
                String(lease.generation), SharedCredentialsCodec.encode(credentials), keys.channel,
            ]).items
            let generation = UInt64(items.count > 1 ? items[1].integer ?? 0 : 0)
            if items.first?.integer == 1 {
                let epoch = UInt64(items.count > 2 ? items[2].integer ?? 0 : 0)
                return .publish(
                    .published(SharedSession(credentials: credentials, generation: generation, epoch: epoch)))
            }
            let stored = items.count > 2 ? items[2].text.flatMap { SharedCredentialsCodec.decode($0) } : nil
            let epoch = UInt64(items.count > 3 ? items[3].integer ?? 0 : 0)
            return .publish(
                .leaseLost(current: stored.map { SharedSession(credentials: $0, generation: generation, epoch: epoch) })
            )
        case .end(let lease, let failure, let retryAfter):
            // As the coordinator sends it (bounded by its own clock), unsigned.
            var wait: [String] = []
            if let retryAfter {
                let until = min(retryAfter, now + CoordinationRecord.longestEmbargoMs)
                let why = failure ?? "the token endpoint asked to wait"
                wait = [String(until), why, #"{"t":"r","u":\#(until),"w":"\#(why)"}"#]
            }
            try call(
                [
                    "EVAL", Script.endScript, "2", keys.lease, keys.session, String(lease.fencingToken),
                    failure.map { #"{"t":"f","f":\#(lease.fencingToken),"w":"\#($0)"}"# } ?? "", keys.channel,
                ] + wait)
            return .done
        case .accept(let generation):
            let changed = try call(["EVAL", Script.acceptScript, "2", keys.session, keys.loops, String(generation)])
            return .accepted(changed.integer == 1)
        case .logout(let until, let epoch):
            try call([
                "EVAL", Script.logoutScript, "2", keys.logout, keys.session, String(until), String(max(1, until - now)),
                #"{"t":"l","u":\#(until),"r":"test"}"#, keys.channel, "", String(epoch),
            ])
            return .done
        case .signIn(let credentials, let floor):
            let generation = UInt64(
                try call([
                    "EVAL", Script.signInScript, "3", keys.session, keys.lease, keys.logout,
                    SharedCredentialsCodec.encode(credentials), keys.channel, String(floor),
                ]).integer ?? 0)
            return .signedIn(SharedSession(credentials: credentials, generation: generation, epoch: generation))
        }
    }
}

// MARK: - Helpers

private func creds(_ name: String) -> Credentials {
    // Whole milliseconds: what every store keeps.
    Credentials(
        accessToken: "access-\(name)", refreshToken: "refresh-\(name)", expiresAt: Date(milliseconds: 2_000_000_000_123)
    )
}

private func record(
    gen: UInt64, credentials: Credentials? = creds("shared"), fence: UInt64 = 0, lease: (UInt64, Int64)? = nil,
    loggedOutUntil: Int64? = nil, loops: [(UInt64, Int64)] = [], accepted: UInt64 = 0, epoch: UInt64 = 0,
    embargo: (Int64, String)? = nil
) -> CoordinationRecord {
    var record = CoordinationRecord()
    record.generation = gen
    record.credentials = credentials
    record.fence = fence
    record.lease = lease.map { .init(fence: $0.0, holder: 1, expires: $0.1) }
    record.loggedOutUntil = loggedOutUntil
    record.loops = loops.map { .init(generation: $0.0, at: $0.1) }
    record.accepted = accepted
    record.embargo = embargo.map { .init(until: $0.0, reason: $0.1) }
    record.epoch = epoch
    return record
}
