import Foundation
import ResponsePolicy
import TestGate
import TestSupport
import Testing

/// The lock-file coordinator's bounds in wall time and what only it has (a lock file, a file's
/// permissions): several coordinators on one credentials file, as processes on one host would use
/// it (the multi-process cases are in ``CoordinatorProcessTests``). What every store does is checked
/// once, for each store, by ``CoordinationConformanceTests``.
@Suite(.measuresRealTime(filter: "FileSessionCoordinatorTests"), .loadGate(.realTime))
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

    @Test func theSharedStateIsReadableByItsOwnerOnly() async throws {
        let coordinator = try coordinator()
        defer { coordinator.stop() }
        _ = await coordinator.start(local: testCredentials("seed"), updates: { _ in })
        guard
            case .lease(let lease) = await coordinator.beginRefresh(
                .init(failedGeneration: 0, timeout: .seconds(1), limit: nil))
        else { return recordFailure("no lease") }
        _ = await coordinator.publish(testCredentials("new"), with: lease)
        // It holds tokens.
        let attributes = try FileManager.default.attributesOfItem(atPath: credentialsPath + ".shared")
        #expect((attributes[.posixPermissions] as? NSNumber)?.intValue == 0o600)
    }

    @Test func anExpiredLeaseIsGrantedAgainAndTheFirstPublicationWins() async throws {
        let slow = try coordinator(lease: .milliseconds(150))
        let next = try coordinator()  // its own lease is long: only the first one expires here
        defer { slow.stop(); next.stop() }
        _ = await slow.start(local: testCredentials("seed"), updates: { _ in })
        await expectAnExpiredLeaseIsGrantedAgainAndTheFirstPublicationWins(slow: slow, next: next)
    }

    @Test func aLogoutReachesTheOthersWithin100Milliseconds() async throws {
        let origin = try coordinator()
        let others = try (0..<3).map { _ in try coordinator() }
        defer { origin.stop(); others.forEach { $0.stop() } }
        let logs = others.map { _ in UpdateLog() }
        _ = await origin.start(local: testCredentials("seed"), updates: { _ in })
        for (other, log) in zip(others, logs) { _ = await other.start(local: nil, updates: log.sink) }
        _ = await expectALogoutHeardWithinASecond(from: origin, by: logs, until: Date().addingTimeInterval(30))
        // Late joiners and the sign-in that ends it: CoordinationConformanceTests (no wall time).
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
