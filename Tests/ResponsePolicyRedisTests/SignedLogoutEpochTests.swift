import Foundation
import ResponsePolicy
import ResponsePolicyRedis
import TestSupport
import Testing

/// Issue 23, the replay the seals alone let through: a genuine, validly sealed logout (its
/// announcement, or its stored end) put back after a sign-in ended it would log the whole fleet
/// out again. A logout is bound to the session epoch it was decided in (the generation of the
/// last sign-in; refreshes keep it), so a process that knows of a later sign-in refuses it with a
/// `problem` naming the source, and the session goes on. A logout racing a refresh (same epoch)
/// still applies; one decided by a process that had not heard of a sign-in is not even stored.
@Suite(.enabled(if: RedisServerFixture.isInstalled, "needs redis-server: apt-get install redis-server"))
struct SignedLogoutEpochTests {
    static let key = Data("fleet-key".utf8)
    /// Nothing here measures a timeout: a command or connection on a loaded machine may take far
    /// longer than the 250 ms the fixture's default allows, and a subscriber that gives up and
    /// reconnects in the middle of a test only makes its updates late, not different.
    static let patient = Duration.seconds(5)

    static func problems(_ log: UpdateLog) -> [String] { problems(log.updates) }

    static func problems(_ updates: [SessionUpdate]) -> [String] {
        updates.compactMap { if case .problem(let text) = $0 { text } else { nil } }
    }

    @Test func aLogoutPutBackAfterASignInIsRefusedAsAReplay() async throws {
        let server = try RedisServerFixture()
        let decider = try server.coordinator(key: "e", connectTimeout: Self.patient, signingKey: Self.key)
        let listener = try server.coordinator(key: "e", connectTimeout: Self.patient, signingKey: Self.key)
        defer { [decider, listener].forEach { $0.stop() } }
        let log = UpdateLog()
        _ = await decider.start(local: testCredentials("seed"), updates: { _ in })
        _ = await listener.start(local: nil, updates: log.sink)
        let first = try #require(await decider.publishSignIn(testCredentials("first")))
        let until = Date().addingTimeInterval(600)
        #expect(await logOut(decider, heardBy: log, until: until))
        // The genuine logout, as an attacker with the Redis password finds it: its stored end, and
        // its announcement (the same bytes a keyed process publishes, sealed with the fleet's key).
        let connection = try server.attacker()
        let storedEnd = try #require(connection.command(["GET", "response-policy:{e}:logout"]).text)
        let untilMs = until.millisecondsSince1970
        let signer = SharedStateSigner(key: Self.key, scope: "redis:e")
        let epoch = String(first.generation)
        let announcement =
            #"{"e":\#(epoch),"r":"revoked","s":"\#(signer.seal("logout", [String(untilMs), "revoked", epoch]))","#
            + #""t":"l","u":\#(untilMs)}"#

        let second = try #require(await decider.publishSignIn(testCredentials("second")))
        #expect(second.generation > first.generation)
        let signedIn = await log.first(within: .seconds(5)) {
            if case .credentials(let session) = $0 { session.generation == second.generation } else { false }
        }
        #expect(signedIn != nil, "the listener never heard the sign-in")
        let mark = log.updates.count

        // Put back: the stored end (with its TTL) and the announcement, until the listener refuses it.
        _ = try connection.command(["SET", "response-policy:{e}:logout", storedEnd, "PX", "600000"])
        var refused = false
        for _ in 0..<50 where !refused {
            _ = try connection.command(["PUBLISH", "response-policy:{e}:events", announcement])
            _ = await log.first(within: .milliseconds(100)) {
                if case .problem(let text) = $0 {
                    text.contains("a logout") && text.contains("replayed")
                } else {
                    false
                }
            }
            refused = Self.problems(log).contains {
                $0.contains("a logout on response-policy:{e}:events") && $0.contains("session epoch \(epoch)")
                    && $0.contains("replayed")
            }
        }
        #expect(refused, "\(Self.problems(log))")
        #expect(!log.updates.dropFirst(mark).contains { if case .loggedOut = $0 { true } else { false } })

        // A process that joins now learns the epoch from the session hash and refuses the stored end
        // (a problem naming the key): it joins the current session, with no cooldown, and its
        // refresh turns are not blocked until the end expires.
        let late = try server.coordinator(key: "e", connectTimeout: Self.patient, signingKey: Self.key)
        defer { late.stop() }
        let lateLog = UpdateLog()
        let joined = await late.start(local: nil, updates: lateLog.sink)
        #expect(
            joined
                == SharedSession(
                    credentials: testCredentials("second"), generation: second.generation, epoch: second.generation))
        let turn = await late.beginRefresh(.init(failedGeneration: 0, timeout: .seconds(1), limit: nil))
        guard case .newer(let session) = turn else { return recordFailure("a replayed cooldown gave \(turn)") }
        #expect(session.generation == second.generation && session.loggedOutUntil == nil)
        #expect(
            Self.problems(lateLog).contains {
                $0.contains("response-policy:{e}:logout") && $0.contains("session epoch \(epoch)")
                    && $0.contains("replayed")
            }, "\(Self.problems(lateLog))")
        #expect(!lateLog.updates.contains { if case .loggedOut = $0 { true } else { false } })
        // The process that signed in refuses it too, and goes on.
        let again = await decider.beginRefresh(.init(failedGeneration: 0, timeout: .seconds(1), limit: nil))
        guard case .newer(let current) = again, current.loggedOutUntil == nil else {
            return recordFailure("the signer-in accepted the replay: \(again)")
        }
    }

    /// A process that had not heard of a sign-in yet meets the server's logout code on the old
    /// token: its logout was decided in the old epoch and ended only the session the sign-in had
    /// already ended. It changes nothing for the current session: it is not stored (so a process
    /// that joins later, and every refresh turn that reads the session, find the signed-in
    /// session without a cooldown, and nobody is paused until it would expire), and not announced
    /// (nobody hears a logout, nor a replay problem for what was only a race).
    @Test func aLogoutFromAProcessThatMissedASignInIsNotStoredAndBlocksNothing() async throws {
        let server = try RedisServerFixture()
        let signer = try server.coordinator(key: "m", connectTimeout: Self.patient, signingKey: Self.key)
        let listener = try server.coordinator(key: "m", connectTimeout: Self.patient, signingKey: Self.key)
        // Never started, so it never hears the sign-in: the session epoch it knows is the first.
        let missed = try server.coordinator(key: "m", connectTimeout: Self.patient, signingKey: Self.key)
        defer { [signer, listener, missed].forEach { $0.stop() } }
        let log = UpdateLog()
        _ = await signer.start(local: testCredentials("seed"), updates: { _ in })
        _ = await listener.start(local: nil, updates: log.sink)
        #expect(await server.waitForSubscribers(2, on: RedisServerFixture.channel("m")))
        let signedIn = try #require(await signer.publishSignIn(testCredentials("signed-in")))
        #expect(signedIn.generation > 0)
        let heard = await log.first(within: .seconds(10)) {
            if case .credentials(let session) = $0 { session.generation == signedIn.generation } else { false }
        }
        try #require(heard != nil, "the listener never heard the sign-in: \(log.updates)")

        await missed.publishLogout(until: Date().addingTimeInterval(600), reason: "revoked")
        let connection = try server.attacker()
        let stored = try connection.command(["EXISTS", "response-policy:{m}:logout"]).integer
        #expect(stored == 0, "the stale logout was stored")

        // A process that joins now joins the signed-in session, with no cooldown and no problem.
        let late = try server.coordinator(key: "m", connectTimeout: Self.patient, signingKey: Self.key)
        defer { late.stop() }
        let lateLog = UpdateLog()
        let joined = await late.start(local: nil, updates: lateLog.sink)
        #expect(
            joined
                == SharedSession(
                    credentials: testCredentials("signed-in"), generation: signedIn.generation,
                    epoch: signedIn.generation))
        // Every refresh turn that reads the session finds it too: the late joiner's, the
        // signer's, and the stale process's own (it learns the epoch from the session hash).
        for (name, process) in [("late", late), ("signer", signer), ("missed", missed)] {
            let turn = await process.beginRefresh(.init(failedGeneration: 0, timeout: .seconds(1), limit: nil))
            guard case .newer(let session) = turn else { return recordFailure("\(name)'s turn was \(turn)") }
            #expect(session.generation == signedIn.generation && session.loggedOutUntil == nil, "\(name)")
        }
        // A later publication reaches the listener after the logout would have (one channel, in
        // order): by then it has heard neither a logout nor a problem.
        guard
            case .lease(let lease) = await signer.beginRefresh(
                .init(failedGeneration: signedIn.generation, timeout: .seconds(1), limit: nil))
        else { return recordFailure("no lease for the signed-in session") }
        guard case .published(let rotated) = await signer.publish(testCredentials("rotated"), with: lease) else {
            return recordFailure("the rotation was not published")
        }
        let rotation = await log.first(within: .seconds(10)) {
            if case .credentials(let session) = $0 { session.generation == rotated.generation } else { false }
        }
        #expect(rotation != nil, "the listener never heard the rotation")
        for updates in [log.updates, lateLog.updates] {
            #expect(!updates.contains { if case .loggedOut = $0 { true } else { false } }, "\(updates)")
            #expect(Self.problems(updates).isEmpty, "\(Self.problems(updates))")
        }
    }

    /// The process whose logout was refused as decided before a sign-in learns that sign-in's
    /// epoch from the refusal: its next logout (the server's answer to a request signed in the
    /// current session) is stored and heard.
    @Test func aProcessWhoseLogoutWasTooOldLearnsTheEpochFromTheRefusal() async throws {
        let server = try RedisServerFixture()
        let signer = try server.coordinator(key: "n", connectTimeout: Self.patient, signingKey: Self.key)
        let missed = try server.coordinator(key: "n", connectTimeout: Self.patient, signingKey: Self.key)
        defer { [signer, missed].forEach { $0.stop() } }
        let log = UpdateLog()
        _ = await signer.start(local: testCredentials("seed"), updates: log.sink)
        #expect(await server.waitForSubscribers(1, on: RedisServerFixture.channel("n")))
        _ = try #require(await signer.publishSignIn(testCredentials("signed-in")))
        let connection = try server.attacker()
        let until = Date().addingTimeInterval(600)
        await missed.publishLogout(until: until, reason: "revoked")
        #expect(try connection.command(["EXISTS", "response-policy:{n}:logout"]).integer == 0)
        await missed.publishLogout(until: until, reason: "revoked")
        #expect(try connection.command(["EXISTS", "response-policy:{n}:logout"]).integer == 1)
        let heard = await log.first(within: .seconds(10)) { if case .loggedOut = $0 { true } else { false } }
        #expect(heard != nil, "\(log.updates)")
        #expect(Self.problems(log).isEmpty, "\(Self.problems(log))")
    }

    @Test func aLogoutRacingARefreshInTheSameEpochStillApplies() async throws {
        let server = try RedisServerFixture()
        let signer = try server.coordinator(key: "r", connectTimeout: Self.patient, signingKey: Self.key)
        let refresher = try server.coordinator(key: "r", connectTimeout: Self.patient, signingKey: Self.key)
        let listener = try server.coordinator(key: "r", connectTimeout: Self.patient, signingKey: Self.key)
        defer { [signer, refresher, listener].forEach { $0.stop() } }
        let log = UpdateLog()
        _ = await signer.start(local: testCredentials("seed"), updates: { _ in })
        _ = await refresher.start(local: nil, updates: { _ in })
        _ = await listener.start(local: nil, updates: log.sink)
        // Signed in until the listener (subscribing in the background) hears a sign-in.
        var signedIn: SharedSession?
        for _ in 0..<50 where signedIn == nil {
            let session = await signer.publishSignIn(testCredentials("signed-in"))
            let heard = await log.first(within: .milliseconds(100)) {
                if case .credentials(let s) = $0 { s.generation == session?.generation } else { false }
            }
            if heard != nil { signedIn = session }
        }
        let epoch = try #require(signedIn)
        // A process that joins now holds the signed-in pair (the epoch's first generation)...
        let decider = try server.coordinator(key: "r", connectTimeout: Self.patient, signingKey: Self.key)
        defer { decider.stop() }
        let joined = await decider.start(local: nil, updates: { _ in })
        #expect(joined?.generation == epoch.generation)
        // ...while another refreshes it: a new generation, the same epoch.
        guard
            case .lease(let lease) = await refresher.beginRefresh(
                .init(failedGeneration: epoch.generation, timeout: .seconds(1), limit: nil))
        else { return recordFailure("no lease") }
        guard case .published(let refreshed) = await refresher.publish(testCredentials("rotated"), with: lease) else {
            return recordFailure("not published")
        }
        let heard = await log.first(within: .seconds(5)) {
            if case .credentials(let s) = $0 { s.generation == refreshed.generation } else { false }
        }
        #expect(heard != nil)
        // The server answers the older token "signed in elsewhere": the decider's logout ends the
        // session for the whole fleet, refresh or not.
        let until = Date().addingTimeInterval(600)
        await decider.publishLogout(until: until, reason: "revoked")
        let loggedOut = await log.first(within: .seconds(5)) { if case .loggedOut = $0 { true } else { false } }
        #expect(loggedOut != nil)
        #expect(!Self.problems(log).contains { $0.contains("epoch") }, "\(Self.problems(log))")
        let late = try server.coordinator(key: "r", connectTimeout: Self.patient, signingKey: Self.key)
        defer { late.stop() }
        let lateJoin = await late.start(local: nil, updates: { _ in })
        #expect(lateJoin?.generation == refreshed.generation)
        #expect(lateJoin?.loggedOutUntil.map { abs($0.timeIntervalSince(until)) < 0.01 } == true)
    }

    /// Redis lost the session (a restart, a flush): the re-seed keeps the epoch known, so a logout
    /// decided in it by a process that joins afterwards still applies for the others. (The signer
    /// cannot vouch for a whole lease, so its re-seed puts a quarantine of one lease in place: a
    /// short one here.)
    @Test func aReSeedKeepsTheEpochSoALaterLogoutStillApplies() async throws {
        let server = try RedisServerFixture()
        let signer = try server.coordinator(key: "s", lease: .milliseconds(200), signingKey: Self.key)
        defer { signer.stop() }
        let log = UpdateLog()
        _ = await signer.start(local: testCredentials("seed"), updates: log.sink)
        // Its subscriber in place and done re-reading the session (`EVAL` on its own connection):
        // one re-reading after the flush re-seeds the session between the refresh turn's grant
        // and its own re-seed, and the turn is then coordination trouble.
        #expect(await server.waitForSubscribers(1, on: RedisServerFixture.channel("s")))
        #expect(await server.waitForCalls("eval", atLeast: 1))
        let signedIn = try #require(await signer.publishSignIn(testCredentials("signed-in")))
        _ = try server.attacker().command(["FLUSHALL"])
        // The signer's refresh turn finds the session gone and re-seeds it from what it holds.
        // (After its quarantine, 200 ms: the timeout is room for a loaded machine, not a bound.)
        let afterFlush = await signer.beginRefresh(
            .init(failedGeneration: signedIn.generation, timeout: .seconds(20), limit: nil))
        guard case .lease(let lease) = afterFlush else {
            return recordFailure("no lease after the re-seed: \(afterFlush)")
        }
        await signer.endRefresh(lease, failure: nil)
        let decider = try server.coordinator(key: "s", connectTimeout: Self.patient, signingKey: Self.key)
        defer { decider.stop() }
        let joined = await decider.start(local: nil, updates: { _ in })
        #expect(joined?.generation == signedIn.generation)
        let until = Date().addingTimeInterval(600)
        await decider.publishLogout(until: until, reason: "revoked")
        let late = try server.coordinator(key: "s", connectTimeout: Self.patient, signingKey: Self.key)
        defer { late.stop() }
        let lateJoin = await late.start(local: nil, updates: { _ in })
        #expect(lateJoin?.loggedOutUntil.map { abs($0.timeIntervalSince(until)) < 0.01 } == true)
        // The signer, who knows the epoch, takes the stored end too (it was decided in its epoch).
        let turn = await signer.beginRefresh(.init(failedGeneration: 0, timeout: .seconds(20), limit: nil))
        guard case .newer(let session) = turn else { return recordFailure("the signer refused the logout: \(turn)") }
        #expect(session.loggedOutUntil != nil)
    }
}
