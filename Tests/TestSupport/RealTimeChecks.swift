import Foundation
import ResponsePolicy
import Testing

// The wall-time checks that the lock-file and Redis coordinators' real-time suites make alike
// (`.ci/run` runs both suites in its real-time step). What needs no wall time is checked once, for
// every store, by CoordinationConformanceTests.

/// A holder whose lease lapsed (it never ended, as if it died or froze) loses it: `next` is granted
/// a lease once it expires, not before, with a larger fencing token. Whose pair is kept is not the
/// lease's to decide (issue 30): the first publication from the generation is stored (the late
/// holder's here: its token call was answered first, so its pair is the newest the server issued),
/// and the other is refused with the stored one.
///
/// `slow` is made with a 150 ms lease, `next` with a long one, both on one fresh, seeded store.
public func expectAnExpiredLeaseIsGrantedAgainAndTheFirstPublicationWins(
    slow: any SessionCoordinator, next: any SessionCoordinator, sourceLocation: SourceLocation = #_sourceLocation
) async {
    let started = ContinuousClock.now  // before the lease is granted: it expires 150 ms after this at the earliest
    guard
        // Its refresh timeout within its lease: a lease is never shorter than the refresh it covers.
        case .lease(let stale) = await slow.beginRefresh(
            .init(failedGeneration: 0, timeout: .milliseconds(100), limit: nil))
    else { return recordFailure("no lease", sourceLocation: sourceLocation) }
    guard
        case .lease(let fresh) = await next.beginRefresh(.init(failedGeneration: 0, timeout: .seconds(2), limit: nil))
    else { return recordFailure("no lease after expiry", sourceLocation: sourceLocation) }
    let waited = ContinuousClock.now - started
    #expect(waited >= .milliseconds(140) && waited < .seconds(5), "waited \(waited)", sourceLocation: sourceLocation)
    #expect(fresh.fencingToken > stale.fencingToken, sourceLocation: sourceLocation)
    #expect(
        await slow.publish(testCredentials("late"), with: stale)
            == .published(SharedSession(credentials: testCredentials("late"), generation: 1)),
        sourceLocation: sourceLocation)
    #expect(
        await next.publish(testCredentials("fresh"), with: fresh)
            == .leaseLost(current: SharedSession(credentials: testCredentials("late"), generation: 1)),
        sourceLocation: sourceLocation)
    // The same pair again (a retry whose answer was lost) is answered as stored.
    #expect(
        await slow.publish(testCredentials("late"), with: stale)
            == .published(SharedSession(credentials: testCredentials("late"), generation: 1)),
        sourceLocation: sourceLocation)
}

/// `origin` publishes a logout until `until`; each of `logs` (the other processes' updates) hears
/// it within a second (100 ms in isolation, see policy-bench's coordination figures; generous for
/// a loaded CI machine). Returns what each heard, in the order of `logs` (`nil`: nothing).
public func expectALogoutHeardWithinASecond(
    from origin: any SessionCoordinator, by logs: [UpdateLog], until: Date,
    sourceLocation: SourceLocation = #_sourceLocation
) async -> [SessionUpdate?] {
    let sent = ContinuousClock.now
    await origin.publishLogout(until: until, reason: "rule session-revoked")
    var heard: [SessionUpdate?] = []
    for log in logs {
        let found = await log.first(within: .seconds(1)) { if case .loggedOut = $0 { true } else { false } }
        if let (_, at) = found {
            #expect(at - sent < .seconds(1), "heard after \(at - sent)", sourceLocation: sourceLocation)
        } else {
            recordFailure("no logout update", sourceLocation: sourceLocation)
        }
        heard.append(found?.0)
    }
    return heard
}
