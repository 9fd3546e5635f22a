import Foundation
import ResponsePolicyTesting
import Testing

@testable import ResponsePolicy

/// A refresh answered by the fleet's news while it waits between two calls ends there: its waiters
/// go on with the news, its lease goes back to the store, and whoever waits for the engine's
/// background work (a tool about to exit) is not kept waiting for a refresh that is over.
struct RefreshSettlesTests {
    static let policy = basePolicy + "\n  share-window: 0s\n  on-failure: fail\n"

    @Test func newsFromTheFleetDuringABackoffEndsTheRefreshAndItsWait() async throws {
        let clock = VirtualClock()
        let scheduler = SimulationScheduler(clock: clock, externalWorkGracePeriod: .zero)
        let coordinator = SharedMemoryCoordinator()
        let transport = RecordingTransport { request, _ in
            request.headers["Authorization"] == "Bearer token-0"
                ? response(#"{"status":1401}"#) : response(#"{"status":0}"#)
        }
        // The token endpoint is down at first: the refresh waits 500ms before its next call.
        let refresh = CountingRefresh { throw RefreshFailure("503", kind: .transient) }
        var options = PolicyEngine.Options()
        options.clock = clock
        options.taskExecutor = scheduler.executor
        options.coordinator = coordinator
        options.refreshPlugin = refresh
        let engine = PolicyEngine(
            policy: try Policy.load(yaml: Self.policy), transport: transport,
            credentials: MemoryCredentialStore(Credentials(accessToken: "token-0")), options: options)
        let result = try await scheduler.runDetached { () async -> Result<HTTPResponse, PolicyEngineError> in
            async let outcome = Self.send(engine)
            // A tool about to exit waits for the refresh in its backoff…
            async let settled: Void = {
                try? await clock.sleep(until: .milliseconds(50))
                await engine.waitForBackgroundWork()
            }()
            try? await clock.sleep(until: .milliseconds(100))
            // …when another process's credentials answer it.
            coordinator.push(
                .credentials(SharedSession(credentials: Credentials(accessToken: "token-9"), generation: 9)))
            let result = await outcome
            await settled
            return result
        }
        #expect((try? result.get())?.body == Data(#"{"status":0}"#.utf8), "\(result)")
        #expect(refresh.calls == 1, "no call after the news")
        #expect(coordinator.counts.endRefresh == 1, "the lease went back")
        #expect(engine.debugSnapshot.refreshing == false)
        #expect(clock.now < .milliseconds(500), "nothing waited for the backoff the news ended")
    }

    static func send(_ engine: PolicyEngine) async -> Result<HTTPResponse, PolicyEngineError> {
        do throws(PolicyEngineError) {
            return .success(try await engine.send(HTTPRequest(url: testURL)))
        } catch {
            return .failure(error)
        }
    }
}
