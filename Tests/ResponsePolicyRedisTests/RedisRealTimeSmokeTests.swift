import Foundation
import ResponsePolicy
import ResponsePolicyRedis
import TestGate
import TestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// The Redis coordinator's bounds in wall time, against a real `redis-server`: a lease that
/// lapses, a wait bounded by the request's timeout, a logout heard within a bound, a server killed,
/// unreachable or silent answered within `connect-timeout`, an idle process that sends nothing.
/// They measure real time, so `.ci/run` runs them in its real-time step, alone.
@Suite(
    .measuresRealTime(filter: "RedisRealTimeSmokeTests"), .loadGate(.realTime),
    .enabled(if: RedisServerFixture.isInstalled, "needs redis-server: apt-get install redis-server"))
struct RedisRealTimeSmokeTests {
    @Test func anExpiredLeaseIsGrantedAgainAndTheFirstPublicationWins() async throws {
        let server = try RedisServerFixture()
        let slow = try server.coordinator(lease: .milliseconds(150))
        let next = try server.coordinator()  // its own lease is long: only the first one expires here
        defer { slow.stop(); next.stop() }
        _ = await slow.start(local: testCredentials("seed"), updates: { _ in })
        _ = await next.start(local: nil, updates: { _ in })
        await expectAnExpiredLeaseIsGrantedAgainAndTheFirstPublicationWins(slow: slow, next: next)
    }

    @Test func aWaitIsBoundedByTheRequestTimeout() async throws {
        let server = try RedisServerFixture()
        let holder = try server.coordinator()
        let waiter = try server.coordinator()
        defer { holder.stop(); waiter.stop() }
        _ = await holder.start(local: testCredentials("seed"), updates: { _ in })
        guard case .lease = await holder.beginRefresh(.init(failedGeneration: 0, timeout: .seconds(1), limit: nil))
        else {
            return recordFailure("no lease")
        }
        let started = ContinuousClock.now
        let turn = await waiter.beginRefresh(.init(failedGeneration: 0, timeout: .milliseconds(200), limit: nil))
        #expect(turn == .failedElsewhere("another process's refresh did not finish within 200ms"))
        // Unbounded, it would wait for the lease (15 s); the margin over the 200 ms timeout is
        // scheduling on a machine the whole suite shares.
        #expect(ContinuousClock.now - started < .seconds(5))
    }

    @Test func aLogoutReachesTheOthersWithin100Milliseconds() async throws {
        let server = try RedisServerFixture()
        let origin = try server.coordinator()
        let others = try (0..<3).map { _ in try server.coordinator() }
        defer { origin.stop(); others.forEach { $0.stop() } }
        let logs = others.map { _ in UpdateLog() }
        _ = await origin.start(local: testCredentials("seed"), updates: { _ in })
        for (other, log) in zip(others, logs) { _ = await other.start(local: nil, updates: log.sink) }
        #expect(await server.waitForSubscribers(4, on: RedisServerFixture.channel()))
        let until = Date().addingTimeInterval(30)
        for update in await expectALogoutHeardWithinASecond(from: origin, by: logs, until: until) {
            if case .loggedOut(let heardUntil, let reason)? = update {
                #expect(abs(heardUntil.timeIntervalSince(until)) < 0.002)
                #expect(reason == "rule session-revoked")
            }
        }
        // Late joiners and the sign-in that ends it: CoordinationConformanceTests (no wall time).
    }

    @Test func redisKilledMidRunAnswersUnavailableInTimeThenRecovers() async throws {
        let server = try RedisServerFixture()
        let coordinator = try server.coordinator(connectTimeout: .milliseconds(200))
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
        let coordinators = try (0..<3).map { _ in try server.coordinator() }
        defer { coordinators.forEach { $0.stop() } }
        for coordinator in coordinators {
            _ = await coordinator.start(local: testCredentials("seed"), updates: { _ in })
        }
        // Ready: each subscriber is in place and has re-read the session once (its `EVAL`).
        #expect(await server.waitForSubscribers(3, on: RedisServerFixture.channel()))
        #expect(await server.waitForCalls("eval", atLeast: 3))
        let before = try server.commandCalls()
        try await Task.sleep(for: .milliseconds(500))
        let after = try server.commandCalls()
        let ignored: Set = ["info", "quit", "auth"]
        let sent = after.filter { !ignored.contains($0.key) && $0.value != before[$0.key] }
        #expect(sent.isEmpty, "commands while idle: \(sent)")
    }
}
