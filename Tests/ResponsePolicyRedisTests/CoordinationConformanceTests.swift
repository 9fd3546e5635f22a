import Foundation
import TestSupport
import Testing

@testable import ResponsePolicy
@testable import ResponsePolicyRedis

/// The ``SessionCoordinator`` contract, one suite every store passes: in memory (the
/// simulator's and the fleet tests' store), the lock file and Redis (a `redis-server` of the
/// test's own on a free loopback port). Several coordinators on one store play the processes of a
/// fleet. No test sleeps: each waits for what it needs (an answer, an update, Redis subscribers
/// in place) with a generous bound, so none measures the machine.
///
/// In this target because it needs the Redis product; the core's own suites cover the in-memory
/// and file stores without hiredis.
@Suite struct CoordinationConformanceTests {
    enum Backend: String, CaseIterable, Sendable, CustomTestStringConvertible {
        case inMemory = "in-memory", file, redis
        var testDescription: String { rawValue }
    }

    static let backends = Backend.allCases.filter { $0 != .redis || RedisServerFixture.isInstalled }

    /// One shared store and the coordinators ("processes") made on it.
    final class Fleet: @unchecked Sendable {
        // @unchecked: `coordinators` is appended to by the test's own task only.
        let backend: Backend
        let server: RedisServerFixture?
        let folder: URL
        let memory = InMemoryCoordinationStore(clock: SystemPolicyClock())
        private var coordinators: [any SessionCoordinator] = []
        /// Coordinators made and never started: they do not subscribe.
        private var unstarted = 0
        static let key = "conformance"

        init(_ backend: Backend) throws {
            self.backend = backend
            server = backend == .redis ? try RedisServerFixture() : nil
            folder = FileManager.default.temporaryDirectory.appendingPathComponent("conformance-\(UUID().uuidString)")
            try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        }

        func coordinator(lease: Duration = .seconds(15)) throws -> any SessionCoordinator {
            let made: any SessionCoordinator
            switch backend {
            case .inMemory: made = memory.coordinator(lease: lease)
            case .file:
                made = try FileSessionCoordinator(
                    .init(path: folder.appendingPathComponent("credentials.json").path, lease: lease))
            case .redis:
                made = try RedisSessionCoordinator(.init(url: server?.url ?? "", key: Self.key, lease: lease))
            }
            coordinators.append(made)
            return made
        }

        /// Starts a coordinator and waits until it hears the others (Redis: its subscription is in
        /// place and has re-read the session; the others hear from their first look on).
        func started(
            local: Credentials?, lease: Duration = .seconds(15),
            updates: @escaping @Sendable (SessionUpdate) -> Void = { _ in }
        ) async throws -> (any SessionCoordinator, SharedSession?) {
            let made = try coordinator(lease: lease)
            let shared = await made.start(local: local, updates: updates)
            if let server {
                let listening = coordinators.count - unstarted
                #expect(await server.waitForSubscribers(listening, on: "response-policy:{\(Self.key)}:events"))
                #expect(await server.waitForCalls("eval", atLeast: listening))
            }
            return (made, shared)
        }

        /// A coordinator that is never started: a process that hears nothing of the others (its
        /// view is what it last read, here nothing), though its calls reach the store.
        func unheard() throws -> any SessionCoordinator {
            unstarted += 1
            return try coordinator()
        }

        deinit {
            for coordinator in coordinators { coordinator.stop() }
            server?.kill()
            try? FileManager.default.removeItem(at: folder)
        }
    }

    static func request(_ generation: UInt64, timeout: Duration = .seconds(60), limit: (Int, Duration)? = nil)
        -> RefreshTurnRequest
    {
        RefreshTurnRequest(
            failedGeneration: generation, timeout: timeout, limit: limit.map { (count: $0.0, per: $0.1) })
    }

    @Test(arguments: backends)
    func theFirstProcessSeedsTheStoreAndTheStoreWinsAfterwards(_ backend: Backend) async throws {
        let fleet = try Fleet(backend)
        let (_, first) = try await fleet.started(local: testCredentials("first"))
        #expect(first == nil)
        let (_, second) = try await fleet.started(local: testCredentials("stale"))
        #expect(second == SharedSession(credentials: testCredentials("first"), generation: 0))
    }

    @Test(arguments: backends)
    func manyProcessesMeetingOneExpiredTokenMakeOneRefresh(_ backend: Backend) async throws {
        let fleet = try Fleet(backend)
        var coordinators: [any SessionCoordinator] = []
        for _ in 0..<4 { coordinators.append(try await fleet.started(local: testCredentials("seed")).0) }
        let counter = RefreshCounter()
        let turns = await withTaskGroup(of: RefreshTurn.self) { group in
            for coordinator in coordinators {
                for _ in 0..<3 {
                    group.addTask {
                        await coordinatedRefresh(
                            coordinator, failedGeneration: 0, counter: counter, timeout: .seconds(60))
                    }
                }
            }
            return await group.reduce(into: []) { $0.append($1) }
        }
        #expect(counter.refreshes == 1)
        #expect(turns.filter { if case .lease = $0 { true } else { false } }.count == 1)
        let expected = SharedSession(credentials: testCredentials("refreshed-1"), generation: 1)
        for turn in turns {
            switch turn {
            case .lease: break
            case .published(let session), .newer(let session): #expect(session == expected)
            default: Issue.record("unexpected turn \(turn)")
            }
        }
        // A request signed before the publication retries with the new credentials, no refresh.
        guard case .newer(let session) = await coordinators[3].beginRefresh(Self.request(0)) else {
            return recordFailure("no newer credentials for a stale generation")
        }
        #expect(session.credentials == expected.credentials && session.generation == 1)
    }

    @Test(arguments: backends)
    func aPublicationReachesTheOthersAsAnUpdate(_ backend: Backend) async throws {
        let fleet = try Fleet(backend)
        let log = UpdateLog()
        let (publisher, _) = try await fleet.started(local: testCredentials("seed"))
        _ = try await fleet.started(local: nil, updates: log.sink)
        guard case .lease(let lease) = await publisher.beginRefresh(Self.request(0)) else {
            return recordFailure("no lease")
        }
        #expect(
            await publisher.publish(testCredentials("new"), with: lease)
                == .published(SharedSession(credentials: testCredentials("new"), generation: 1)))
        let heard = await log.first(within: .seconds(60)) { if case .credentials = $0 { true } else { false } }
        #expect(heard?.0 == .credentials(SharedSession(credentials: testCredentials("new"), generation: 1)))
    }

    @Test(arguments: backends)
    func aFailedRefreshFailsTheWaitersOnce(_ backend: Backend) async throws {
        let fleet = try Fleet(backend)
        let (holder, _) = try await fleet.started(local: testCredentials("seed"))
        let (waiter, _) = try await fleet.started(local: nil)
        let reason = "the token endpoint answered 400 invalid_grant"
        // The waiter must be waiting when the holder fails. Redis says so (the waiter's turn script
        // ran); the other stores do not, so a waiter that asked only after the failure (and was
        // rightly granted the next lease) ends that lease and the round is played again.
        for _ in 0..<50 {
            guard case .lease(let lease) = await holder.beginRefresh(Self.request(0)) else {
                return recordFailure("no lease")
            }
            let asked = try fleet.server?.commandCalls()["evalsha", default: 0]
            async let waiting = waiter.beginRefresh(Self.request(0))
            if let server = fleet.server, let asked {
                #expect(await server.waitForCalls("evalsha", atLeast: asked + 1))
            } else {
                await Task.yield()
            }
            await holder.endRefresh(lease, failure: reason)
            switch await waiting {
            case .failedElsewhere(let heard):
                #expect(heard == reason)
                return
            case .lease(let late): await waiter.endRefresh(late, failure: nil)
            case let other: return recordFailure("the wait ended with \(other)")
            }
        }
        recordFailure("in 50 rounds the waiter never asked before the holder failed")
    }

    @Test(arguments: backends)
    func fencingTokensGrowAndAnEndedLeaseIsGrantedAgain(_ backend: Backend) async throws {
        let fleet = try Fleet(backend)
        let (a, _) = try await fleet.started(local: testCredentials("seed"))
        let (b, _) = try await fleet.started(local: nil)
        guard case .lease(let first) = await a.beginRefresh(Self.request(0)) else { return recordFailure("no lease") }
        await a.endRefresh(first, failure: nil)
        guard case .lease(let second) = await b.beginRefresh(Self.request(0)) else {
            return recordFailure("no lease after the first ended")
        }
        #expect(second.fencingToken > first.fencingToken)
        #expect(second.generation == first.generation)
    }

    @Test(arguments: backends)
    func aSignInVoidsTheLeaseInFlight(_ backend: Backend) async throws {
        let fleet = try Fleet(backend)
        let (holder, _) = try await fleet.started(local: testCredentials("seed"))
        let (other, _) = try await fleet.started(local: nil)
        guard case .lease(let lease) = await holder.beginRefresh(Self.request(0)) else {
            return recordFailure("no lease")
        }
        let signedIn = await other.publishSignIn(testCredentials("signed-in"))
        #expect(signedIn?.credentials == testCredentials("signed-in"))
        #expect(signedIn?.generation == 1)
        guard case .leaseLost(let current) = await holder.publish(testCredentials("late"), with: lease) else {
            return recordFailure("a publication under a voided lease was stored")
        }
        #expect(current?.credentials == testCredentials("signed-in") && current?.generation == 1)
    }

    @Test(arguments: backends)
    func aWaitForAnotherHolderIsBoundedByTheRequestTimeout(_ backend: Backend) async throws {
        let fleet = try Fleet(backend)
        // Leases far longer than any stall of a loaded machine: a waiter cuts a lease longer than its
        // own to its own length, and a waiter starved past that would rightly be granted one.
        let (holder, _) = try await fleet.started(local: testCredentials("seed"), lease: .seconds(600))
        let (waiter, _) = try await fleet.started(local: nil, lease: .seconds(600))
        guard case .lease = await holder.beginRefresh(Self.request(0)) else { return recordFailure("no lease") }
        // The holder never publishes: the waiter gives up at its timeout, long before the lease.
        let turn = await waiter.beginRefresh(Self.request(0, timeout: .milliseconds(200)))
        guard case .failedElsewhere = turn else { return recordFailure("the wait ended with \(turn)") }
    }

    /// `refresh.limit` fleet-wide counts what it counts in one process (issue 29): generations a
    /// refresh made whose token was refused before any process saw it accepted; never the initial
    /// token, never a failed refresh (a grant that ended without a pair).
    @Test(arguments: backends)
    func theRefreshLimitCountsAcrossTheFleet(_ backend: Backend) async throws {
        let fleet = try Fleet(backend)
        var processes: [any SessionCoordinator] = []
        for _ in 0..<3 { processes.append(try await fleet.started(local: testCredentials("seed")).0) }
        let limit = (2, Duration.seconds(3600))
        func name(_ turn: RefreshTurn) -> String { if case .lease = turn { "lease" } else { "\(turn)" } }
        // The initial token, refused again and again, and refreshes that fail: nothing counts.
        // (One process refreshes: another that had not yet heard a lease's end would rightly wait
        // for it, and be told it failed.)
        for round in 0..<4 {
            let process = processes[0]
            let turn = await process.beginRefresh(Self.request(0, limit: limit))
            #expect(name(turn) == "lease", "round \(round)")
            if case .lease(let lease) = turn { await process.endRefresh(lease, failure: "HTTP 503") }
        }
        // Generation 1, refused at once: one loop. Generation 2, refused in another process: the limit.
        var generation: UInt64 = 0
        for step in 1...2 {
            let process = processes[0]
            guard case .lease(let lease) = await process.beginRefresh(Self.request(generation, limit: limit)) else {
                return recordFailure("no lease at generation \(generation)")
            }
            guard case .published(let session) = await process.publish(testCredentials("g\(step)"), with: lease) else {
                return recordFailure("not published")
            }
            generation = session.generation
        }
        #expect(name(await processes[1].beginRefresh(Self.request(generation, limit: limit))) == "limited")
        // A process saw that token accepted: no loop, a refresh has room again.
        await processes[2].noteAccepted(generation: generation)
        let turn = await processes[1].beginRefresh(Self.request(generation, limit: limit))
        #expect(name(turn) == "lease")
    }

    /// `Retry-After` fleet-wide (issue 29): a holder's token call asked to wait; no process is
    /// granted a lease before the wait ends, each is answered with its end and reason, and every
    /// process hears it.
    @Test(arguments: backends)
    func aHoldersRetryAfterHoldsEveryProcess(_ backend: Backend) async throws {
        let fleet = try Fleet(backend)
        let log = UpdateLog()
        let (holder, _) = try await fleet.started(local: testCredentials("seed"))
        let (other, _) = try await fleet.started(local: nil, updates: log.sink)
        guard case .lease(let lease) = await holder.beginRefresh(Self.request(0)) else {
            return recordFailure("no lease")
        }
        let until = Date(milliseconds: Date().millisecondsSince1970 + 30_000)
        await holder.endRefresh(lease, failure: "HTTP 429 Too Many Requests", retryAfter: until)
        for process in [other, holder] {
            let turn = await process.beginRefresh(Self.request(0))
            guard case .retryAfter(let end, let reason) = turn else { return recordFailure("a turn: \(turn)") }
            #expect(abs(end.timeIntervalSince(until)) < 1 && reason == "HTTP 429 Too Many Requests")
        }
        let heard = await log.first(within: .seconds(60)) { if case .retryAfter = $0 { true } else { false } }
        guard case .retryAfter(let end, let reason)? = heard?.0 else { return recordFailure("no announcement") }
        #expect(abs(end.timeIntervalSince(until)) < 1 && reason == "HTTP 429 Too Many Requests")
        // Newer credentials are never held back by it.
        _ = await other.publishSignIn(testCredentials("signed-in"))
        guard case .lease = await holder.beginRefresh(Self.request(1)) else {
            return recordFailure("a sign-in ends the wait")
        }
    }

    @Test(arguments: backends)
    func aLogoutReachesTheOthersAndLateJoinersAndASignInEndsIt(_ backend: Backend) async throws {
        let fleet = try Fleet(backend)
        let log = UpdateLog()
        let (origin, _) = try await fleet.started(local: testCredentials("seed"))
        _ = try await fleet.started(local: nil, updates: log.sink)
        let until = Date(milliseconds: Date().millisecondsSince1970 + 60_000)
        await origin.publishLogout(until: until, reason: "rule session-revoked")
        // A shorter cooldown published later never shortens it.
        await origin.publishLogout(until: until.addingTimeInterval(-30), reason: "shorter")
        let heard = await log.first(within: .seconds(60)) { if case .loggedOut = $0 { true } else { false } }
        guard case .loggedOut(let heardUntil, let reason)? = heard?.0 else { return recordFailure("no logout heard") }
        #expect(abs(heardUntil.timeIntervalSince(until)) < 0.002)
        // The file store's record keeps the cooldown's end, not its reason (a known difference).
        #expect(
            reason == (backend == .file ? "another process sharing the session logged out" : "rule session-revoked"))
        let (_, late) = try await fleet.started(local: nil)
        #expect(
            late?.loggedOutUntil.map { abs($0.timeIntervalSince(until)) < 0.002 } == true, "\(String(describing: late))"
        )
        let signedIn = await origin.publishSignIn(testCredentials("again"))
        #expect(signedIn?.credentials == testCredentials("again"))
        let (_, after) = try await fleet.started(local: nil)
        #expect(after?.credentials == testCredentials("again"))
        #expect(after?.loggedOutUntil == nil)
        #expect(after?.generation == signedIn?.generation)
    }

    /// A process that had not heard of a sign-in meets the server's logout code on the old token:
    /// its logout ended only the session the sign-in had already ended, so it changes nothing for
    /// the current one. It is not stored (a process that joins later, and a refresh turn, find
    /// the signed-in session without a cooldown) and nobody hears it.
    @Test(arguments: backends)
    func aLogoutFromAProcessThatMissedASignInChangesNothing(_ backend: Backend) async throws {
        let fleet = try Fleet(backend)
        let log = UpdateLog()
        let (signer, _) = try await fleet.started(local: testCredentials("seed"))
        _ = try await fleet.started(local: nil, updates: log.sink)
        let missed = try fleet.unheard()
        let signedIn = try #require(await signer.publishSignIn(testCredentials("signed-in")))
        let heard = await log.first(within: .seconds(60)) {
            if case .credentials(let session) = $0 { session.generation == signedIn.generation } else { false }
        }
        try #require(heard != nil, "the listener never heard the sign-in")

        await missed.publishLogout(until: Date().addingTimeInterval(600), reason: "rule session-revoked")
        let (_, late) = try await fleet.started(local: nil)
        #expect(
            late
                == SharedSession(
                    credentials: testCredentials("signed-in"), generation: signedIn.generation,
                    epoch: signedIn.generation))
        let turn = await signer.beginRefresh(Self.request(0))
        guard case .newer(let session) = turn else { return recordFailure("the signer's turn was \(turn)") }
        #expect(session.generation == signedIn.generation && session.loggedOutUntil == nil)
        // A rotation reaches the listener after anything the logout could have made it hear.
        guard case .lease(let lease) = await signer.beginRefresh(Self.request(signedIn.generation)) else {
            return recordFailure("no lease for the signed-in session")
        }
        guard case .published(let rotated) = await signer.publish(testCredentials("rotated"), with: lease) else {
            return recordFailure("the rotation was not published")
        }
        let rotation = await log.first(within: .seconds(60)) {
            if case .credentials(let session) = $0 { session.generation == rotated.generation } else { false }
        }
        #expect(rotation != nil, "the listener never heard the rotation")
        #expect(!log.updates.contains { if case .loggedOut = $0 { true } else { false } }, "\(log.updates)")
    }
}
