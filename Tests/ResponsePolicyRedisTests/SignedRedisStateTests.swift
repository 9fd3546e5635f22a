import Foundation
import ResponsePolicy
import ResponsePolicyRedis
import TestSupport
import Testing

/// Issue 23: with `signing-key-env`, every value a process reads from Redis is authenticated:
/// the credentials with their generation, the cooldown's end, the lease (fencing token and sealed
/// expiry), the refresh.limit grants, and every announcement. Each field is forged alone with
/// `HSET`/`SET`/`ZADD`/`PUBLISH`, as any client with the Redis password could, and must be
/// refused with a `problem` naming the key, as coordination trouble: never a logout, never the
/// attacker's credentials.
@Suite(.enabled(if: RedisServerFixture.isInstalled, "needs redis-server: apt-get install redis-server"))
struct SignedRedisStateTests {
    static let key = Data("fleet-key".utf8)

    /// A session every field of which a keyed process wrote: generation 1 (one publication), a
    /// fencing counter, a cooldown, and the lease value it held (returned).
    func prepared(_ server: RedisServerFixture, _ name: String) async throws -> String {
        let holder = try server.coordinator(key: name, signingKey: Self.key)
        defer { holder.stop() }
        _ = await holder.start(local: testCredentials("seed"), updates: { _ in })
        guard
            case .lease(let lease) = await holder.beginRefresh(
                .init(failedGeneration: 0, timeout: .seconds(1), limit: nil))
        else { throw CoordinationError("no lease") }
        let held = try server.attacker().command(["GET", "response-policy:{\(name)}:lease"]).text ?? ""
        guard case .published = await holder.publish(testCredentials("rotated"), with: lease) else {
            throw CoordinationError("not published")
        }
        return held
    }

    /// What a fresh keyed process makes of the store: what it joins, its refresh turn, its updates.
    func probe(
        _ server: RedisServerFixture, _ name: String, limit: (count: Int, per: Duration)? = nil
    ) async throws -> (SharedSession?, RefreshTurn, [SessionUpdate]) {
        let process = try server.coordinator(key: name, signingKey: Self.key)
        defer { process.stop() }
        let log = UpdateLog()
        let shared = await process.start(local: testCredentials("local"), updates: log.sink)
        let turn = await process.beginRefresh(.init(failedGeneration: 1, timeout: .seconds(1), limit: limit))
        return (shared, turn, log.updates)
    }

    @Test func eachForgedFieldInRedisIsRefusedAsCoordinationTrouble() async throws {
        let server = try RedisServerFixture()
        let now = Date().millisecondsSince1970
        let forged = #"{"access_token":"attacker","refresh_token":"attacker-refresh"}"#
        // name: (commands of the forgery, with K for the key prefix; the key the problem must name).
        // A cooldown is read when a process joins: there it is refused (the join fails, with a
        // problem); the refresh turn that follows does not read it.
        let cases: [(String, [[String]], String)] = [
            ("generation alone", [["HSET", "K:session", "gen", "7"]], "K:session"),
            ("unsigned credentials", [["HSET", "K:session", "gen", "7", "creds", forged]], "K:session"),
            (
                "credentials sealed for another generation", [["HSET", "K:session", "gen", "7", "creds", "SEALED1"]],
                "K:session"
            ),
            ("credentials of another fleet", [["HSET", "K:session", "gen", "7", "creds", "OTHER"]], "K:session"),
            ("an unsigned cooldown", [["SET", "K:logout", String(now + 3_600_000)]], "K:logout"),
            ("a cooldown sealed for an earlier end", [["SET", "K:logout", "LOGOUT-LATER"]], "K:logout"),
            ("an unsigned lease", [["SET", "K:lease", "99", "PX", "60000"]], "K:lease"),
            ("a lease with another fencing token", [["SET", "K:lease", "FENCE-CHANGED", "PX", "60000"]], "K:lease"),
            ("a lease put back long after it ended", [["SET", "K:lease", "OLD-LEASE", "PX", "60000"]], "K:lease"),
        ]
        for (index, (label, commands, named)) in cases.enumerated() {
            let name = "s\(index)"
            let held = try await prepared(server, name)
            let x = SharedStateSigner(key: Self.key, scope: "redis:\(name)")
            let connection = try server.attacker()
            for command in commands {
                let resolved = command.map { word -> String in
                    switch word {
                    case "SEALED1":
                        return SharedCredentialsCodec.encode(testCredentials("rotated"), signer: x, generation: 1)
                    case "OTHER":
                        return SharedCredentialsCodec.encode(
                            testCredentials("rotated"), signer: SharedStateSigner(key: Self.key, scope: "redis:other"),
                            generation: 7)
                    case "LOGOUT-LATER": return String(now + 3_600_000) + x.logoutSuffix(until: now + 60_000)
                    case "FENCE-CHANGED": return "5" + held.drop { $0 != ":" }
                    case "OLD-LEASE": return "9" + x.leaseSuffix(fence: 9, expires: now - 120_000)
                    default: return word.replacingOccurrences(of: "K:", with: "response-policy:{\(name)}:")
                    }
                }
                _ = try connection.command(resolved)
            }
            let (shared, turn, updates) = try await probe(server, name)
            let keyName = named.replacingOccurrences(of: "K:", with: "response-policy:{\(name)}:")
            let problems = updates.compactMap { if case .problem(let text) = $0 { text } else { nil } }
            #expect(shared?.credentials?.accessToken != "attacker", "\(label)")
            #expect(shared?.loggedOutUntil == nil, "\(label): a forged cooldown was joined")
            #expect(!updates.contains { if case .loggedOut = $0 { true } else { false } }, "\(label)")
            if keyName.hasSuffix(":logout") {
                #expect(shared == nil, "\(label): joined a session with a forged cooldown")
                #expect(problems.contains { $0.contains(keyName) && $0.contains("refused") }, "\(label): \(problems)")
                continue
            }
            guard case .unavailable(let reason) = turn else {
                Issue.record("\(label): the refresh turn was \(turn)")
                continue
            }
            #expect(reason.contains(keyName), "\(label): \(reason)")
            #expect(problems.contains { $0.contains(keyName) && $0.contains("refused") }, "\(label): \(problems)")
            #expect(!problems.joined().contains("attacker") && !problems.joined().contains("access-rotated"))
        }
        // Unforged, the same store is used as it is: the refusals above are the seals' doing.
        _ = try await prepared(server, "clean")
        let (shared, turn, _) = try await probe(server, "clean")
        #expect(shared?.credentials == testCredentials("rotated") && shared?.generation == 1)
        guard case .lease(let lease) = turn else { return recordFailure("clean: \(turn)") }
        #expect(lease.fencingToken == 2)
    }

    /// `refresh.limit`'s loops (issue 29) are sealed: forged ones are refused, never counted (they
    /// would hold every refresh), and real ones still use the limit up.
    @Test func forgedLoopsNeverMakeRefreshLimitUsedUp() async throws {
        let server = try RedisServerFixture()
        _ = try await prepared(server, "limit")
        let now = Date().millisecondsSince1970
        _ = try server.attacker().command([
            "ZADD", "response-policy:{limit}:loops", String(now - 10), "50", String(now - 5), "51",
        ])
        let (_, turn, updates) = try await probe(server, "limit", limit: (2, .seconds(3600)))
        guard case .unavailable(let reason) = turn else { return recordFailure("forged loops gave \(turn)") }
        #expect(reason.contains("response-policy:{limit}:loops"))
        #expect(updates.contains { if case .problem(let text) = $0 { text.contains("refresh.limit") } else { false } })
        // Real loops still count: generation 1 refused (one loop), and the generation its refresh
        // made refused too (the second): the limit.
        _ = try server.attacker().command(["DEL", "response-policy:{limit}:loops"])
        let process = try server.coordinator(key: "limit", signingKey: Self.key)
        defer { process.stop() }
        _ = await process.start(local: nil, updates: { _ in })
        guard
            case .lease(let lease) = await process.beginRefresh(
                .init(failedGeneration: 1, timeout: .seconds(1), limit: (2, .seconds(3600))))
        else { return recordFailure("no lease within the limit") }
        guard case .published(let session) = await process.publish(testCredentials("g2"), with: lease) else {
            return recordFailure("not published")
        }
        #expect(
            await process.beginRefresh(
                .init(failedGeneration: session.generation, timeout: .seconds(1), limit: (2, .seconds(3600))))
                == .limited)
    }

    /// The token endpoint's wait in Redis (issue 29) is sealed like every value: an unsigned one
    /// (a writer without the key) is a problem and removed, never obeyed, so it cannot hold every
    /// refresh; a sealed one holds every process.
    @Test func anUnsignedRetryAfterIsRefusedAndASealedOneHoldsEveryProcess() async throws {
        let server = try RedisServerFixture()
        _ = try await prepared(server, "wait")
        let far = Date().millisecondsSince1970 + 3_600_000
        _ = try server.attacker().command([
            "HSET", "response-policy:{wait}:session", "retry-after", String(far), "retry-after-why", "forged",
        ])
        let (_, turn, updates) = try await probe(server, "wait")
        guard case .lease = turn else { return recordFailure("an unsigned Retry-After gave \(turn)") }
        #expect(updates.contains { if case .problem(let text) = $0 { text.contains("Retry-After") } else { false } })
        // A holder's real wait: sealed, every process is told its end. (The probe's lease is let go.)
        _ = try server.attacker().command(["DEL", "response-policy:{wait}:lease"])
        _ = try server.attacker().command(["HDEL", "response-policy:{wait}:session", "lease", "lease-until"])
        let holder = try server.coordinator(key: "wait", signingKey: Self.key)
        defer { holder.stop() }
        _ = await holder.start(local: nil, updates: { _ in })
        guard
            case .lease(let lease) = await holder.beginRefresh(
                .init(failedGeneration: 1, timeout: .seconds(1), limit: nil))
        else { return recordFailure("no lease") }
        let until = Date(milliseconds: Date().millisecondsSince1970 + 20_000)
        await holder.endRefresh(lease, failure: "HTTP 503", retryAfter: until)
        let (_, held, _) = try await probe(server, "wait")
        guard case .retryAfter(let end, let reason) = held else { return recordFailure("a sealed wait gave \(held)") }
        #expect(abs(end.timeIntervalSince(until)) < 1 && reason == "HTTP 503")
    }

    /// Replays: a process that saw generation 1 never takes a lease on a record rolled back to
    /// generation 0 (the spent refresh token): it puts its newer pair back (issue 30, case 8),
    /// with a quarantine of one lease (it cannot vouch for every lease granted meanwhile); and a
    /// fencing counter set back or forward never makes it reuse a fencing token.
    @Test func aRolledBackSessionIsReSeededAndTheFencingCounterIsNeverTrusted() async throws {
        let server = try RedisServerFixture()
        let process = try server.coordinator(key: "r", lease: .milliseconds(300), signingKey: Self.key)
        defer { process.stop() }
        let log = UpdateLog()
        _ = await process.start(local: testCredentials("seed"), updates: log.sink)
        let connection = try server.attacker()
        let seed = try connection.command(["HGET", "response-policy:{r}:session", "creds"]).text ?? ""
        guard
            case .lease(let first) = await process.beginRefresh(
                .init(failedGeneration: 0, timeout: .seconds(1), limit: nil))
        else { return recordFailure("no lease") }
        _ = await process.publish(testCredentials("rotated"), with: first)
        _ = try connection.command(["HSET", "response-policy:{r}:session", "gen", "0", "creds", seed])
        let turn = await process.beginRefresh(.init(failedGeneration: 0, timeout: .seconds(20), limit: nil))
        // The rolled-back pair is never handed out: the process's own newer pair is what it finds.
        guard case .newer(let session) = turn else { return recordFailure("a rolled-back record gave \(turn)") }
        #expect(session.generation == 1 && session.credentials == testCredentials("rotated"))
        #expect(try connection.command(["HGET", "response-policy:{r}:session", "gen"]).integer == 1)
        #expect(
            !log.updates.contains {
                if case .credentials(let s) = $0 { s.credentials == testCredentials("seed") } else { false }
            })
        // Redis lost everything (a restart without persistence): the process re-seeds what it holds,
        // and its next grant still carries a fencing token past every one it has seen.
        // (It waits out a quarantine of one lease first, 300 ms: the timeout is room for a loaded
        // machine, not a bound on the wait.)
        _ = try connection.command(["FLUSHALL"])
        let afterFlush = await process.beginRefresh(.init(failedGeneration: 1, timeout: .seconds(20), limit: nil))
        guard case .lease(let second) = afterFlush else {
            return recordFailure("no lease after the counter was set back: \(afterFlush), \(log.updates)")
        }
        #expect(second.fencingToken > first.fencingToken && second.generation == 1)
        await process.endRefresh(second, failure: nil)
        // Set forward: followed (a larger token is still unique), within a round trip or two.
        _ = try connection.command(["SET", "response-policy:{r}:fence", "1000"])
        let afterSet = await process.beginRefresh(.init(failedGeneration: 1, timeout: .seconds(20), limit: nil))
        guard case .lease(let third) = afterSet else {
            return recordFailure("no lease after the counter was set forward: \(afterSet)")
        }
        #expect(third.fencingToken == 1001)
    }

    @Test func forgedPublicationsAreRefusedWithAProblem() async throws {
        let server = try RedisServerFixture()
        _ = try await prepared(server, "p")
        let listener = try server.coordinator(key: "p", signingKey: Self.key)
        defer { listener.stop() }
        let log = UpdateLog()
        _ = await listener.start(local: nil, updates: log.sink)
        let x = SharedStateSigner(key: Self.key, scope: "redis:p")
        let sealedAt1 = SharedCredentialsCodec.encode(testCredentials("rotated"), signer: x, generation: 1)
        let until = Date().millisecondsSince1970 + 3_600_000
        let messages = [
            #"{"t":"c","g":9,"c":{"access_token":"attacker","refresh_token":"attacker-refresh"}}"#,
            // A real pair, replayed under another generation.
            #"{"t":"c","g":9,"c":"# + sealedAt1 + "}",
            #"{"t":"l","u":\#(until),"r":"x"}"#,
            #"{"r":"x","s":"\#(x.seal("logout", [String(until - 1), "x"]))","t":"l","u":\#(until)}"#,
            #"{"f":2,"s":"\#(x.seal("failure", ["3", "w"]))","t":"f","w":"w"}"#,
        ]
        let channel = "response-policy:{p}:events"
        let connection = try server.attacker()
        // Sent until the subscriber (subscribing in the background) has heard them all: a message
        // sent before it subscribed is lost, as Redis pub/sub is.
        func heardCount() -> Int {
            let problems = log.updates.compactMap { if case .problem(let text) = $0 { text } else { nil } }
            return [
                problems.contains { $0.contains("a publication") && $0.contains("not signed") },
                problems.contains { $0.contains("a publication") && $0.contains("does not match") },
                problems.contains { $0.contains("a logout") && $0.contains("not signed") },
                problems.contains { $0.contains("a logout") && $0.contains("does not match") },
                problems.contains { $0.contains("failed-refresh notice") },
            ].filter { $0 }.count
        }
        var heard = 0
        for _ in 0..<100 where heard < 5 {
            for message in messages { _ = try connection.command(["PUBLISH", channel, message]) }
            // Until all five are heard, or for 100 ms before they are sent again (waiting for any
            // one problem would stop waiting once the first was heard, and a busy subscriber could
            // still have the others to read when the rounds ran out).
            let deadline = ContinuousClock.now + .milliseconds(100)
            repeat {
                heard = heardCount()
                if heard == 5 { break }
                try? await Task.sleep(for: .milliseconds(2))
            } while ContinuousClock.now < deadline
        }
        #expect(heard == 5)
        #expect(!log.updates.contains { if case .loggedOut = $0 { true } else { false } })
        #expect(!log.updates.contains { if case .credentials(let s) = $0 { s.generation == 9 } else { false } })
    }

    /// Under a key the fleet coordinates as without one: one refresh for many processes, a
    /// sign-in, a logout heard by the others and joined by a process that starts later.
    @Test func aKeyedFleetCoordinatesAsAnUnkeyedOne() async throws {
        let server = try RedisServerFixture()
        let fleet = try (0..<4).map { _ in try server.coordinator(key: "fleet", signingKey: Self.key) }
        defer { fleet.forEach { $0.stop() } }
        let log = UpdateLog()
        // What the process that logs out hears: it must know of the sign-in before it logs out.
        let loggerLog = UpdateLog()
        for (index, process) in fleet.enumerated() {
            if index == 1 {
                _ = await process.start(local: testCredentials("seed"), updates: log.sink)
            } else if index == 0 {
                _ = await process.start(local: testCredentials("seed"), updates: loggerLog.sink)
            } else {
                _ = await process.start(local: testCredentials("seed"), updates: { _ in })
            }
        }
        let counter = RefreshCounter()
        let turns = await withTaskGroup(of: RefreshTurn.self) { group in
            for process in fleet {
                for _ in 0..<3 {
                    group.addTask { await coordinatedRefresh(process, failedGeneration: 0, counter: counter) }
                }
            }
            return await group.reduce(into: []) { $0.append($1) }
        }
        #expect(counter.refreshes == 1)
        #expect(!turns.contains { if case .unavailable = $0 { true } else { false } }, "\(turns)")
        let signedIn = await fleet[2].publishSignIn(testCredentials("signed-in"))
        #expect(signedIn?.generation == 2)
        // A logout decided before this process heard of the sign-in belongs to the session the
        // sign-in ended, and is neither stored nor announced (`SignedLogoutEpochTests`): this one
        // is decided after.
        let learned = await loggerLog.first(within: .seconds(10)) {
            if case .credentials(let session) = $0 { session.generation == 2 } else { false }
        }
        try #require(learned != nil, "the logging-out process never heard of the sign-in")
        let until = Date().addingTimeInterval(600)
        #expect(await logOut(fleet[0], heardBy: log, until: until))
        #expect(!log.updates.contains { if case .problem = $0 { true } else { false } }, "\(log.updates)")
        let late = try server.coordinator(key: "fleet", signingKey: Self.key)
        defer { late.stop() }
        let joined = await late.start(local: nil, updates: { _ in })
        #expect(joined?.credentials == testCredentials("signed-in") && joined?.generation == 2)
        #expect(joined?.loggedOutUntil.map { abs($0.timeIntervalSince(until)) < 0.01 } == true)
    }
}
