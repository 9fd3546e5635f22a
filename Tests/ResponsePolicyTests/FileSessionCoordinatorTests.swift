import CoordinationTestSupport
import Foundation
import ResponsePolicy
import TestGate
import Testing

/// The lock-file coordinator: several coordinators on one credentials file, as processes on one
/// host would use it (the multi-process cases are in ``CoordinatorProcessTests``).
@Suite(.realTimeStep, .loadGate(.realTime))
struct FileSessionCoordinatorTests {
    let folder: URL

    init() throws {
        folder = FileManager.default.temporaryDirectory.appendingPathComponent("file-coordinator-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
    }

    var credentialsPath: String { folder.appendingPathComponent("credentials.json").path }

    func coordinator(lease: Duration = .seconds(15)) throws -> FileSessionCoordinator {
        try FileSessionCoordinator(.init(path: credentialsPath, lease: lease))
    }

    @Test func manyCoordinatorsMeetingOneExpiredTokenMakeOneRefresh() async throws {
        let coordinators = try (0..<6).map { _ in try coordinator() }
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
        let expected = SharedSession(credentials: testCredentials("refreshed-1"), generation: 1)
        for turn in turns {
            switch turn {
            case .lease: break
            case .published(let session), .newer(let session): #expect(session == expected)
            default: Issue.record("unexpected turn \(turn)")
            }
        }
        // The shared state holds tokens: only its owner may read it.
        let attributes = try FileManager.default.attributesOfItem(atPath: credentialsPath + ".shared")
        #expect((attributes[.posixPermissions] as? NSNumber)?.intValue == 0o600)
    }

    @Test func theFirstProcessSeedsAndTheFileWinsAfterwards() async throws {
        let first = try coordinator()
        let second = try coordinator()
        defer { first.stop(); second.stop() }
        #expect(await first.start(local: testCredentials("first"), updates: { _ in }) == nil)
        #expect(
            await second.start(local: testCredentials("stale"), updates: { _ in })
                == SharedSession(credentials: testCredentials("first"), generation: 0))
    }

    @Test func aPublicationReachesTheOthersAsAnUpdate() async throws {
        let publisher = try coordinator()
        let listener = try coordinator()
        defer { publisher.stop(); listener.stop() }
        let log = UpdateLog()
        _ = await publisher.start(local: testCredentials("seed"), updates: { _ in })
        _ = await listener.start(local: nil, updates: log.sink)
        guard
            case .lease(let lease) = await publisher.beginRefresh(
                .init(failedGeneration: 0, timeout: .seconds(1), limit: nil))
        else { return recordFailure("no lease") }
        _ = await publisher.publish(testCredentials("new"), with: lease)
        let update = await log.first(within: .seconds(2)) { if case .credentials = $0 { true } else { false } }
        #expect(update?.0 == .credentials(SharedSession(credentials: testCredentials("new"), generation: 1)))
    }

    @Test func aHolderWhoseLeaseExpiredPublishesNothing() async throws {
        let slow = try coordinator(lease: .milliseconds(150))
        let next = try coordinator()  // its own lease is long: only the first one expires here
        defer { slow.stop(); next.stop() }
        _ = await slow.start(local: testCredentials("seed"), updates: { _ in })
        let started = ContinuousClock.now  // before the lease is granted: it expires 150 ms after this at the earliest
        guard
            // Its refresh timeout within its lease: a lease is never shorter than the refresh it covers.
            case .lease(let stale) = await slow.beginRefresh(
                .init(failedGeneration: 0, timeout: .milliseconds(100), limit: nil))
        else { return recordFailure("no lease") }
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
        let holder = try coordinator()
        let waiter = try coordinator()
        defer { holder.stop(); waiter.stop() }
        _ = await holder.start(local: testCredentials("seed"), updates: { _ in })
        _ = await waiter.start(local: nil, updates: { _ in })
        guard
            case .lease(let lease) = await holder.beginRefresh(
                .init(failedGeneration: 0, timeout: .seconds(1), limit: nil))
        else { return recordFailure("no lease") }
        async let waiting = waiter.beginRefresh(.init(failedGeneration: 0, timeout: .seconds(3), limit: nil))
        try await Task.sleep(for: .milliseconds(50))
        await holder.endRefresh(lease, failure: "the token endpoint answered 400 invalid_grant")
        #expect(await waiting == .failedElsewhere("the token endpoint answered 400 invalid_grant"))
    }

    @Test func theRefreshLimitCountsAcrossProcesses() async throws {
        let coordinators = try (0..<3).map { _ in try coordinator() }
        defer { coordinators.forEach { $0.stop() } }
        // A window far longer than any stall: in a full parallel run on two busy cores the three
        // turns took more than 30 s of real time, and the first grant left a 30 s window.
        let limit = (count: 2, per: Duration.seconds(3600))
        var turns: [String] = []
        for coordinator in coordinators {
            let turn = await coordinator.beginRefresh(.init(failedGeneration: 0, timeout: .seconds(1), limit: limit))
            if case .lease(let lease) = turn { await coordinator.endRefresh(lease, failure: nil) }
            let name = if case .lease = turn { "lease" } else { "\(turn)" }
            turns.append(name)
        }
        #expect(turns == ["lease", "lease", "limited"])
    }

    @Test func aLogoutReachesTheOthersWithin100Milliseconds() async throws {
        let origin = try coordinator()
        let others = try (0..<3).map { _ in try coordinator() }
        defer { origin.stop(); others.forEach { $0.stop() } }
        let logs = others.map { _ in UpdateLog() }
        _ = await origin.start(local: testCredentials("seed"), updates: { _ in })
        for (other, log) in zip(others, logs) { _ = await other.start(local: nil, updates: log.sink) }
        try await Task.sleep(for: .milliseconds(50))
        let until = Date().addingTimeInterval(30)
        let sent = ContinuousClock.now
        await origin.publishLogout(until: until, reason: "rule session-revoked")
        for log in logs {
            let heard = await log.first(within: .seconds(1)) { if case .loggedOut = $0 { true } else { false } }
            guard let (_, at) = heard else { return recordFailure("no logout update") }
            // 100 ms in isolation; generous here for a loaded CI machine.
            #expect(at - sent < .seconds(1), "heard after \(at - sent)")
        }
        let signedIn = await origin.publishSignIn(testCredentials("again"))
        #expect(signedIn == SharedSession(credentials: testCredentials("again"), generation: 1))
    }

    @Test func aLockHeldTooLongAnswersUnavailableWithinTheConnectTimeout() async throws {
        let coordinator = try FileSessionCoordinator(
            .init(path: credentialsPath, connectTimeout: .milliseconds(100)))
        defer { coordinator.stop() }
        let log = UpdateLog()
        _ = await coordinator.start(local: testCredentials("seed"), updates: log.sink)
        // Another process holds the lock and hangs.
        let descriptor = open(credentialsPath + ".lock", O_RDWR)
        #expect(flock(descriptor, LOCK_EX) == 0)
        let started = ContinuousClock.now
        let turn = await coordinator.beginRefresh(.init(failedGeneration: 0, timeout: .seconds(5), limit: nil))
        // The request's own timeout (5 s) is what an unbounded wait would cost; the margin over the
        // 100 ms connect timeout is scheduling on a machine the whole suite shares.
        #expect(ContinuousClock.now - started < .seconds(5))
        guard case .unavailable = turn else { return recordFailure("expected unavailable, got \(turn)") }
        #expect(log.updates.contains { if case .problem = $0 { true } else { false } })
        close(descriptor)
        guard case .lease = await coordinator.beginRefresh(.init(failedGeneration: 0, timeout: .seconds(1), limit: nil))
        else { return recordFailure("no lease once the lock is free") }
        #expect(log.updates.last == .recovered)
    }
}
