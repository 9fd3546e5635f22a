import Foundation
import ResponsePolicy
import ResponsePolicyRedis
import TestGate
import TestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// What only the Redis coordinator has, against a real `redis-server` per test (`.ci/run` installs
/// it): keys, passwords, URLs, forged records. What every store does is checked once, for each
/// store, by ``CoordinationConformanceTests``. No test here bounds wall time: each waits for what
/// it needs (subscribers in place, an update) with a generous bound, so the suite runs beside the
/// others in `swift test`; the ones that measure time are ``RedisRealTimeSmokeTests``.
@Suite(.enabled(if: RedisServerFixture.isInstalled, "needs redis-server: apt-get install redis-server"))
struct RedisSessionCoordinatorTests {
    @Test func anotherKeyIsAnotherSession() async throws {
        let server = try RedisServerFixture()
        let mobile = try server.coordinator()
        let billing = try server.coordinator(key: "billing")
        defer { mobile.stop(); billing.stop() }
        #expect(await mobile.start(local: testCredentials("mobile"), updates: { _ in }) == nil)
        // The first process on "billing" seeds it, though "mobile-api" on the same server is seeded.
        #expect(await billing.start(local: testCredentials("billing"), updates: { _ in }) == nil)
        let late = try server.coordinator(key: "billing")
        defer { late.stop() }
        #expect(
            await late.start(local: nil, updates: { _ in })
                == SharedSession(credentials: testCredentials("billing"), generation: 0))
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
        let coordinator = try server.coordinator(key: "signed", signingKey: key)
        defer { coordinator.stop() }
        let log = UpdateLog()
        _ = await coordinator.start(local: testCredentials("seed"), updates: log.sink)
        let attacker = try server.attacker()
        #expect(await server.waitForSubscribers(1, on: RedisServerFixture.channel("signed")))
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
