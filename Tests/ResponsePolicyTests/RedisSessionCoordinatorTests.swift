import Foundation
import ResponsePolicy
import TestGate
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// The Redis coordinator against a real `redis-server` per test (`.ci/run` installs it).
@Suite(
    .realTimeStep, .loadGate(.realTime), .enabled(if: RedisServerFixture.isInstalled, "redis-server is not installed"))
struct RedisSessionCoordinatorTests {
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
                    group.addTask { await coordinatedRefresh(coordinator, failedGeneration: 0, counter: counter) }
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
        try await Task.sleep(for: .milliseconds(100))  // the subscription is in place
        guard
            case .lease(let lease) = await publisher.beginRefresh(
                .init(failedGeneration: 0, timeout: .seconds(1), limit: nil))
        else { return recordFailure("no lease") }
        #expect(
            await publisher.publish(testCredentials("new"), with: lease)
                == .published(SharedSession(credentials: testCredentials("new"), generation: 1)))
        let update = await log.first(within: .seconds(2)) { if case .credentials = $0 { true } else { false } }
        #expect(update?.0 == .credentials(SharedSession(credentials: testCredentials("new"), generation: 1)))
    }

    @Test func aHolderWhoseLeaseExpiredPublishesNothing() async throws {
        let server = try RedisServerFixture()
        let slow = try coordinator(server, lease: .milliseconds(150))
        let next = try coordinator(server)  // its own lease is long: only the first one expires here
        defer { slow.stop(); next.stop() }
        _ = await slow.start(local: testCredentials("seed"), updates: { _ in })
        _ = await next.start(local: nil, updates: { _ in })
        let started = ContinuousClock.now  // before the lease is granted: it expires 150 ms after this at the earliest
        guard
            case .lease(let stale) = await slow.beginRefresh(
                .init(failedGeneration: 0, timeout: .milliseconds(100), limit: nil))
        else { return recordFailure("no lease") }
        // The holder never ends (as if it died): the next one is granted a lease once it expires.
        guard
            case .lease(let fresh) = await next.beginRefresh(
                .init(failedGeneration: 0, timeout: .seconds(2), limit: nil))
        else { return recordFailure("no lease after expiry") }
        let waited = ContinuousClock.now - started
        #expect(waited >= .milliseconds(140) && waited < .seconds(5), "waited \(waited)")
        #expect(fresh.fencingToken > stale.fencingToken)
        #expect(
            await slow.publish(testCredentials("late"), with: stale)
                == .leaseLost(current: SharedSession(credentials: testCredentials("seed"), generation: 0)))
        #expect(
            await next.publish(testCredentials("fresh"), with: fresh)
                == .published(SharedSession(credentials: testCredentials("fresh"), generation: 1)))
    }

    @Test func aFailedRefreshFailsTheWaitersOnce() async throws {
        let server = try RedisServerFixture()
        let holder = try coordinator(server)
        let waiter = try coordinator(server)
        defer { holder.stop(); waiter.stop() }
        _ = await holder.start(local: testCredentials("seed"), updates: { _ in })
        _ = await waiter.start(local: nil, updates: { _ in })
        try await Task.sleep(for: .milliseconds(100))
        guard
            case .lease(let lease) = await holder.beginRefresh(
                .init(failedGeneration: 0, timeout: .seconds(1), limit: nil))
        else { return recordFailure("no lease") }
        async let waiting = waiter.beginRefresh(.init(failedGeneration: 0, timeout: .seconds(3), limit: nil))
        try await Task.sleep(for: .milliseconds(50))
        await holder.endRefresh(lease, failure: "the token endpoint answered 400 invalid_grant")
        #expect(await waiting == .failedElsewhere("the token endpoint answered 400 invalid_grant"))
    }

    @Test func aWaitIsBoundedByTheRequestTimeout() async throws {
        let server = try RedisServerFixture()
        let holder = try coordinator(server)
        let waiter = try coordinator(server)
        defer { holder.stop(); waiter.stop() }
        _ = await holder.start(local: testCredentials("seed"), updates: { _ in })
        guard case .lease = await holder.beginRefresh(.init(failedGeneration: 0, timeout: .seconds(1), limit: nil))
        else {
            return recordFailure("no lease")
        }
        let started = ContinuousClock.now
        let turn = await waiter.beginRefresh(.init(failedGeneration: 0, timeout: .milliseconds(200), limit: nil))
        #expect(turn == .failedElsewhere("another process's refresh did not finish within 0.2 seconds"))
        // Unbounded, it would wait for the lease (15 s); the margin over the 200 ms timeout is
        // scheduling on a machine the whole suite shares.
        #expect(ContinuousClock.now - started < .seconds(5))
    }

    @Test func theRefreshLimitCountsAcrossTheFleet() async throws {
        let server = try RedisServerFixture()
        let coordinators = try (0..<3).map { _ in try coordinator(server) }
        defer { coordinators.forEach { $0.stop() } }
        let limit = (count: 2, per: Duration.seconds(30))
        var turns: [RefreshTurn] = []
        for coordinator in coordinators {
            let turn = await coordinator.beginRefresh(.init(failedGeneration: 0, timeout: .seconds(1), limit: limit))
            if case .lease(let lease) = turn { await coordinator.endRefresh(lease, failure: nil) }
            turns.append(turn)
        }
        #expect(turns.map { if case .lease = $0 { "lease" } else { "\($0)" } } == ["lease", "lease", "limited"])
    }

    @Test func aLogoutReachesTheOthersWithin100Milliseconds() async throws {
        let server = try RedisServerFixture()
        let origin = try coordinator(server)
        let others = try (0..<3).map { _ in try coordinator(server) }
        defer { origin.stop(); others.forEach { $0.stop() } }
        let logs = others.map { _ in UpdateLog() }
        _ = await origin.start(local: testCredentials("seed"), updates: { _ in })
        for (other, log) in zip(others, logs) { _ = await other.start(local: nil, updates: log.sink) }
        try await Task.sleep(for: .milliseconds(150))
        let until = Date().addingTimeInterval(30)
        let sent = ContinuousClock.now
        await origin.publishLogout(until: until, reason: "rule session-revoked")
        for log in logs {
            let heard = await log.first(within: .seconds(1)) { if case .loggedOut = $0 { true } else { false } }
            guard let (update, at) = heard else { return recordFailure("no logout update") }
            // 100 ms in isolation (see policy-bench's coordination figures); generous here for a
            // loaded CI machine.
            #expect(at - sent < .seconds(1), "heard after \(at - sent)")
            if case .loggedOut(let heardUntil, let reason) = update {
                #expect(abs(heardUntil.timeIntervalSince(until)) < 0.002)
                #expect(reason == "rule session-revoked")
            }
        }
        // A process starting during the cooldown learns of it at start.
        let late = try coordinator(server)
        defer { late.stop() }
        let shared = await late.start(local: nil, updates: { _ in })
        #expect(shared?.loggedOutUntil.map { abs($0.timeIntervalSince(until)) < 0.002 } == true)
        // A sign-in ends it everywhere.
        let signedIn = await origin.publishSignIn(testCredentials("again"))
        #expect(signedIn == SharedSession(credentials: testCredentials("again"), generation: 1))
        let after = try coordinator(server)
        defer { after.stop() }
        #expect(await after.start(local: nil, updates: { _ in }) == signedIn)
    }

    @Test func redisKilledMidRunAnswersUnavailableInTimeThenRecovers() async throws {
        let server = try RedisServerFixture()
        let coordinator = try coordinator(server, connectTimeout: .milliseconds(200))
        defer { coordinator.stop() }
        let log = UpdateLog()
        _ = await coordinator.start(local: testCredentials("seed"), updates: log.sink)
        guard
            case .lease(let lease) = await coordinator.beginRefresh(
                .init(failedGeneration: 0, timeout: .seconds(1), limit: nil))
        else { return recordFailure("no lease") }
        #expect(
            await coordinator.publish(testCredentials("one"), with: lease)
                == .published(SharedSession(credentials: testCredentials("one"), generation: 1)))

        server.kill()
        let problem = await log.first(within: .seconds(2)) { if case .problem = $0 { true } else { false } }
        #expect(problem != nil)
        let started = ContinuousClock.now
        let turn = await coordinator.beginRefresh(.init(failedGeneration: 1, timeout: .seconds(5), limit: nil))
        #expect(ContinuousClock.now - started < .seconds(2))
        guard case .unavailable(let why) = turn else { return recordFailure("expected unavailable, got \(turn)") }
        #expect(why.contains("127.0.0.1:\(server.port)"))
        await coordinator.publishLogout(until: Date().addingTimeInterval(5), reason: "x")  // returns quietly
        #expect(ContinuousClock.now - started < .seconds(3))

        // Back, empty (no persistence): the coordinator says so and seeds what it last knew.
        try server.restart()
        let recovered = await log.first(within: .seconds(5)) { $0 == .recovered }
        #expect(recovered != nil)
        let problems = log.updates.filter { if case .problem = $0 { true } else { false } }
        #expect(problems.count == 1)
        let turnAfter = await coordinator.beginRefresh(.init(failedGeneration: 0, timeout: .seconds(1), limit: nil))
        guard case .newer(let after) = turnAfter else { return recordFailure("expected newer, got \(turnAfter)") }
        #expect(after.credentials == testCredentials("one") && after.generation == 1)
        // The logout made while Redis was down was published when it came back (issue 19, invariant e).
        #expect(after.loggedOutUntil != nil)
    }

    @Test func anUnreachableServerAtStartCostsAtMostTheConnectTimeout() async throws {
        // A loopback port bound but not listening: connections are refused. (Tests send traffic to
        // loopback only; a server that accepts and never answers is the next test.)
        let (refused, port) = RedisServerFixture.boundLoopbackSocket()
        defer { close(refused) }
        let coordinator = try RedisSessionCoordinator(
            .init(url: "redis://127.0.0.1:\(port)/0", key: "k", connectTimeout: .milliseconds(150)))
        defer { coordinator.stop() }
        let log = UpdateLog()
        let started = ContinuousClock.now
        #expect(await coordinator.start(local: testCredentials("seed"), updates: log.sink) == nil)
        // Generous for a loaded CI machine: the point is that start does not hang, not its speed.
        #expect(ContinuousClock.now - started < .seconds(5))
        #expect(await log.first(within: .seconds(1)) { if case .problem = $0 { true } else { false } } != nil)
        let turn = await coordinator.beginRefresh(.init(failedGeneration: 0, timeout: .seconds(1), limit: nil))
        guard case .unavailable = turn else { return recordFailure("expected unavailable, got \(turn)") }
    }

    @Test func aServerThatNeverAnswersCostsAtMostTheConnectTimeoutPerCall() async throws {
        // A listening socket that is never read: connects succeed (the backlog), replies never come.
        let (listener, port) = RedisServerFixture.boundLoopbackSocket()
        defer { close(listener) }
        listen(listener, 16)
        let coordinator = try RedisSessionCoordinator(
            .init(url: "redis://127.0.0.1:\(port)/0", key: "k", connectTimeout: .milliseconds(150)))
        defer { coordinator.stop() }
        let log = UpdateLog()
        let started = ContinuousClock.now
        #expect(await coordinator.start(local: testCredentials("seed"), updates: log.sink) == nil)
        let startTook = ContinuousClock.now - started
        #expect(startTook >= .milliseconds(140) && startTook < .seconds(5), "start took \(startTook)")
        #expect(log.updates.contains { if case .problem = $0 { true } else { false } })
        let asked = ContinuousClock.now
        guard
            case .unavailable = await coordinator.beginRefresh(
                .init(failedGeneration: 0, timeout: .seconds(5), limit: nil))
        else { return recordFailure("expected unavailable") }
        // Known down: later calls do not wait for the dead server again.
        #expect(ContinuousClock.now - asked < .seconds(1))
    }

    @Test func anIdleCoordinatorSendsNoCommands() async throws {
        let server = try RedisServerFixture()
        let coordinators = try (0..<3).map { _ in try coordinator(server) }
        defer { coordinators.forEach { $0.stop() } }
        for coordinator in coordinators {
            _ = await coordinator.start(local: testCredentials("seed"), updates: { _ in })
        }
        try await Task.sleep(for: .milliseconds(200))
        let before = try server.commandCalls()
        try await Task.sleep(for: .milliseconds(500))
        let after = try server.commandCalls()
        let ignored: Set = ["info", "quit", "auth"]
        let sent = after.filter { !ignored.contains($0.key) && $0.value != before[$0.key] }
        #expect(sent.isEmpty, "commands while idle: \(sent)")
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
