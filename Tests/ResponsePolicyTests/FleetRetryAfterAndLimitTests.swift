import Foundation
import Testing

@testable import ResponsePolicy

/// `Retry-After` and `refresh.limit` across a fleet (issue 29), on the protocol's value
/// (``CoordinationRecord``) and its file form (the flight's turn events are driven in
/// `RefreshFlightModelTests`): a holder's wait holds every process, and the limit counts only
/// loops the server shows.
struct FleetRetryAfterAndLimitTests {
    static let t0: Int64 = 1_800_000_000_000

    static func record(generation: UInt64 = 3, epoch: UInt64 = 0) -> CoordinationRecord {
        var record = CoordinationRecord()
        record.generation = generation
        record.epoch = epoch
        record.credentials = Credentials(accessToken: "a\(generation)", refreshToken: "r\(generation)")
        return record
    }

    static func granted(_ answer: CoordinationRecord.Begin) -> RefreshLease? {
        if case .granted(let lease) = answer { return lease }
        return nil
    }

    // MARK: - Retry-After

    @Test func aHoldersRetryAfterHoldsEveryLeaseUntilItEnds() throws {
        var record = Self.record()
        let lease = try #require(
            Self.granted(record.begin(failedGeneration: 3, leaseMs: 11_000, limit: nil, holder: 1, now: Self.t0)))
        record.end(lease, failure: "HTTP 429", retryAfter: Self.t0 + 30_000, now: Self.t0 + 50)
        // Any process, any time before the end: no lease, the end and the reason.
        for (holder, at) in [(2, Self.t0 + 100), (3, Self.t0 + 10_000), (1, Self.t0 + 29_999)] as [(Int64, Int64)] {
            let turn = record.begin(failedGeneration: 3, leaseMs: 11_000, limit: nil, holder: holder, now: at)
            #expect(turn == .embargoed(untilMs: Self.t0 + 30_000, reason: "HTTP 429"))
        }
        // A waiter on the holder's lease is not told "failed elsewhere" while the wait runs: it asks
        // again and is told how long.
        #expect(record.outcome(for: lease.fencingToken, failedGeneration: 3, now: Self.t0 + 100) == nil)
        // At the end: one lease.
        let next = Self.granted(
            record.begin(failedGeneration: 3, leaseMs: 11_000, limit: nil, holder: 2, now: Self.t0 + 30_000))
        #expect((next?.fencingToken ?? 0) > lease.fencingToken)
        // Newer credentials are never held back by it.
        var published = Self.record()
        published.end(lease, failure: "HTTP 429", retryAfter: Self.t0 + 30_000, now: Self.t0)
        published.generation = 4
        if case .newer = published.begin(failedGeneration: 3, leaseMs: 11_000, limit: nil, holder: 2, now: Self.t0 + 1)
        {
        } else {
            Issue.record("a newer generation must be answered, embargo or not")
        }
    }

    @Test func aLaterWaitWinsAndAShorterOneNeverShortensIt() {
        var record = Self.record()
        let lease = RefreshLease(fencingToken: 1, generation: 3)
        record.end(lease, failure: "first", retryAfter: Self.t0 + 30_000, now: Self.t0)
        record.end(lease, failure: "shorter", retryAfter: Self.t0 + 5_000, now: Self.t0)
        #expect(record.embargo == .init(until: Self.t0 + 30_000, reason: "first"))
        record.end(lease, failure: "longer", retryAfter: Self.t0 + 60_000, now: Self.t0)
        #expect(record.embargo == .init(until: Self.t0 + 60_000, reason: "longer"))
        // A wait already over is replaced by any new one; one in the past is not stored.
        record.end(lease, failure: "past", retryAfter: Self.t0 - 1, now: Self.t0 + 70_000)
        #expect(record.embargo?.reason == "longer")
        record.end(lease, failure: "after", retryAfter: Self.t0 + 71_000, now: Self.t0 + 70_000)
        #expect(record.embargo == .init(until: Self.t0 + 71_000, reason: "after"))
        // A sign-in ends it (the token endpoint answered).
        _ = record.signIn(Credentials(accessToken: "s", refreshToken: "s"))
        #expect(record.embargo == nil)
    }

    /// A forged or corrupted end (a year ahead, written by anyone who can write the store) holds
    /// refreshes no longer than the longest wait the engine obeys from when it is read.
    @Test func aWaitFarAheadIsCutToTheLongestTheEngineObeys() {
        var record = Self.record()
        let longest = CoordinationRecord.longestEmbargoMs
        record.end(
            RefreshLease(fencingToken: 1, generation: 3), failure: "x", retryAfter: Self.t0 + 365 * 86_400_000,
            now: Self.t0)
        #expect(record.embargo?.until == Self.t0 + longest)
        record.embargo = .init(until: Self.t0 + 365 * 86_400_000, reason: "forged")
        let turn = record.begin(failedGeneration: 3, leaseMs: 1_000, limit: nil, holder: 1, now: Self.t0)
        #expect(turn == .embargoed(untilMs: Self.t0 + longest, reason: "forged"))
        #expect(record.embargo?.until == Self.t0 + longest)
        #expect(longest == TokenAnswer.maxRequestedWait.milliseconds())
    }

    // MARK: - refresh.limit

    /// The rule of one process, fleet-wide: a generation counts when a process saw its token
    /// refused, it is the newest, a refresh made it, and no process saw it accepted; once.
    @Test func theLimitCountsGenerationsRefusedBeforeAnyAcceptanceOnce() {
        let limit = (count: 2, perMs: Int64(60_000))
        var record = Self.record(generation: 0)
        var now = Self.t0
        // The initial token: never counted, however often it is refused.
        for _ in 0..<5 {
            now += 10
            guard
                let lease = Self.granted(
                    record.begin(failedGeneration: 0, leaseMs: 1_000, limit: limit, holder: 1, now: now))
            else { Issue.record("the initial token must never be limited"); return }
            // A failed refresh: no generation, nothing counted.
            record.end(lease, failure: "HTTP 503")
        }
        #expect(record.loops.isEmpty)
        // Generation 1, made by a refresh, refused at once: counted once, however many ask.
        let first = Self.granted(record.begin(failedGeneration: 0, leaseMs: 1_000, limit: limit, holder: 1, now: now))!
        _ = record.publish(Credentials(accessToken: "a1", refreshToken: "r1"), with: first, now: now)
        for holder in 1...4 as ClosedRange<Int64> {
            now += 10
            let answer = record.begin(failedGeneration: 1, leaseMs: 1_000, limit: limit, holder: holder, now: now)
            if let lease = Self.granted(answer) { record.end(lease, failure: "HTTP 503") }
        }
        #expect(record.loops.map(\.generation) == [1])
        // Generation 2 refused too: the second loop reaches the limit, and nobody refreshes.
        let second = Self.granted(record.begin(failedGeneration: 1, leaseMs: 1_000, limit: limit, holder: 1, now: now))!
        _ = record.publish(Credentials(accessToken: "a2", refreshToken: "r2"), with: second, now: now)
        let limited = record.begin(failedGeneration: 2, leaseMs: 1_000, limit: limit, holder: 2, now: now + 1)
        #expect(limited == .limited)
        // A process saw generation 2 accepted: it was no loop, the limit has room again.
        let acceptedNow = record.accept(2)
        #expect(acceptedNow)
        #expect(record.loops.map(\.generation) == [1])
        let again = record.begin(failedGeneration: 2, leaseMs: 1_000, limit: limit, holder: 2, now: now + 2)
        #expect(Self.granted(again) != nil)
        // Told twice, or of a generation the store does not hold: nothing changes.
        let twice = record.accept(2)
        let unknown = record.accept(9)
        #expect(!twice && !unknown)
    }

    @Test func aSignInsTokenAndAnAcceptedGenerationNeverCount() {
        let limit = (count: 1, perMs: Int64(60_000))
        // The sign-in's own generation (the epoch): the initial token of that session.
        var signedIn = Self.record(generation: 5, epoch: 5)
        let signInTurn = signedIn.begin(failedGeneration: 5, leaseMs: 1_000, limit: limit, holder: 1, now: Self.t0)
        #expect(Self.granted(signInTurn) != nil)
        // Accepted before anyone saw it refused.
        var accepted = Self.record(generation: 4)
        accepted.accept(4)
        let acceptedTurn = accepted.begin(failedGeneration: 4, leaseMs: 1_000, limit: limit, holder: 1, now: Self.t0)
        #expect(Self.granted(acceptedTurn) != nil)
        // Without a limit (a refresh ahead, or a process that saw the token accepted): not counted.
        var ahead = Self.record(generation: 4)
        _ = ahead.begin(failedGeneration: 4, leaseMs: 1_000, limit: nil, holder: 1, now: Self.t0)
        #expect(ahead.loops.isEmpty)
        // Counted: refused, made by a refresh, accepted nowhere.
        var loop = Self.record(generation: 4)
        let loopTurn = loop.begin(failedGeneration: 4, leaseMs: 1_000, limit: limit, holder: 1, now: Self.t0)
        #expect(loopTurn == .limited)
    }

    /// Random fleets: whatever the order of refreshes, failures, acceptances and triggers, the
    /// loops counted are exactly the generations that were refused while newest, made by a
    /// refresh, and never accepted (within the window), and `limited` is answered only then.
    @Test(arguments: [1, 2, 3, 4, 5] as [UInt64])
    func theLimitCountsWhatTheModelSays(seed: UInt64) {
        var random = SeededGenerator(seed: seed)
        var record = Self.record(generation: 0)
        var now = Self.t0
        let limit = (count: 3, perMs: Int64(5_000))
        var refused: [UInt64: Int64] = [:]  // generation -> first refusal seen
        var accepted: Set<UInt64> = []
        var limitedAnswers = 0
        for step in 0..<3_000 {
            now += Int64.random(in: 0...300, using: &random)
            switch Int.random(in: 0..<10, using: &random) {
            case 0..<5:
                let reactive = Bool.random(using: &random)
                let failed = record.generation
                let answer = record.begin(
                    failedGeneration: failed, leaseMs: 200, limit: reactive ? limit : nil, holder: 1, now: now)
                let isLoop = reactive && failed > record.epoch && !accepted.contains(failed)
                if isLoop, refused[failed].map({ $0 > now - limit.perMs }) != true { refused[failed] = now }
                let inWindow = refused.filter { $0.value > now - limit.perMs && !accepted.contains($0.key) }
                if answer == .limited { limitedAnswers += 1 }
                #expect(
                    (answer == .limited) == (isLoop && inWindow.count >= limit.count),
                    "seed \(seed) step \(step): \(answer), \(inWindow.count) loops in the window")
                if let lease = Self.granted(answer) {
                    if Bool.random(using: &random) {
                        _ = record.publish(
                            Credentials(accessToken: "a\(step)", refreshToken: "r\(step)"), with: lease, now: now)
                    } else {
                        record.end(lease, failure: "HTTP 503")
                    }
                }
                if reactive {
                    #expect(Set(record.loops.map(\.generation)) == Set(inWindow.keys), "seed \(seed) step \(step)")
                }
            case 5..<8:
                let generation = record.generation
                if record.accept(generation) || record.accepted >= generation { accepted.insert(generation) }
            case 8:
                _ = record.signIn(Credentials(accessToken: "s\(step)", refreshToken: "s\(step)"))
            default:
                now += 6_000
            }
        }
        #expect(limitedAnswers > 0, "seed \(seed): the limit was never reached")
    }

    // MARK: - The file form

    @Test func theFileRecordKeepsTheWaitTheLoopsAndTheAcceptedGenerationSealed() throws {
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("fleet-ra-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: folder) }
        let path = folder.appendingPathComponent("creds.shared").path
        var record = Self.record(generation: 4, epoch: 1)
        record.embargo = .init(until: Self.t0 + 30_000, reason: "HTTP 429 Too Many Requests")
        record.loops = [.init(generation: 3, at: Self.t0 - 5), .init(generation: 4, at: Self.t0)]
        record.accepted = 2
        let signer = SharedStateSigner(key: Data("k".utf8), scope: "file:test")
        #expect(FileSessionCoordinator.write(record, to: path, signer: signer) == nil)
        let read = try FileSessionCoordinator.read(path, signer: signer).get()
        #expect(read == record)
        // Sealed like every field: a wait stretched by hand is refused.
        var text = try String(contentsOfFile: path, encoding: .utf8)
        text = text.replacingOccurrences(of: "\(Self.t0 + 30_000)", with: "\(Self.t0 + 90_000_000)")
        try text.write(toFile: path, atomically: false, encoding: .utf8)
        if case .success = FileSessionCoordinator.read(path, signer: signer) {
            Issue.record("a forged Retry-After end must be refused under a key")
        }
    }
}
