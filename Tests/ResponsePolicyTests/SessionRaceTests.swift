import Foundation
import Testing

@testable import ResponsePolicy

/// A session changes (a sign-in, a logout) while a refresh is in flight or credentials are being
/// written. Each test failed before its fix (found in review): a refresh overwrote a sign-in, a
/// request joined a refresh a logout had doomed and was told it succeeded, the logout plugin was
/// handed the next session's credentials, and a slow store write landed after a newer one.
@Suite struct SessionRaceTests {
    /// A refresh that started from the old session's credentials ends after `signIn`: it must not
    /// replace the credentials the caller just signed in with.
    @Test func aRefreshInFlightDoesNotOverwriteASignIn() async throws {
        let clock = VirtualClock()
        let transport = RecordingTransport { request, _ in
            request.headers["Authorization"] == "Bearer token-0"
                ? response(#"{"status":1401}"#) : response(#"{"status":0}"#)
        }
        // The refresh takes 5 s of virtual time.
        let refresh = CountingRefresh { try await clock.sleep(until: .seconds(5)) }
        let sim = try SimulatedEngine(basePolicy, transport: transport, refresh: refresh, clock: clock)
        let scheduler = sim.scheduler
        let (token, saved) = try await sim.run { engine -> (String?, String?) in
            let a = Task(executorPreference: scheduler) { try? await engine.send(HTTPRequest(url: testURL, id: "a")) }
            try await clock.sleep(until: .seconds(1))  // the refresh is in flight
            engine.signIn(Credentials(accessToken: "signed-in", refreshToken: "new-session"))
            _ = await a.value  // the refresh ends at 5 s
            let token = engine.debugSnapshot.credentials?.accessToken
            let saved = try? engine.store?.load()?.accessToken
            return (token, saved)
        }
        #expect(token == "signed-in", "the stale refresh replaced the signed-in credentials")
        #expect(saved == "signed-in", "the stale refresh overwrote the store")
    }

    /// A refresh that started before a logout is discarded when it ends. A request that joined it
    /// after the cooldown must not be told the refresh succeeded (it re-sends with the same,
    /// rejected token and, with `max-per-request: 1`, fails without ever refreshing).
    @Test func aRequestJoiningARefreshDiscardedByALogoutIsNotToldItSucceeded() async throws {
        let clock = VirtualClock()
        let transport = RecordingTransport { request, _ in
            if request.id == "b" { return response(#"{"status":202}"#) }  // forced logout
            return request.headers["Authorization"] == "Bearer token-0"
                ? response(#"{"status":1401}"#) : response(#"{"status":0}"#)
        }
        let refresh = CountingRefresh { try await clock.sleep(until: clock.now + .seconds(5)) }
        let policy =
            basePolicy + "\n  max-per-request: 1\n  on-exhausted: fail\n  share-window: 0ms\n"
            + "  hold-new-requests: false\n" + "logout: { cooldown: 1s }\n"
        let sim = try SimulatedEngine(policy, transport: transport, refresh: refresh, clock: clock)
        let scheduler = sim.scheduler
        let result = try await sim.run { engine -> String in
            // a: 1401 at 0 s, starts a refresh that ends at 5 s.
            let a = Task(executorPreference: scheduler) { try? await engine.send(HTTPRequest(url: testURL, id: "a")) }
            // b: forced logout at 0.5 s (cooldown until 1.5 s); the refresh runs on, to be discarded.
            try await clock.sleep(until: .milliseconds(500))
            _ = try? await engine.send(HTTPRequest(url: testURL, id: "b"))
            // c: after the cooldown, 1401 with token-0; it joins the refresh still in flight.
            try await clock.sleep(until: .seconds(2))
            let c: String
            do throws(PolicyEngineError) {
                c = "\(try await engine.send(HTTPRequest(url: testURL, id: "c")).status)"
            } catch {
                c = "\(error)"
            }
            _ = await a.value
            return c
        }
        let cSent = transport.requests.filter { $0.id == "c" }.map { $0.headers["Authorization"] ?? "-" }
        #expect(result == "200", "c: \(result); sent with \(cSent); refreshes \(refresh.calls)")
    }
}

extension SessionRaceTests {
    /// A request signed with the old session's token is answered with the logout code only after
    /// `signIn`: the server ended the session that token belonged to, which the sign-in already
    /// replaced. The request fails by its rule, and the new session goes on; a request signed
    /// after the sign-in that meets the same code still logs out (found by the fleet review: the
    /// engine logged the new session out).
    @Test(arguments: [false, true])
    func aLogoutCodeForATokenFromBeforeASignInDoesNotEndTheNewSession(startSignedIn: Bool) async throws {
        let clock = VirtualClock()
        let transport = RecordingTransport { request, _ in
            switch request.id {
            case "old":
                // Answered 5 s later: the sign-in happens meanwhile.
                try await clock.sleep(until: .seconds(5))
                return response(#"{"status":202}"#)
            case "after":
                return response(#"{"status":202}"#)
            default:
                return response(#"{"status":0}"#)
            }
        }
        let sim = try SimulatedEngine(
            basePolicy, transport: transport, refresh: CountingRefresh(),
            credentials: startSignedIn ? Credentials(accessToken: "token-0") : nil, clock: clock)
        let scheduler = sim.scheduler
        let (old, next, afterSignIn, last) = try await sim.run {
            engine -> (String, String, String, String) in
            func outcome(_ id: String) async -> String {
                do throws(PolicyEngineError) {
                    return "\(try await engine.send(HTTPRequest(url: testURL, id: id)).status)"
                } catch {
                    return "\(error)"
                }
            }
            let oldTask = Task(executorPreference: scheduler) { await outcome("old") }
            try await clock.sleep(until: .seconds(1))
            engine.signIn(Credentials(accessToken: "signed-in", refreshToken: "new-session"))
            let old = await oldTask.value
            let next = await outcome("next")
            let afterSignIn = await outcome("after")
            let last = await outcome("last")
            return (old, next, afterSignIn, last)
        }
        #expect(old == "rule 'forced-logout' failed the request (HTTP 200 (14 bytes))", "old: \(old)")
        #expect(next == "200", "the new session was logged out by the old session's answer: \(next)")
        let nextSent = transport.requests.first { $0.id == "next" }?.headers["Authorization"]
        #expect(nextSent == "Bearer signed-in")
        // The same code on the new session's own token is the server ending it.
        #expect(afterSignIn.hasPrefix("logged out"), "after: \(afterSignIn)")
        #expect(last.hasPrefix("logged out"), "last: \(last)")
        #expect(!transport.requests.contains { $0.id == "last" })
    }

    final class RecordingLogout: LogoutPlugin {
        let seen = Locked<[String?]>([])
        func logout(_ context: LogoutContext) async { seen.withLock { $0.append(context.credentials?.accessToken) } }
    }

    /// Stands for another thread: signs in at the moment the logout has started its cooldown
    /// but not yet read the credentials it hands the logout plugin.
    final class SignInOnLogout: PolicyObserver {
        let engine = Locked<PolicyEngine?>(nil)
        func observe(_ event: PolicyEvent) {
            guard event.kind == .logout else { return }
            engine.withLock { $0 }?.signIn(Credentials(accessToken: "new-session"))
        }
    }

    /// The logout plugin is told "the session's credentials as they were at logout"; a sign-in
    /// right after the cooldown starts must not make it end the new session instead.
    @Test func theLogoutPluginGetsTheCredentialsOfTheSessionThatEnded() async throws {
        let transport = RecordingTransport { _, _ in response(#"{"status":202}"#) }
        let logout = RecordingLogout()
        let signer = SignInOnLogout()
        var options = PolicyEngine.Options()
        options.logoutPlugin = logout
        options.observers = [signer]
        let engine = PolicyEngine(
            policy: try Policy.load(yaml: basePolicy), transport: transport,
            credentials: MemoryCredentialStore(Credentials(accessToken: "old-session")), options: options)
        signer.engine.withLock { $0 = engine }
        _ = try? await engine.send(HTTPRequest(url: testURL))
        await engine.waitForBackgroundWork()
        #expect(logout.seen.withLock { $0 } == ["old-session"])
    }
}

extension SessionRaceTests {
    /// A store whose write of `token-1` is slow: it lands only once the engine holds `token-2`
    /// (a slow disk while the next refresh completes). Before saves were ordered, the second
    /// refresh wrote `token-2` meanwhile and this late write then replaced it.
    final class SlowFirstWriteStore: CredentialStore {
        let stored = Locked<Credentials?>(Credentials(accessToken: "token-0", refreshToken: "refresh-0"))
        let engine = Locked<PolicyEngine?>(nil)
        let concurrent = Locked((now: 0, most: 0))
        func load() throws -> Credentials? { stored.withLock { $0 } }
        func save(_ credentials: Credentials) throws {
            concurrent.withLock {
                $0.now += 1; $0.most = max($0.most, $0.now)
            }
            defer { concurrent.withLock { $0.now -= 1 } }
            if credentials.accessToken == "token-1" {
                // A bounded wait on a condition, not on time: at most 2 s if it never holds.
                for _ in 0..<20_000 {
                    if engine.withLock({ $0 })?.debugSnapshot.generation ?? 0 >= 2 { break }
                    usleep(100)
                }
            }
            stored.withLock { $0 = credentials }
        }
    }

    /// Two refreshes in a row: the store must end with the second one's credentials (with
    /// rotating refresh tokens, the first one's refresh token is already spent).
    @Test func theStoreEndsWithTheLastRefreshedCredentials() async throws {
        let transport = RecordingTransport { request, _ in
            request.headers["Authorization"] == "Bearer token-2"
                ? response(#"{"status":0}"#) : response(#"{"status":1401}"#)
        }
        let store = SlowFirstWriteStore()
        var options = PolicyEngine.Options()
        options.refreshPlugin = CountingRefresh()
        let engine = PolicyEngine(
            policy: try Policy.load(yaml: basePolicy + "\n  share-window: 0ms\n  max-per-request: 3\n"),
            transport: transport, credentials: store, options: options)
        store.engine.withLock { $0 = engine }
        // a: 1401 → refresh 1 → token-1, whose write to the store is slow.
        let a = Task { try? await engine.send(HTTPRequest(url: testURL, id: "a")) }
        while engine.debugSnapshot.credentials?.accessToken != "token-1" { await Task.yield() }
        // b: signed with token-1, 1401 → refresh 2 → token-2, written at once.
        let b = try? await engine.send(HTTPRequest(url: testURL, id: "b"))
        _ = await a.value
        #expect(b?.status == 200)
        let inMemory = engine.debugSnapshot.credentials?.accessToken
        #expect(inMemory == "token-2")
        #expect(try store.load()?.accessToken == inMemory, "the store holds an older token than the engine")
        #expect(store.concurrent.withLock { $0.most } == 1, "two writes to the store overlapped")
        store.engine.withLock { $0 = nil }
    }
}
