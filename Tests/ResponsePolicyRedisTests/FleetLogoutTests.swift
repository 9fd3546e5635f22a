import Foundation
import ResponsePolicyRedis
import TestGate
import TestSupport
import Testing

@testable import ResponsePolicy

/// A logout in one process reaches the others through Redis: two engines, each with a Redis
/// coordinator of its own (its own connections and subscriber, as two processes have), share one
/// session on a real `redis-server`.
@Suite(
    .measuresRealTime(filter: "FleetLogoutTests"), .loadGate(.realTime),
    .enabled(if: RedisServerFixture.isInstalled, "needs redis-server: apt-get install redis-server"))
struct FleetLogoutTests {
    private static let policy = basePolicy + "\nlogout: { cooldown: 60s, cancel-in-flight: true }\n"

    private static func engine(_ server: RedisServerFixture, transport: any Transport) throws -> PolicyEngine {
        var options = PolicyEngine.Options()
        options.coordinator = try RedisSessionCoordinator(.init(url: server.url, key: "fleet-logout"))
        return PolicyEngine(
            policy: try Policy.load(yaml: policy), transport: transport,
            credentials: MemoryCredentialStore(Credentials(accessToken: "token-0")), options: options)
    }

    @Test func aLogoutCodeInOneProcessEndsTheOthersInFlightRequestsAndRefusesTheirNewOnes() async throws {
        let server = try RedisServerFixture()
        defer { server.kill() }
        let started = Locked(0)
        // B's request stalls on the wire until the logout cancels it.
        let stalling = RecordingTransport { _, _ in
            started.withLock { $0 += 1 }
            try await Task.sleep(for: .seconds(600))
            return response(#"{"status":0}"#)
        }
        let revoking = RecordingTransport { _, _ in response(#"{"status":202}"#) }
        let a = try Self.engine(server, transport: revoking)
        let b = try Self.engine(server, transport: stalling)
        // Both have joined the session (seeded, subscribed) before anything happens.
        await a.waitForBackgroundWork()
        await b.waitForBackgroundWork()

        let inFlight = Task { () -> PolicyEngineError? in
            do throws(PolicyEngineError) {
                _ = try await b.send(HTTPRequest(url: testURL, id: "b-in-flight"))
                return nil
            } catch {
                return error
            }
        }
        while started.withLock({ $0 }) == 0 { try await Task.sleep(for: .milliseconds(2)) }

        let loggedOutAt = ContinuousClock.now
        do throws(PolicyEngineError) {
            _ = try await a.send(HTTPRequest(url: testURL, id: "a-revoked"))
            Issue.record("the 202 was delivered")
        } catch {
            guard case .loggedOut(_, .rule("forced-logout", _)) = error else {
                Issue.record("expected a logout by the rule, got \(error)")
                return
            }
        }
        // B hears it by subscription: its in-flight request ends, new ones are refused at once.
        let giveUp = ContinuousClock.now + .seconds(10)
        while !b.isLoggedOut, ContinuousClock.now < giveUp { try await Task.sleep(for: .milliseconds(1)) }
        let heard = ContinuousClock.now - loggedOutAt
        #expect(b.isLoggedOut, "the other process never heard of the logout")
        // 100 ms is the goal on a quiet machine; the bound leaves room for a loaded CI machine.
        #expect(heard < .seconds(1), "heard after \(heard)")
        guard case .loggedOut(_, .elsewhere)? = await inFlight.value else {
            Issue.record("B's in-flight request was not ended by the logout")
            return
        }
        let sentBefore = stalling.requests.count
        do throws(PolicyEngineError) {
            _ = try await b.send(HTTPRequest(url: testURL, id: "b-new"))
            Issue.record("a new request went out during the fleet's cooldown")
        } catch {
            guard case .loggedOut = error else {
                Issue.record("expected a refusal, got \(error)")
                return
            }
        }
        #expect(stalling.requests.count == sentBefore, "the refused request touched the network")
    }
}
