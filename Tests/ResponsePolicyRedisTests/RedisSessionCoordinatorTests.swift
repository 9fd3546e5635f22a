import CoordinationTestSupport
import Foundation
import ResponsePolicy
import ResponsePolicyRedis
import TestGate
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// The Redis coordinator against a real `redis-server` per test (`.ci/run` installs it). No test
/// here bounds wall time: each waits for what it needs (subscribers in place, a script run, an
/// update) with a generous bound, so the suite runs beside the others in `swift test`; the ones
/// that measure time are ``RedisRealTimeSmokeTests``.
@Suite(.enabled(if: RedisServerFixture.isInstalled, "redis-server is not installed"))
struct RedisSessionCoordinatorTests {
    static func channel(_ key: String) -> String { "response-policy:{\(key)}:events" }

    func coordinator(
        _ server: RedisServerFixture, key: String = "mobile-api", lease: Duration = .seconds(15),
        connectTimeout: Duration = .milliseconds(250)
    ) throws -> RedisSessionCoordinator {
        try RedisSessionCoordinator(
            .init(url: server.url, key: key, lease: lease, connectTimeout: connectTimeout))
    }

    @Test func manyCoordinatorsMeetingOneExpiredTokenMakeOneRefresh() async throws {
        let server = try RedisServerFixture()
        let coordinators = try (0..<6).map { _ in try coordinator(server) }
        for coordinator in coordinators {
            _ = await coordinator.start(local: testCredentials("seed"), updates: { _ in })
        }
        defer { coordinators.forEach { $0.stop() } }
        let counter = RefreshCounter()
        let turns = await withTaskGroup(of: RefreshTurn.self) { group in
            for coordinator in coordinators {
                for _ in 0..<5 {
                    group.addTask {
                        await coordinatedRefresh(
                            coordinator, failedGeneration: 0, counter: counter, timeout: .seconds(60))
                    }
                }
            }
            return await group.reduce(into: []) { $0.append($1) }
        }
        #expect(counter.refreshes == 1)
        let leases = turns.filter { if case .lease = $0 { return true } else { return false } }
        #expect(leases.count == 1)
        let expected = SharedSession(credentials: testCredentials("refreshed-1"), generation: 1)
        for turn in turns {
            switch turn {
            case .lease: break
            case .published(let session), .newer(let session): #expect(session == expected)
            default: Issue.record("unexpected turn \(turn)")
            }
        }
        // A process whose request carried the old token later retries with the new one.
        let late = await coordinators[0].beginRefresh(
            RefreshTurnRequest(failedGeneration: 0, timeout: .seconds(1), limit: nil))
        #expect(late == .newer(expected))
    }

    @Test func theFirstProcessSeedsAndRedisWinsAfterwards() async throws {
        let server = try RedisServerFixture()
        let first = try coordinator(server)
        let second = try coordinator(server)
        defer { first.stop(); second.stop() }
        #expect(await first.start(local: testCredentials("first"), updates: { _ in }) == nil)
        let shared = await second.start(local: testCredentials("stale"), updates: { _ in })
        #expect(shared == SharedSession(credentials: testCredentials("first"), generation: 0))
        // Another key is another session.
        let other = try coordinator(server, key: "billing")
        defer { other.stop() }
        #expect(await other.start(local: testCredentials("billing"), updates: { _ in }) == nil)
    }

    @Test func aPublicationReachesTheOthersAsAnUpdate() async throws {
        let server = try RedisServerFixture()
        let publisher = try coordinator(server)
        let listener = try coordinator(server)
        defer { publisher.stop(); listener.stop() }
        let log = UpdateLog()
        _ = await publisher.start(local: testCredentials("seed"), updates: { _ in })
        _ = await listener.start(local: nil, updates: log.sink)
        // Both subscribers are in place (a message published before would be lost, as pub/sub is).
        #expect(await server.waitForSubscribers(2, on: Self.channel("mobile-api")))
        guard
            case .lease(let lease) = await publisher.beginRefresh(
                .init(failedGeneration: 0, timeout: .seconds(1), limit: nil))
        else { return recordFailure("no lease") }
        #expect(
            await publisher.publish(testCredentials("new"), with: lease)
                == .published(SharedSession(credentials: testCredentials("new"), generation: 1)))
        let update = await log.first(within: .seconds(60)) { if case .credentials = $0 { true } else { false } }
        #expect(update?.0 == .credentials(SharedSession(credentials: testCredentials("new"), generation: 1)))
    }

    @Test func aFailedRefreshFailsTheWaitersOnce() async throws {
        let server = try RedisServerFixture()
        let holder = try coordinator(server)
        let waiter = try coordinator(server)
        defer { holder.stop(); waiter.stop() }
        _ = await holder.start(local: testCredentials("seed"), updates: { _ in })
        _ = await waiter.start(local: nil, updates: { _ in })
        #expect(await server.waitForSubscribers(2, on: Self.channel("mobile-api")))
        guard
            case .lease(let lease) = await holder.beginRefresh(
                .init(failedGeneration: 0, timeout: .seconds(1), limit: nil))
        else { return recordFailure("no lease") }
        let asked = try server.commandCalls()["evalsha", default: 0]
        // The timeout only bounds a broken run: the failure's announcement ends the wait.
        async let waiting = waiter.beginRefresh(.init(failedGeneration: 0, timeout: .seconds(60), limit: nil))
        // The waiter has been told to wait (its turn script ran) before the holder fails.
        #expect(await server.waitForCalls("evalsha", atLeast: asked + 1))
        await holder.endRefresh(lease, failure: "the token endpoint answered 400 invalid_grant")
        #expect(await waiting == .failedElsewhere("the token endpoint answered 400 invalid_grant"))
    }

    @Test func theRefreshLimitCountsAcrossTheFleet() async throws {
        let server = try RedisServerFixture()
        let coordinators = try (0..<3).map { _ in try coordinator(server) }
        defer { coordinators.forEach { $0.stop() } }
        // A window far longer than any stall: in a full parallel run on two busy cores the three
        // turns took more than 30 s of real time, and the first grant left a 30 s window.
        let limit = (count: 2, per: Duration.seconds(3600))
        var turns: [RefreshTurn] = []
        for coordinator in coordinators {
            let turn = await coordinator.beginRefresh(.init(failedGeneration: 0, timeout: .seconds(1), limit: limit))
            if case .lease(let lease) = turn { await coordinator.endRefresh(lease, failure: nil) }
            turns.append(turn)
        }
        #expect(turns.map { if case .lease = $0 { "lease" } else { "\($0)" } } == ["lease", "lease", "limited"])
    }

    @Test func aPasswordComesFromTheConfigurationAndNeverShowsInErrors() async throws {
        let server = try RedisServerFixture(password: "s3cret-pass")
        let wrong = try RedisSessionCoordinator(
            .init(url: server.url, key: "k", password: "wrong-pass-123"))
        defer { wrong.stop() }
        let log = UpdateLog()
        _ = await wrong.start(local: testCredentials("seed"), updates: log.sink)
        let turn = await wrong.beginRefresh(.init(failedGeneration: 0, timeout: .seconds(1), limit: nil))
        let texts = log.updates.map { "\($0)" } + ["\(turn)"]
        #expect(texts.contains { $0.contains("refused the password") })
        #expect(!texts.contains { $0.contains("wrong-pass-123") || $0.contains("access-seed") })

        let right = try RedisSessionCoordinator(.init(url: server.url, key: "k", password: "s3cret-pass"))
        defer { right.stop() }
        #expect(await right.start(local: testCredentials("seed"), updates: { _ in }) == nil)
        guard case .lease = await right.beginRefresh(.init(failedGeneration: 0, timeout: .seconds(1), limit: nil))
        else {
            return recordFailure("no lease with the right password")
        }
    }

    @Test(arguments: ["http://127.0.0.1/0", "redis://", "redis://h/x", "rediss://10.0.0.5:6380/0"])
    func aURLItCannotUseIsRefused(_ url: String) {
        #expect(throws: CoordinationError.self) { try RedisSessionCoordinator(.init(url: url, key: "k")) }
    }
}

extension RedisSessionCoordinatorTests {
    /// Issue 23: with `signing-key-env`, a forged record (`HSET`) or announcement (`PUBLISH`) of
    /// credentials or a logout is refused with a `problem`, and never reaches the engine.
    @Test func forgedCredentialsAndLogoutsAreRefusedWithASigningKey() async throws {
        let server = try RedisServerFixture()
        let key = Data("fleet-key".utf8)
        let coordinator = try RedisSessionCoordinator(.init(url: server.url, key: "signed", signingKey: key))
        defer { coordinator.stop() }
        let log = UpdateLog()
        _ = await coordinator.start(local: testCredentials("seed"), updates: log.sink)
        let attacker = try RedisConnection(
            try RedisEndpoint.parse(server.url).get(), password: nil, timeout: .seconds(2))
        #expect(await server.waitForSubscribers(1, on: Self.channel("signed")))
        let forged = #"{"access_token":"attacker","refresh_token":"attacker-refresh"}"#
        _ = try attacker.command(["HSET", "response-policy:{signed}:session", "gen", "9", "creds", forged])
        let turn = await coordinator.beginRefresh(.init(failedGeneration: 0, timeout: .seconds(1), limit: nil))
        // Coordination trouble (the turn waits or fails with the reason), never the forged pair.
        guard case .unavailable(let reason) = turn else { Issue.record("got \(turn)"); return }
        #expect(reason.contains("response-policy:{signed}:session") && !reason.contains("attacker"))
        // Published until the subscriber (its own connection, subscribing in the background) has
        // heard one: a message sent before it subscribed is lost, as Redis pub/sub is.
        var problems: (SessionUpdate, ContinuousClock.Instant)?
        for _ in 0..<100 where problems == nil {
            _ = try attacker.command([
                "PUBLISH", "response-policy:{signed}:events", #"{"t":"c","g":10,"c":"# + forged + "}",
            ])
            _ = try attacker.command([
                "PUBLISH", "response-policy:{signed}:events", #"{"t":"l","u":32503680000000,"r":"x"}"#,
            ])
            problems = await log.first(within: .milliseconds(100)) { update in
                if case .problem(let text) = update { return text.contains("logout") }
                return false
            }
        }
        #expect(problems != nil)
        #expect(
            !log.updates.contains { update in
                if case .credentials(let session) = update { return session.credentials?.accessToken == "attacker" }
                return false
            })
        #expect(!log.updates.contains { if case .loggedOut = $0 { true } else { false } })
    }
}
