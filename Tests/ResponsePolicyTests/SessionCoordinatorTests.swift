import Foundation
import Testing

@testable import ResponsePolicy
@testable import ResponsePolicyTesting

/// The engine's side of the ``SessionCoordinator`` seam: it asks before refreshing, publishes what
/// it refreshed, logs out and signs in through the coordinator, and turns the coordinator's news
/// into state changes. Checked against an in-memory coordinator that keeps the contract and
/// counts every call.
struct SessionCoordinatorTests {
    fileprivate static let policy = basePolicy + "\n  share-window: 0s\nlogout: { cooldown: 60s }\n"

    /// 1401 for `token-0`, `{"status":0}` for any other token.
    private static func tokenServer() -> RecordingTransport {
        RecordingTransport { request, _ in
            request.headers["Authorization"] == "Bearer token-0"
                ? response(#"{"status":1401}"#) : response(#"{"status":0}"#)
        }
    }

    /// An engine on `coordinator`; with `scheduler`, on its virtual clock and executor, so no
    /// timeout (an attempt's, a refresh's) fires because the machine was busy.
    fileprivate static func engine(
        _ coordinator: SharedMemoryCoordinator, transport: any Transport, refresh: (any RefreshPlugin)? = nil,
        events: EventLog = EventLog(), policy: String = policy, scheduler: SimulationScheduler? = nil
    ) throws -> PolicyEngine {
        var options = PolicyEngine.Options()
        if let scheduler {
            options.clock = scheduler.clock
            options.taskExecutor = scheduler.executor
            options.random = SeededRandomSource(seed: 7)
        }
        options.coordinator = coordinator
        options.refreshPlugin = refresh
        options.observers = [events]
        return PolicyEngine(
            policy: try Policy.load(yaml: policy), transport: transport,
            credentials: MemoryCredentialStore(Credentials(accessToken: "token-0")), options: options)
    }

    /// Two engines on one coordinator and one scheduler's virtual clock: no timeout (an
    /// attempt's, a refresh's) fires because the machine was busy. On the system clock, a run of
    /// CI's ThreadSanitizer step (20 suites at once on two cores) once kept both engines from their
    /// answers for longer than `attempt-timeout` (10 s): both attempts timed out and were sent
    /// again, 6 requests where 4 were expected (reproduced on purpose below).
    private struct TwoEngines<Plugin: RefreshPlugin> {
        let scheduler: SimulationScheduler
        let coordinator = SharedMemoryCoordinator()
        let refresh: Plugin
        let a: PolicyEngine
        let b: PolicyEngine

        /// `refresh` is made with the coordinator, so that it can hold its lease until the other
        /// engine waits for it.
        init(
            transport: any Transport, policy: String = SessionCoordinatorTests.policy,
            clock: VirtualClock = VirtualClock(), refresh: (SharedMemoryCoordinator) -> Plugin
        ) throws {
            scheduler = SimulationScheduler(clock: clock, externalWorkGracePeriod: .zero)
            self.refresh = refresh(coordinator)
            a = try SessionCoordinatorTests.engine(
                coordinator, transport: transport, refresh: self.refresh, policy: policy, scheduler: scheduler)
            b = try SessionCoordinatorTests.engine(
                coordinator, transport: transport, refresh: self.refresh, policy: policy, scheduler: scheduler)
        }

        /// Sends request "a" from one engine and "b" from the other at once.
        func send() async throws -> [Result<HTTPResponse, PolicyEngineError>] {
            let (a, b) = (a, b)
            return try await scheduler.runDetached {
                async let first = outcome(a, id: "a")
                async let second = outcome(b, id: "b")
                return await [first, second]
            }
        }
    }

    @Test func twoEnginesSharingACoordinatorMakeOneRefresh() async throws {
        let transport = Self.tokenServer()
        let fleet = try TwoEngines(transport: transport) { coordinator in
            CountingRefresh { await coordinator.waitUntil { $0.waited >= 1 } }
        }
        let bodies = try await fleet.send().map { try $0.get().body }
        #expect(bodies == [Data(#"{"status":0}"#.utf8), Data(#"{"status":0}"#.utf8)])
        #expect(fleet.refresh.calls == 1)
        let counts = fleet.coordinator.counts
        #expect(counts.publish == 1 && counts.endRefresh == 0 && counts.start == 2)
        #expect(fleet.a.debugSnapshot.credentials?.accessToken == "token-1")
        #expect(fleet.b.debugSnapshot.credentials?.accessToken == "token-1")
        #expect(fleet.a.debugSnapshot.sharedGeneration == fleet.b.debugSnapshot.sharedGeneration)
        // Each engine sent its request twice: once with the dead token, once with the shared one.
        #expect(
            transport.requests.map { $0.headers["Authorization"] ?? "" }.sorted() == [
                "Bearer token-0", "Bearer token-0", "Bearer token-1", "Bearer token-1",
            ])
        #expect(fleet.scheduler.clock.now == .zero, "no time passed: nothing waited for a timer")
    }

    /// The 6 requests the test above once saw, on purpose: each engine's first answer comes after
    /// its attempt's timeout (as when the machine starves the engine that long). Each attempt is
    /// sent again (the `transient` rule retries a timeout) with the token still current; the fleet
    /// still makes one refresh, and no refresh token is presented twice.
    @Test func attemptsAnsweredAfterTheirTimeoutAreSentAgainAndTheFleetStillMakesOneRefresh() async throws {
        let clock = VirtualClock()
        let transport = RecordingTransport { request, count in
            // The first two attempts (one per engine) answer after `attempt-timeout` (10 s).
            if count <= 2 { try await clock.sleep(until: clock.now + .seconds(11)) }
            return request.headers["Authorization"] == "Bearer token-0"
                ? response(#"{"status":1401}"#) : response(#"{"status":0}"#)
        }
        let fleet = try TwoEngines(transport: transport, clock: clock) { coordinator in
            CountingRefresh { await coordinator.waitUntil { $0.waited >= 1 } }
        }
        let bodies = try await fleet.send().map { try $0.get().body }
        #expect(bodies == [Data(#"{"status":0}"#.utf8), Data(#"{"status":0}"#.utf8)])
        #expect(fleet.refresh.calls == 1)
        #expect(fleet.coordinator.counts.publish == 1 && fleet.coordinator.counts.endRefresh == 0)
        #expect(fleet.a.debugSnapshot.sharedGeneration == fleet.b.debugSnapshot.sharedGeneration)
        let sent = transport.requests.map { "\($0.id ?? ""):\($0.headers["Authorization"] ?? "")" }
        // Per engine: the attempt that timed out, its retry (refused: refresh), the shared token.
        #expect(sent.filter { $0.hasPrefix("a:") } == ["a:Bearer token-0", "a:Bearer token-0", "a:Bearer token-1"])
        #expect(sent.filter { $0.hasPrefix("b:") } == ["b:Bearer token-0", "b:Bearer token-0", "b:Bearer token-1"])
    }

    @Test func aRefreshThatFailsEndsItsLeaseAndTheOtherEngineFailsWithoutCallingThePlugin() async throws {
        let failing = basePolicy + "\n  share-window: 0s\n  on-failure: fail\n"
        let fleet = try TwoEngines(transport: Self.tokenServer(), policy: failing) { coordinator in
            FailingRefresh { await coordinator.waitUntil { $0.waited >= 1 } }
        }
        let results = try await fleet.send()
        let (refresh, coordinator) = (fleet.refresh, fleet.coordinator)
        #expect(refresh.calls == 1)
        #expect(coordinator.counts.endRefresh == 1 && coordinator.counts.publish == 0)
        for result in results {
            guard case .failure(.refreshFailed) = result else {
                Issue.record("expected a failed refresh, got \(result)")
                continue
            }
        }
    }

    @Test func newerCredentialsFromElsewhereAreAdoptedAndStaleOnesIgnored() async throws {
        let coordinator = SharedMemoryCoordinator()
        let transport = Self.tokenServer()
        let engine = try Self.engine(coordinator, transport: transport)
        await coordinator.waitUntil { $0.start >= 1 }
        coordinator.push(.credentials(SharedSession(credentials: Credentials(accessToken: "token-9"), generation: 5)))
        coordinator.push(.credentials(SharedSession(credentials: Credentials(accessToken: "token-3"), generation: 3)))
        coordinator.push(.credentials(SharedSession(credentials: Credentials(accessToken: "token-9"), generation: 5)))
        #expect(engine.debugSnapshot.credentials?.accessToken == "token-9")
        #expect(engine.debugSnapshot.sharedGeneration == 5)
        _ = try await engine.send(HTTPRequest(url: testURL))
        #expect(transport.requests.map { $0.headers["Authorization"] } == ["Bearer token-9"])
        #expect(coordinator.counts.beginRefresh == 0, "no refresh was needed")
    }

    @Test func aLogoutFromElsewhereCancelsInFlightRequestsAndRefusesNewOnes() async throws {
        let coordinator = SharedMemoryCoordinator()
        let (started, starting) = AsyncStream.makeStream(of: Void.self)
        let transport = RecordingTransport { _, _ in
            starting.yield()
            // Ended by the logout's cancellation, never by time.
            try await Task.sleep(for: .seconds(600))
            return response(#"{"status":0}"#)
        }
        let events = EventLog()
        let engine = try Self.engine(coordinator, transport: transport, events: events)
        let inFlight = Task { await outcome(engine, id: "in-flight") }
        for await _ in started { break }
        let until = Date().addingTimeInterval(30)
        coordinator.push(.loggedOut(until: until, reason: "signed in elsewhere"))
        coordinator.push(.loggedOut(until: until, reason: "signed in elsewhere"))
        let result = await inFlight.value
        guard case .failure(.loggedOut(let end, let reason)) = result else {
            Issue.record("expected a logout, got \(result)")
            return
        }
        #expect(reason == .elsewhere("signed in elsewhere"))
        #expect(abs(end.timeIntervalSince(until)) < 0.01)
        #expect(engine.isLoggedOut)
        let refused = await outcome(engine)
        #expect(refused == .failure(.loggedOut(until: end, reason: .elsewhere("signed in elsewhere"))))
        #expect(events.events.filter { $0.kind == .logout }.count == 1, "the same logout heard twice is one")
        #expect(coordinator.counts.publishLogout == 0, "news from elsewhere is not published back")
    }

    @Test func aLogoutHereIsPublishedAndTheHostsReasonReachesEveryRequest() async throws {
        let coordinator = SharedMemoryCoordinator()
        let transport = RecordingTransport { request, _ in
            request.id == "trigger" ? response(#"{"status":202}"#) : response(#"{"status":0}"#)
        }
        let engine = try Self.engine(coordinator, transport: transport)
        await #expect(throws: PolicyEngineError.self) {
            try await engine.send(HTTPRequest(url: testURL, id: "trigger"))
        }
        await engine.waitForBackgroundWork()
        #expect(coordinator.counts.publishLogout == 1)
        #expect(coordinator.loggedOutReason == "forced-logout")

        engine.signIn(Credentials(accessToken: "token-5"))
        await engine.waitForBackgroundWork()
        #expect(coordinator.counts.publishSignIn == 1)
        #expect(engine.debugSnapshot.sharedGeneration == coordinator.session.generation)
        engine.logout(reason: "the user signed out")
        await engine.waitForBackgroundWork()
        #expect(coordinator.counts.publishLogout == 2)
        #expect(coordinator.loggedOutReason == "the user signed out")
        do {
            _ = try await engine.send(HTTPRequest(url: testURL))
            Issue.record("a request during the host's logout was sent")
        } catch {
            guard case .loggedOut(_, let reason) = error else {
                Issue.record("expected a logout, got \(error)")
                return
            }
            #expect(reason == .host("the user signed out"))
        }
    }

    @Test func aCoordinatorProblemIsReportedAsAProblemEvent() async throws {
        let coordinator = SharedMemoryCoordinator()
        let events = EventLog()
        let engine = try Self.engine(coordinator, transport: Self.tokenServer(), events: events)
        await coordinator.waitUntil { $0.start >= 1 }
        withExtendedLifetime(engine) { coordinator.push(.problem("redis at 127.0.0.1:6379 is unreachable")) }
        #expect(
            events.events.filter { $0.kind == .problem }.map(\.reason)
                == ["coordination: redis at 127.0.0.1:6379 is unreachable"])
    }

    @Test func theCoordinationSectionNamesARegisteredCoordinator() async throws {
        var registry = PluginRegistry()
        let made = Locked<[SharedMemoryCoordinator]>([])
        registry.register(coordination: "memory") { _ in
            let coordinator = SharedMemoryCoordinator()
            made.withLock { $0.append(coordinator) }
            return coordinator
        }
        let text = Self.policy + "coordination: { use: memory }\n"
        let policy = try Policy.load(yaml: text, plugins: registry.catalog)
        #expect(policy.coordination.name == "memory")
        let engine = PolicyEngine(policy: policy, transport: Self.tokenServer(), plugins: registry)
        let coordinator = try #require(made.withLock { $0.first })
        await coordinator.waitUntil { $0.start >= 1 }
        withExtendedLifetime(engine) {}
        #expect(try Policy.load(yaml: Self.policy).coordination.name == "local")
        #expect(
            renderedErrors("policy: 1\nname: c\ncoordination: { use: zookeeper }\n").hasPrefix(
                "test.yaml:3:22: error: unknown coordination plugin 'zookeeper'"))
    }
}

/// `send`'s outcome as a value.
private func outcome(_ engine: PolicyEngine, id: String? = nil) async -> Result<HTTPResponse, PolicyEngineError> {
    do throws(PolicyEngineError) {
        return .success(try await engine.send(HTTPRequest(url: testURL, id: id)))
    } catch {
        return .failure(error)
    }
}

/// A refresh plugin that counts calls and fails each after `work`.
final class FailingRefresh: RefreshPlugin {
    private let count = Locked(0)
    let work: @Sendable () async -> Void

    init(work: @escaping @Sendable () async -> Void) { self.work = work }

    var calls: Int { count.withLock { $0 } }

    func refresh(_ context: RefreshContext) async throws -> Credentials {
        count.withLock { $0 += 1 }
        await work()
        throw RefreshFailure("invalid_grant")
    }
}

/// A coordinator shared in memory by several engines, keeping ``SessionCoordinator``'s contract
/// (one lease at a time, publication only under the lease, generations that grow, waiters told
/// of the publication or the failure), counting every call, and letting a test push updates.
final class SharedMemoryCoordinator: SessionCoordinator {
    struct Counts: Sendable {
        var start = 0, beginRefresh = 0, publish = 0, endRefresh = 0, publishLogout = 0, publishSignIn = 0
        /// `beginRefresh` calls that waited for another holder.
        var waited = 0
    }

    private struct State {
        var counts = Counts()
        var session = SharedSession(credentials: nil, generation: 0)
        var holder: UInt64?
        var fencing: UInt64 = 0
        var waiting: [CheckedContinuation<RefreshTurn, Never>] = []
        var subscribers: [@Sendable (SessionUpdate) -> Void] = []
        var loggedOutReason: String?
        var watchers: [(condition: @Sendable (Counts) -> Bool, continuation: CheckedContinuation<Void, Never>)] = []
    }

    private let state = Locked(State())

    var counts: Counts { state.withLock { $0.counts } }
    var session: SharedSession { state.withLock { $0.session } }
    var loggedOutReason: String? { state.withLock { $0.loggedOutReason } }

    /// Returns once `condition` holds on the counts: every change of the counts wakes the waits
    /// it satisfies (a signal, not a poll). A refresh that waits here for the other engine takes
    /// no time, real or virtual, and starves nothing.
    func waitUntil(_ condition: @escaping @Sendable (Counts) -> Bool) async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let holds = state.withLock { state -> Bool in
                if condition(state.counts) { return true }
                state.watchers.append((condition, continuation))
                return false
            }
            if holds { continuation.resume() }
        }
    }

    /// Changes the state under its lock, then wakes the waits whose condition now holds.
    private func change<T>(_ body: (inout State) -> T) -> T {
        let (result, woken) = state.withLock { state -> (T, [CheckedContinuation<Void, Never>]) in
            let result = body(&state)
            var woken: [CheckedContinuation<Void, Never>] = []
            state.watchers.removeAll { watcher in
                guard watcher.condition(state.counts) else { return false }
                woken.append(watcher.continuation)
                return true
            }
            return (result, woken)
        }
        for continuation in woken { continuation.resume() }
        return result
    }

    /// Sends `update` to every engine, as news from another process.
    func push(_ update: SessionUpdate) {
        for subscriber in state.withLock({ $0.subscribers }) { subscriber(update) }
    }

    func start(local: Credentials?, updates: @escaping @Sendable (SessionUpdate) -> Void) async -> SharedSession? {
        change { state in
            state.counts.start += 1
            state.subscribers.append(updates)
            if state.session.credentials == nil {
                // Seeded from the first engine's store, numbered 1.
                state.session = SharedSession(credentials: local, generation: local == nil ? 0 : 1)
                return nil
            }
            return state.session
        }
    }

    func beginRefresh(_ request: RefreshTurnRequest) async -> RefreshTurn {
        await withCheckedContinuation { continuation in
            let answer = change { state -> RefreshTurn? in
                state.counts.beginRefresh += 1
                if state.session.generation > request.failedGeneration { return .newer(state.session) }
                if state.holder == nil {
                    state.fencing += 1
                    state.holder = state.fencing
                    return .lease(RefreshLease(fencingToken: state.fencing, generation: state.session.generation))
                }
                state.counts.waited += 1
                state.waiting.append(continuation)
                return nil
            }
            if let answer { continuation.resume(returning: answer) }
        }
    }

    func publish(_ credentials: Credentials, with lease: RefreshLease) async -> PublishResult {
        typealias Taken = (
            PublishResult, [CheckedContinuation<RefreshTurn, Never>], [@Sendable (SessionUpdate) -> Void]
        )
        let (result, waiting, subscribers) = change { state -> Taken in
            state.counts.publish += 1
            guard state.holder == lease.fencingToken else { return (.leaseLost(current: state.session), [], []) }
            state.holder = nil
            state.session = SharedSession(credentials: credentials, generation: state.session.generation + 1)
            defer { state.waiting = [] }
            return (.published(state.session), state.waiting, state.subscribers)
        }
        if case .published(let session) = result {
            for waiter in waiting { waiter.resume(returning: .published(session)) }
            // Every engine hears of it, the publisher included (the contract allows that).
            for subscriber in subscribers { subscriber(.credentials(session)) }
        }
        return result
    }

    func endRefresh(_ lease: RefreshLease, failure: String?) async {
        let waiting = change { state -> [CheckedContinuation<RefreshTurn, Never>] in
            state.counts.endRefresh += 1
            guard state.holder == lease.fencingToken else { return [] }
            state.holder = nil
            defer { state.waiting = [] }
            return state.waiting
        }
        for waiter in waiting { waiter.resume(returning: .failedElsewhere(failure ?? "the refresh produced nothing")) }
    }

    func publishLogout(until: Date, reason: String) async {
        change { state in
            state.counts.publishLogout += 1
            state.session.loggedOutUntil = until
            state.loggedOutReason = reason
        }
    }

    func publishSignIn(_ credentials: Credentials) async -> SharedSession? {
        change { state in
            state.counts.publishSignIn += 1
            state.session = SharedSession(credentials: credentials, generation: state.session.generation + 1)
            return state.session
        }
    }

    func stop() {}
}
