import Foundation
import ResponsePolicyRedis
import TestGate
import TestSupport
import Testing

@testable import ResponsePolicy

/// Issue 30, case 6: a logout answers the epoch of the token its request was signed with, whether
/// the sign-in that ended that session was this process's or one it adopted through the store. Two
/// engines share a session on a real `redis-server`: B sends a request with the old token, A signs
/// in, B adopts the sign-in, and only then does B's request come back with the server's logout
/// code. Its session (the signed-in one) goes on, in B and in A, and Redis stores no logout.
@Suite(.enabled(if: RedisServerFixture.isInstalled, "needs redis-server: apt-get install redis-server"))
struct AdoptedSignInLogoutTests {
    private static let policy = basePolicy + "\nlogout: { cooldown: 60s, cancel-in-flight: true }\n"

    private static func engine(
        _ server: RedisServerFixture, transport: any Transport, store: MemoryCredentialStore, signed: Bool
    ) throws -> PolicyEngine {
        var options = PolicyEngine.Options()
        options.coordinator = try RedisSessionCoordinator(
            .init(
                url: server.url, key: "adopted", signingKey: signed ? Data("a-key-of-sixteen-bytes-or-more".utf8) : nil)
        )
        return PolicyEngine(
            policy: try Policy.load(yaml: policy), transport: transport, credentials: store, options: options)
    }

    @Test(arguments: [false, true])
    func anOldTokensLogoutCodeAfterAnAdoptedSignInEndsNothing(signed: Bool) async throws {
        let server = try RedisServerFixture()
        defer { server.kill() }
        let answered = AsyncGate()
        let onTheWire = Locked(0)
        // B's request is on the wire with the old token until the test lets the server answer,
        // with the logout code (202, `forced-logout`).
        let held = RecordingTransport { _, _ in
            onTheWire.withLock { $0 += 1 }
            await answered.wait()
            return response(#"{"status":202}"#)
        }
        let quiet = RecordingTransport { _, _ in response(#"{"status":0}"#) }
        let storeB = MemoryCredentialStore(Credentials(accessToken: "token-0"))
        let storeA = MemoryCredentialStore(Credentials(accessToken: "token-0"))
        let a = try Self.engine(server, transport: quiet, store: storeA, signed: signed)
        let b = try Self.engine(server, transport: held, store: storeB, signed: signed)
        await a.waitForBackgroundWork()
        await b.waitForBackgroundWork()
        #expect(await server.waitForSubscribers(2, on: RedisServerFixture.channel("adopted")))

        let request = Task { () -> PolicyEngineError? in
            do throws(PolicyEngineError) {
                _ = try await b.send(HTTPRequest(url: testURL, id: "b-old-token"))
                return nil
            } catch {
                return error
            }
        }
        while onTheWire.withLock({ $0 }) == 0 { try await Task.sleep(for: .milliseconds(2)) }
        a.signIn(Credentials(accessToken: "token-signed-in"))
        // B adopts the sign-in through the store (and saves it).
        let giveUp = ContinuousClock.now + .seconds(30)
        while (try storeB.load())?.accessToken != "token-signed-in", ContinuousClock.now < giveUp {
            try await Task.sleep(for: .milliseconds(2))
        }
        #expect((try storeB.load())?.accessToken == "token-signed-in", "B never adopted the sign-in")
        answered.open()
        let error = await request.value
        // The request fails by its rule; nobody is logged out.
        guard case .failed? = error else { return recordFailure("B's request ended \(String(describing: error))") }
        await b.waitForBackgroundWork()
        #expect(!b.isLoggedOut && !a.isLoggedOut)
        #expect(try server.attacker().command(["EXISTS", "response-policy:{adopted}:logout"]).integer == 0)
        // The store refuses such a logout too: one decided in the old epoch is neither stored nor heard.
        let late = try RedisSessionCoordinator(
            .init(
                url: server.url, key: "adopted", signingKey: signed ? Data("a-key-of-sixteen-bytes-or-more".utf8) : nil)
        )
        defer { late.stop() }
        await late.publishLogout(until: Date().addingTimeInterval(60), reason: "stale", epoch: 0)
        #expect(try server.attacker().command(["EXISTS", "response-policy:{adopted}:logout"]).integer == 0)
    }
}

/// Opens once; every waiter, before or after, goes on.
final class AsyncGate: Sendable {
    private let state = Locked<(open: Bool, waiters: [CheckedContinuation<Void, Never>])>((false, []))

    func wait() async {
        await withCheckedContinuation { continuation in
            let open = state.withLock { state -> Bool in
                if !state.open { state.waiters.append(continuation) }
                return state.open
            }
            if open { continuation.resume() }
        }
    }

    func open() {
        let waiters = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            state.open = true
            defer { state.waiters = [] }
            return state.waiters
        }
        for waiter in waiters { waiter.resume() }
    }
}
