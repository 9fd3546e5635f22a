import Foundation
import Testing

@testable import ResponsePolicy

/// A refresh plugin that counts calls and hands out `token-1`, `token-2`, …
final class CountingRefresh: RefreshPlugin {
    private let count = Locked(0)
    let work: @Sendable () async throws -> Void

    init(work: @escaping @Sendable () async throws -> Void = {}) {
        self.work = work
    }

    var calls: Int { count.withLock { $0 } }

    func refresh(_ context: RefreshContext) async throws -> Credentials {
        let call = count.withLock { count in
            count += 1
            return count
        }
        try await work()
        return Credentials(accessToken: "token-\(call)", refreshToken: "refresh-\(call)")
    }
}

/// An engine on a virtual clock and a deterministic scheduler.
struct SimulatedEngine {
    let clock: VirtualClock
    let scheduler: SimulationScheduler
    let engine: PolicyEngine
    let events = EventLog()

    init(
        _ policyText: String, transport: any Transport, refresh: (any RefreshPlugin)? = nil,
        credentials: Credentials? = Credentials(accessToken: "token-0"), clock: VirtualClock = VirtualClock()
    ) throws {
        self.clock = clock
        scheduler = SimulationScheduler(clock: clock, externalWorkGracePeriod: .zero)
        var options = PolicyEngine.Options()
        options.clock = clock
        options.taskExecutor = scheduler.executor
        options.random = SeededRandomSource(seed: 7)
        options.observers = [events]
        options.refreshPlugin = refresh
        engine = PolicyEngine(
            policy: try Policy.load(yaml: policyText), transport: transport,
            credentials: MemoryCredentialStore(credentials), options: options)
    }

    /// Runs `body` on the scheduler; afterwards no request or waiter may be left registered.
    func run<T: Sendable>(_ body: @escaping @Sendable (PolicyEngine) async throws -> T) async throws -> T {
        let engine = self.engine
        let result = try await scheduler.runDetached { try await body(engine) }
        let leftovers = engine.debugSnapshot.leftovers
        #expect(leftovers == 0, "requests or refresh waiters leaked")
        return result
    }
}
