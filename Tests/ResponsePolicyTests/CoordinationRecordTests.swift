import Foundation
import TestSupport
import Testing

@testable import ResponsePolicy

#if canImport(Glibc)
    import Glibc
#endif

/// The lease protocol as a value (``CoordinationRecord``), the shared-state codecs and the state
/// file's defences: random event sequences against the invariants, hostile values, hostile files.
struct CoordinationRecordTests {
    /// Random fleets: holders ask for turns, refresh for a while (never longer than the refresh
    /// timeout), publish or fail, die; time moves. Whatever the order, no refresh token (the
    /// credentials of one generation) is presented by two live holders, generations only grow,
    /// and every publication the record accepts came from the newest lease.
    @Test(arguments: [1, 2, 3, 4, 5, 6, 7, 8] as [UInt64])
    func noTwoLiveHoldersPresentOneRefreshToken(seed: UInt64) {
        var random = SeededGenerator(seed: seed)
        var record = CoordinationRecord()
        record.credentials = Credentials(accessToken: "a0", refreshToken: "r0")
        let timeoutMs: Int64 = 1000
        let leaseMs = RefreshTurnRequest(failedGeneration: 0, timeout: .milliseconds(timeoutMs), limit: nil)
            .leaseLength(configured: .milliseconds(Int64.random(in: 1...3000, using: &random))).milliseconds()
        struct Holder {
            var lease: RefreshLease?
            var finishesAt: Int64 = 0
            /// Its refresh call is over (answered, or the process died): it presents nothing now.
            var done = false
            var knownGeneration: UInt64 = 0
        }
        var holders = Array(repeating: Holder(), count: 5)
        var now: Int64 = 1_000_000
        var presenting: [UInt64: Int] = [:]  // generation -> holders presenting its refresh token now
        var lastGeneration: UInt64 = 0
        for step in 0..<4000 {
            now += Int64.random(in: 0...120, using: &random)
            for index in holders.indices where !holders[index].done {
                guard let lease = holders[index].lease, now >= holders[index].finishesAt else { continue }
                holders[index].done = true
                presenting[lease.generation, default: 1] -= 1
            }
            let index = Int.random(in: 0..<holders.count, using: &random)
            var holder = holders[index]
            if let lease = holder.lease {
                if holder.done {
                    // The answer is published (perhaps late: the fencing decides) or the refresh failed.
                    if Bool.random(using: &random) {
                        let before = record.generation
                        let result = record.publish(
                            Credentials(accessToken: "a\(step)", refreshToken: "r\(step)"), with: lease, now: now)
                        if case .published(let session) = result {
                            // Stored only when nobody published since the lease was granted: one
                            // publication per generation, never over a newer one.
                            #expect(before == lease.generation, "a publication over a newer generation")
                            holder.knownGeneration = session.generation
                        }
                    } else {
                        // Sometimes the token endpoint asked to wait (Retry-After): no grant before it ends.
                        let wait =
                            Int.random(in: 0..<4, using: &random) == 0
                            ? now + Int64.random(in: 1...3_000, using: &random) : nil
                        record.end(lease, failure: "failed", retryAfter: wait, now: now)
                    }
                    holder.lease = nil
                } else if Int.random(in: 0..<50, using: &random) == 0 {
                    // Killed mid-refresh: it presents nothing more and never reports back.
                    holder.done = true
                    presenting[lease.generation, default: 1] -= 1
                    holder.lease = nil
                }
            } else {
                switch record.begin(
                    failedGeneration: holder.knownGeneration, leaseMs: leaseMs, limit: nil, holder: Int64(index),
                    now: now)
                {
                case .granted(let lease):
                    presenting[lease.generation, default: 0] += 1
                    #expect(presenting[lease.generation] == 1, "seed \(seed) step \(step): two live presenters")
                    holder.lease = lease
                    holder.done = false
                    // A live holder's refresh is bounded by the refresh timeout.
                    holder.finishesAt = now + Int64.random(in: 1...timeoutMs, using: &random)
                case .newer(let session): holder.knownGeneration = session.generation
                case .wait, .limited, .embargoed, .behind: break
                }
            }
            holders[index] = holder
            #expect(record.generation >= lastGeneration)
            lastGeneration = record.generation
        }
    }

    /// Random sign-ins, refreshes and logouts, each logout decided in an epoch some process knew
    /// (the current one, or one a later sign-in ended that the process had not heard of): a logout
    /// decided before the last sign-in never changes the record; one decided in its epoch starts or
    /// lengthens the cooldown as before. Refreshes keep the epoch, sign-ins start one.
    @Test(arguments: [1, 2, 3] as [UInt64])
    func aLogoutDecidedBeforeTheLastSignInChangesNothing(seed: UInt64) {
        var random = SeededGenerator(seed: seed)
        var record = CoordinationRecord()
        record.credentials = Credentials(accessToken: "a0", refreshToken: "r0")
        var epochs: [UInt64] = [0]
        var now: Int64 = 1_000_000
        var refused = 0
        var applied = 0
        for step in 0..<2000 {
            now += Int64.random(in: 0...500, using: &random)
            switch Int.random(in: 0..<6, using: &random) {
            case 0:
                let session = record.signIn(Credentials(accessToken: "a\(step)", refreshToken: "r\(step)"))
                #expect(record.epoch == session.generation && record.loggedOutUntil == nil)
                epochs.append(record.epoch)
            case 1:
                let epoch = record.epoch
                if case .granted(let lease) = record.begin(
                    failedGeneration: record.generation, leaseMs: 1000, limit: nil, holder: 1, now: now)
                {
                    _ = record.publish(Credentials(accessToken: "p\(step)"), with: lease, now: now)
                }
                #expect(record.epoch == epoch, "seed \(seed) step \(step): a refresh moved the epoch")
            default:
                let decided = epochs.randomElement(using: &random) ?? 0
                let before = record
                let until = now + Int64.random(in: 1...30_000, using: &random)
                let changed = record.logout(until: until, epoch: decided)
                if decided < before.epoch {
                    #expect(!changed && record == before, "seed \(seed) step \(step): a stale logout was stored")
                    refused += 1
                } else {
                    #expect(changed == (until > (before.loggedOutUntil ?? 0)), "seed \(seed) step \(step)")
                    #expect(record.loggedOutUntil == max(until, before.loggedOutUntil ?? 0))
                    applied += 1
                }
            }
        }
        // Both kinds of logout were met, so both checks ran.
        #expect(refused > 0 && applied > 0)
    }

    /// Whose pair is kept is not the lease's to decide (issue 30): the token endpoint issues one
    /// pair per refresh token, so the first publication from a generation is stored, lapsed or
    /// not, and any later one from that generation is refused with it.
    @Test func thePublicationStoredIsTheFirstFromItsGeneration() {
        var record = CoordinationRecord()
        guard case .granted(let first) = record.begin(failedGeneration: 0, leaseMs: 100, limit: nil, holder: 1, now: 0)
        else { Issue.record("no lease"); return }
        let fresh = Credentials(accessToken: "a1", refreshToken: "r1")
        // Lapsed, nobody else asked: the pair is stored (issue 19, invariant f).
        #expect(
            record.publish(fresh, with: first, now: 500) == .published(SharedSession(credentials: fresh, generation: 1))
        )
        // The same pair again (its answer was lost on the way): answered as stored.
        #expect(
            record.publish(fresh, with: first, now: 510) == .published(SharedSession(credentials: fresh, generation: 1))
        )
        guard
            case .granted(let second) = record.begin(failedGeneration: 1, leaseMs: 100, limit: nil, holder: 1, now: 600),
            case .granted(let third) = record.begin(failedGeneration: 1, leaseMs: 100, limit: nil, holder: 2, now: 800)
        else { Issue.record("no lease"); return }
        #expect(third.fencingToken > second.fencingToken)
        // Lapsed and taken over, but nobody published since its grant: the late pair is kept (a pair
        // that arrives after a pause, a timeout or a freeze reaches the fleet) and the lease dropped.
        let late = Credentials(accessToken: "a2", refreshToken: "r2")
        #expect(
            record.publish(late, with: second, now: 850) == .published(SharedSession(credentials: late, generation: 2)))
        #expect(record.lease == nil)
        // The other holder of that generation is refused, with what is stored.
        guard case .leaseLost(let current) = record.publish(fresh, with: third, now: 860) else {
            Issue.record("accepted twice"); return
        }
        #expect(current?.credentials == late && current?.generation == 2)
    }

    // MARK: - A store that forgets (issue 30)

    /// FLUSHALL on a fleet at generation 5: the empty store answers `.behind`, never a lease on
    /// generation 0; the re-seed puts the newest pair back with a fencing counter past every token
    /// the process has seen and a quarantine, and the next grant is on generation 5.
    @Test func aStoreBehindWhatAProcessKnowsIsReSeededNeverGrantedAtAnOlderGeneration() {
        var record = CoordinationRecord()
        let knows = CoordinationRecord.Knowledge(generation: 5, fence: 12)
        #expect(
            record.begin(failedGeneration: 5, knows: knows, leaseMs: 1000, limit: nil, holder: 1, now: 0)
                == .behind(stored: 0))
        let pair = Credentials(accessToken: "a5", refreshToken: "r5")
        let seed = CoordinationRecord.Seed(
            credentials: pair, generation: 5, epoch: 3, fence: 12, lease: .init(fence: 0, leftMs: 1000))
        let reseeded = record.reseed(seed, now: 0)
        #expect(reseeded)
        #expect(record.generation == 5 && record.credentials == pair && record.epoch == 3 && record.fence == 12)
        // The quarantine: nobody holds it, everybody waits it out.
        #expect(
            record.begin(failedGeneration: 5, knows: knows, leaseMs: 1000, limit: nil, holder: 1, now: 10)
                == .wait(holder: 0, leftMs: 990))
        guard
            case .granted(let lease) = record.begin(
                failedGeneration: 5, knows: knows, leaseMs: 1000, limit: nil, holder: 1, now: 1000)
        else { Issue.record("no lease after the quarantine"); return }
        #expect(lease.generation == 5 && lease.fencingToken == 13)
        // A re-seed never takes a newer session back.
        let again = record.reseed(CoordinationRecord.Seed(credentials: pair, generation: 4), now: 1001)
        #expect(!again)
        #expect(record.generation == 5)
    }

    /// A holder's token call is at the server when the store forgets; another process re-seeds
    /// (at the holder's generation, or an older one it knew) with a quarantine. The holder's pair
    /// is stored when it arrives: a re-seed never wins over a holder's pending pair.
    @Test(arguments: [5, 4] as [UInt64])
    func aReSeedNeverWinsOverAHoldersPendingPair(reseededAt: UInt64) {
        var record = CoordinationRecord()
        record.generation = 5
        record.credentials = Credentials(accessToken: "a5", refreshToken: "r5")
        guard case .granted(let held) = record.begin(failedGeneration: 5, leaseMs: 1000, limit: nil, holder: 1, now: 0)
        else { Issue.record("no lease"); return }
        record = CoordinationRecord()  // FLUSHALL
        let older = Credentials(accessToken: "a\(reseededAt)", refreshToken: "r\(reseededAt)")
        record.reseed(.init(credentials: older, generation: reseededAt, lease: .init(fence: 0, leftMs: 1000)), now: 100)
        // The re-seeder waits; it is never granted a lease while the holder may still publish.
        #expect(
            record.begin(
                failedGeneration: reseededAt, knows: .init(generation: reseededAt), leaseMs: 1000, limit: nil,
                holder: 2, now: 200)
                == .wait(holder: 0, leftMs: 900))
        let pair = Credentials(accessToken: "a6", refreshToken: "r6")
        #expect(
            record.publish(pair, with: held, now: 300) == .published(SharedSession(credentials: pair, generation: 6)))
        guard
            case .newer(let session) = record.begin(
                failedGeneration: reseededAt, knows: .init(generation: reseededAt), leaseMs: 1000, limit: nil,
                holder: 2, now: 400)
        else { Issue.record("the holder's pair was not found"); return }
        #expect(session.credentials == pair)
    }

    /// A lease a process heard of is honoured for its term after the store forgot it (eviction of
    /// the lease key, a flush re-seeded by someone who did not hear it): put back, waited for, and
    /// only then is a lease granted, past its fencing token.
    @Test func aLeaseAProcessSawIsHonouredForItsTermAfterTheStoreForgotIt() {
        var record = CoordinationRecord()
        record.generation = 3
        record.credentials = Credentials(accessToken: "a3", refreshToken: "r3")
        let knows = CoordinationRecord.Knowledge(generation: 3, fence: 9, lease: .init(fence: 9, leftMs: 500))
        #expect(
            record.begin(failedGeneration: 3, knows: knows, leaseMs: 1000, limit: nil, holder: 2, now: 0)
                == .wait(holder: 9, leftMs: 500))
        #expect(record.lease?.fence == 9 && record.fence == 9)
        // Its term over: granted, with a larger token.
        guard
            case .granted(let lease) = record.begin(
                failedGeneration: 3, knows: .init(generation: 3, fence: 9), leaseMs: 1000, limit: nil, holder: 2,
                now: 500)
        else { Issue.record("no lease after the term"); return }
        #expect(lease.fencingToken == 10)
        // A lease heard of that the store saw end (a later one was granted since) is not put back.
        record.end(lease, failure: nil)
        #expect(
            record.begin(failedGeneration: 3, knows: knows, leaseMs: 1000, limit: nil, holder: 3, now: 600)
                == .granted(RefreshLease(fencingToken: 11, generation: 3)))
    }

    /// A sign-in on a store that forgot is numbered past what the signing process knows.
    @Test func aSignInIsNumberedPastWhatTheProcessKnows() {
        var record = CoordinationRecord()
        let session = record.signIn(Credentials(accessToken: "s"), after: 8)
        #expect(session.generation == 9 && session.epoch == 9 && record.epoch == 9)
    }

    /// Random fleets whose store forgets (everything, or the lease alone), with processes that
    /// remember what they heard (``CoordinationMemory``: every grant and publication is announced
    /// to the live processes) and re-seed the store when it is behind them. Holders present their
    /// refresh token to a model token server that issues one pair per token and counts a spent
    /// one presented again as a reuse. Killed holders die before their call reaches the server.
    /// Whatever the order: no reuse, no generation granted below the server's newest pair.
    @Test(arguments: [1, 2, 3, 4, 5, 6] as [UInt64])
    func aStoreThatForgetsNeverMakesAProcessPresentASpentToken(seed: UInt64) {
        var random = SeededGenerator(seed: seed)
        var record = CoordinationRecord()
        let leaseMs: Int64 = 1100
        let timeoutMs: Int64 = 1000
        struct Process {
            var memory = CoordinationMemory()
            var lease: RefreshLease?
            var answersAt: Int64 = 0
            var alive = true
        }
        var processes = Array(repeating: Process(), count: 4)
        var now: Int64 = 1_000_000
        for index in processes.indices {
            processes[index].memory.saw(
                SharedSession(credentials: Credentials(accessToken: "a0", refreshToken: "r0"), generation: 0))
            processes[index].memory.listening(since: now)
        }
        _ = record.join(local: Credentials(accessToken: "a0", refreshToken: "r0"), now: now)
        var issued: UInt64 = 0  // the server's newest pair
        var reuses = 0
        var forgets = 0
        var grants = 0
        func announce(_ change: (inout CoordinationMemory) -> Void, except holder: Int?) {
            for index in processes.indices where index != holder && processes[index].alive {
                change(&processes[index].memory)
            }
        }
        for _ in 0..<3000 {
            now += Int64.random(in: 0...150, using: &random)
            // Answers that are due: the server issues the next pair, the holder publishes at once.
            for index in processes.indices {
                guard processes[index].alive, let lease = processes[index].lease, now >= processes[index].answersAt
                else { continue }
                processes[index].lease = nil
                if lease.generation != issued {
                    reuses += 1
                    continue
                }
                issued += 1
                let pair = Credentials(accessToken: "a\(issued)", refreshToken: "r\(issued)")
                if case .published(let session) = record.publish(pair, with: lease, now: now) {
                    processes[index].memory.saw(session)
                    announce(
                        {
                            $0.saw(session); $0.heardEnd(fence: lease.fencingToken)
                        }, except: index)
                }
            }
            switch Int.random(in: 0..<20, using: &random) {
            case 0:
                forgets += 1
                record = CoordinationRecord()
            case 1:
                // volatile-* eviction: the keys with a time to live (Redis keeps the lease in the
                // session hash too, so it survives).
                record.loggedOutUntil = nil
                record.refreshes = []
            case 2:
                // A process dies (before its call reached the server) and a fresh one takes its
                // place, knowing only what it saved: the newest pair it had.
                let index = Int.random(in: 0..<processes.count, using: &random)
                var fresh = Process()
                if let newest = processes[index].memory.newest { fresh.memory.saw(newest) }
                fresh.memory.listening(since: now)
                processes[index] = fresh
            default:
                let index = Int.random(in: 0..<processes.count, using: &random)
                guard processes[index].lease == nil else { continue }
                var memory = processes[index].memory
                let failed = memory.generation
                var answer = record.begin(
                    failedGeneration: failed, knows: memory.knowledge(now: now), leaseMs: leaseMs, limit: nil,
                    holder: Int64(index), now: now)
                if case .behind = answer, let seed = memory.seed(now: now, leaseMs: leaseMs) {
                    if record.reseed(seed, now: now) {
                        let session = record.session(now: now)
                        announce({ $0.saw(session) }, except: index)
                    }
                    answer = record.begin(
                        failedGeneration: failed, knows: memory.knowledge(now: now), leaseMs: leaseMs, limit: nil,
                        holder: Int64(index), now: now)
                }
                switch answer {
                case .granted(let lease):
                    grants += 1
                    #expect(
                        lease.generation == issued,
                        "seed \(seed): a grant on generation \(lease.generation) after pair \(issued)")
                    memory.holds(fence: lease.fencingToken)
                    processes[index].lease = lease
                    processes[index].answersAt = now + Int64.random(in: 1...timeoutMs, using: &random)
                    announce(
                        {
                            $0.heardGrant(
                                fence: lease.fencingToken, generation: lease.generation, value: "\(lease.fencingToken)",
                                leaseMs: leaseMs, now: now)
                        }, except: index)
                case .newer(let session): memory.saw(session)
                case .wait, .limited, .embargoed, .behind: break
                }
                processes[index].memory = memory
            }
        }
        #expect(reuses == 0, "seed \(seed): \(reuses) reuses")
        #expect(forgets > 50 && grants > 100, "seed \(seed): \(forgets) forgets, \(grants) grants")
    }

    @Test func aLeaseLongerThanThisProcessGrantsIsCut() {
        var record = CoordinationRecord()
        record.fence = 7
        record.lease = .init(fence: 7, holder: 0, expires: Int64.max / 4)  // forged: "forever"
        guard case .wait(_, let left) = record.begin(failedGeneration: 0, leaseMs: 1000, limit: nil, holder: 1, now: 0)
        else { Issue.record("expected a wait"); return }
        #expect(left == 1000)
    }

    // MARK: - Codecs

    @Test(arguments: [
        #"{"access_token":"a","expires_at":1e300}"#,
        #"{"access_token":"a","expires_at":-5}"#,
        #"{"access_token":"a","expires_at":"soon"}"#,
        #"{"access_token":""}"#,
        #"{"access_token":"a\r\nX-Injected: 1"}"#,
        #"{"access_token":"a","refresh_token":17}"#,
        #"[1,2]"#,
        #"{"access_token":"a","expires_at":1e19}"#,
    ])
    func outOfRangeSharedCredentialsAreRefusedWithoutATrap(_ text: String) {
        guard case .failure(let error) = SharedCredentialsCodec.check(text) else {
            Issue.record("accepted \(text)"); return
        }
        #expect(!error.reason.contains("X-Injected"))
    }

    @Test func encodingNeverTrapsOnHugeExpiries() {
        for date in [Date.distantFuture, Date(timeIntervalSince1970: 1e300), Date(timeIntervalSince1970: -1e300)] {
            let text = SharedCredentialsCodec.encode(Credentials(accessToken: "a", expiresAt: date))
            #expect(SharedCredentialsCodec.decode(text)?.accessToken == "a")
            _ = date.millisecondsSince1970
        }
        #expect(Duration.seconds(Int64.max / 2).milliseconds() > 0)
    }

    @Test func aRoundTripKeepsTheTokensAndTheMillisecond() {
        let credentials = Credentials(
            accessToken: "a", refreshToken: "r", expiresAt: Date(timeIntervalSince1970: 1_767_225_700.123))
        let decoded = SharedCredentialsCodec.decode(SharedCredentialsCodec.encode(credentials))
        #expect(decoded == credentials)
    }

    // MARK: - The state file

    final class Folder {
        let path: String
        init() throws {
            path = FileManager.default.temporaryDirectory.appendingPathComponent("record-\(UUID().uuidString)").path
            try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        }
        deinit { try? FileManager.default.removeItem(atPath: path) }
    }

    @Test func aStateFileReadableByOthersIsRefusedWithTheFix() throws {
        let folder = try Folder()
        let state = folder.path + "/credentials.json.shared"
        #expect(FileSessionCoordinator.write(CoordinationRecord(), to: state) == nil)
        chmod(state, 0o666)
        guard case .failure(let error) = FileSessionCoordinator.read(state) else { Issue.record("read"); return }
        #expect(
            error.reason
                == "the shared session file '\(state)' is readable or writable by others (mode 666); run: chmod 600 '\(state)'"
        )
    }

    @Test func aStateFileOutOfRangeIsRefusedNamingTheField() throws {
        let folder = try Folder()
        let state = folder.path + "/credentials.json.shared"
        for (text, field) in [
            (#"{"generation":1,"logged-out-until":1e300}"#, "logged-out-until"),
            (#"{"generation":-1}"#, "generation"),
            (#"{"lease":{"fence":1,"expires":1e30,"pid":1}}"#, "lease"),
            (#"{"generation":1,"epoch":2}"#, "epoch"),
        ] {
            #expect(FileSessionCoordinator.replaceFile(state, with: Data(text.utf8)) == nil)
            guard case .failure(let error) = FileSessionCoordinator.read(state) else {
                Issue.record("accepted \(text)")
                continue
            }
            #expect(error.reason.contains("'\(field)'"), "\(error.reason)")
        }
        #expect(
            FileSessionCoordinator.replaceFile(
                state, with: Data(#"{"credentials":{"access_token":"a","expires_at":1e300}}"#.utf8)) == nil)
        guard case .failure(let error) = FileSessionCoordinator.read(state) else { Issue.record("accepted"); return }
        #expect(error.reason.contains("expires_at is out of range"))
    }

    /// Issue 23: a planted link at the state path (or at the old predictable temporary name) is
    /// never followed; the victim keeps its content and mode, and the state file is 0600.
    @Test func plantedLinksAreNotFollowed() throws {
        let folder = try Folder()
        let state = folder.path + "/credentials.json.shared"
        let victim = folder.path + "/victim"
        try Data("victim".utf8).write(to: URL(fileURLWithPath: victim))
        chmod(victim, 0o644)
        symlink(victim, state + ".tmp-\(getpid())")
        var record = CoordinationRecord()
        record.credentials = Credentials(accessToken: "secret-token")
        #expect(FileSessionCoordinator.write(record, to: state) == nil)
        #expect(try String(contentsOfFile: victim, encoding: .utf8) == "victim")
        var info = stat()
        #expect(stat(state, &info) == 0 && info.st_mode & 0o777 == 0o600)
        try FileManager.default.removeItem(atPath: state)
        symlink(victim, state)
        guard case .failure(let error) = FileSessionCoordinator.read(state) else { Issue.record("followed"); return }
        #expect(error.reason.contains("symbolic link"))
    }
}

/// The signer's primitives against published vectors (FIPS 180-4, RFC 4231).
struct SharedStateSignerTests {
    @Test func sha256MatchesTheStandardVectors() {
        func hex(_ bytes: [UInt8]) -> String { bytes.map { String(format: "%02x", $0) }.joined() }
        #expect(
            hex(SHA256.hash(Array("abc".utf8))) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
        #expect(hex(SHA256.hash([])) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
        #expect(
            hex(SHA256.hash(Array("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq".utf8)))
                == "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1")
    }

    @Test func hmacMatchesRFC4231() {
        let signer = SharedStateSigner(key: Data("Jefe".utf8))
        #expect(
            signer.sign("what do ya want for nothing?")
                == "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843")
        #expect(
            signer.verify(
                "what do ya want for nothing?", mac: "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843")
        )
        #expect(
            !signer.verify(
                "what do ya want for nothing!", mac: "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843")
        )
        // A key longer than a block is hashed first (RFC 4231 test case 6).
        let long = SharedStateSigner(key: Data(repeating: 0xaa, count: 131))
        #expect(
            long.sign("Test Using Larger Than Block-Size Key - Hash Key First")
                == "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54")
    }

    @Test func signedCredentialsRoundTripAndAnotherKeyIsRefused() {
        let key = Data("fleet-key".utf8)
        let credentials = Credentials(accessToken: "a", refreshToken: "r", expiresAt: Date(timeIntervalSince1970: 2e9))
        let signed = SharedCredentialsCodec.encode(credentials, signer: SharedStateSigner(key: key))
        #expect(SharedCredentialsCodec.decode(signed, signer: SharedStateSigner(key: key)) == credentials)
        #expect(SharedCredentialsCodec.decode(signed, signer: SharedStateSigner(key: Data("other".utf8))) == nil)
        #expect(
            SharedCredentialsCodec.decode(
                SharedCredentialsCodec.encode(credentials), signer: SharedStateSigner(key: key)) == nil)
    }

    @Test func aStateFileWrittenWithoutTheKeyIsRefused() throws {
        let folder = try CoordinationRecordTests.Folder()
        let state = folder.path + "/credentials.json.shared"
        var record = CoordinationRecord()
        record.credentials = Credentials(accessToken: "planted")
        #expect(FileSessionCoordinator.write(record, to: state) == nil)
        let signer = SharedStateSigner(key: Data("k".utf8))
        guard case .failure(let error) = FileSessionCoordinator.read(state, signer: signer) else {
            Issue.record("an unsigned state file was accepted")
            return
        }
        #expect(error.reason.contains("signing-key-env"))
        #expect(FileSessionCoordinator.write(record, to: state, signer: signer) == nil)
        guard case .success(let read) = FileSessionCoordinator.read(state, signer: signer) else {
            Issue.record("its own state file was refused")
            return
        }
        #expect(read?.credentials?.accessToken == "planted")
    }
}

/// The shared-state fuzz entry on seeded mutations of hostile seeds: no trap, whatever the bytes.
struct SharedStateFuzzTests {
    @Test func seededMutationsOfHostileStateNeverTrap() throws {
        let seeds =
            [
                #"{"generation":3,"fence":9,"credentials":{"access_token":"a","refresh_token":"r","expires_at":1e300},"lease":{"fence":9,"pid":1,"expires":1e30},"logged-out-until":32503680000000,"refreshes":[1,2]}"#,
                #"{"access_token":"a","refresh_token":"r","expires_at":1767225600123,"sig":"00"}"#,
                #"{"generation":18446744073709551615,"fence":-1,"lease":{"fence":1e400}}"#,
            ].map { Array($0.utf8) } + (try Self.sealedSeeds())
        var random = SeededGenerator(seed: 23)
        for round in 0..<3000 {
            var bytes = seeds[round % seeds.count]
            for _ in 0..<Int.random(in: 0...6, using: &random) where !bytes.isEmpty {
                let index = Int.random(in: 0..<bytes.count, using: &random)
                switch Int.random(in: 0..<3, using: &random) {
                case 0: bytes[index] = UInt8.random(in: 0...255, using: &random)
                case 1: bytes.insert(Array("9e99-\"{}[],:".utf8).randomElement(using: &random) ?? 0, at: index)
                default: bytes.remove(at: index)
                }
            }
            SharedStateFuzzing.exercise(Data(bytes))
        }
    }

    /// Valid sealed values of the fuzz entry's key (a lease, a cooldown), so mutations explore the
    /// checks past the seal, and the seeds check the entry accepts them.
    static func sealedSeeds() throws -> [[UInt8]] {
        let signer = SharedStateSigner(key: Data("fuzz".utf8), scope: "redis:fuzz")
        let lease = "7" + signer.leaseSuffix(fence: 7, expires: 1_767_225_600_000)
        let logout = "1767225600000" + signer.logoutSuffix(until: 1_767_225_600_000)
        #expect(try signer.checkLease(lease, notBefore: 0).get().fence == 7)
        #expect(try signer.checkLogout(logout).get() == 1_767_225_600_000)
        #expect(
            try Data(
                contentsOf: URL(fileURLWithPath: #filePath).deletingLastPathComponent()
                    .appendingPathComponent("../Fuzz/corpus/shared-sealed-lease.txt")) == Data(lease.utf8))
        return [Array(lease.utf8), Array(logout.utf8)]
    }
}
