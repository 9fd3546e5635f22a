import Foundation
import Testing

@testable import ResponsePolicy

/// Issue 19's invariants, on a fleet of engines sharing one ``InMemoryCoordinationStore`` on a
/// virtual clock: (a) no refresh token presented twice, (b) coordination trouble never logs anyone
/// out, (c) a process joins the shared session before its first request, (d) a re-send with
/// adopted credentials does not use up `max-per-request`, (e) a logout that could not be published
/// is published when the store is back, (f) a pair the token endpoint returned is never thrown
/// away. Deterministic: one scheduler, one clock, no real sleeping.
struct FleetInvariantTests {
    static let policy = """
        policy: 1
        name: fleet
        classify: { code: body.status }
        rules:
          - { name: token-expired, when: { code: [1401] }, then: refresh }
          - { name: forced-logout, when: { code: [202] }, then: logout }
        refresh:
          use: oauth2
          with: { token-url: "https://auth.example.com/token", client-id: app }
          timeout: 2s
          max-per-request: 1
          on-exhausted: logout
          on-failure: logout
        logout: { cooldown: 60s }
        retry: { max-retries: 0 }
        """

    /// Several engines ("processes") on one clock, one scheduler and one store.
    final class Fleet: Sendable {
        let clock = VirtualClock()
        let scheduler: SimulationScheduler
        let store: InMemoryCoordinationStore
        let server: RotatingTokenServer
        let events = EventLog()

        init() {
            scheduler = SimulationScheduler(clock: clock, externalWorkGracePeriod: .zero)
            store = InMemoryCoordinationStore(clock: clock, executor: scheduler.executor)
            server = RotatingTokenServer(clock: clock)
        }

        func engine(
            _ policyText: String = FleetInvariantTests.policy, credentials: Credentials? = RotatingTokenServer.initial,
            transport: (any Transport)? = nil
        ) throws -> PolicyEngine {
            var options = PolicyEngine.Options()
            options.clock = clock
            options.taskExecutor = scheduler.executor
            options.random = SeededRandomSource(seed: 7)
            options.observers = [events]
            options.refreshPlugin = server
            options.coordinator = store.coordinator(lease: .seconds(15))
            return PolicyEngine(
                policy: try Policy.load(yaml: policyText), transport: transport ?? server,
                credentials: MemoryCredentialStore(credentials), options: options)
        }

        func run<T: Sendable>(_ body: @escaping @Sendable () async throws -> T) async throws -> T {
            try await scheduler.runDetached(body)
        }

        var logouts: Int { events.events.filter { $0.kind == .logout }.count }
    }

    @Test func anExpiryMakesOneTokenCallAcrossTheFleetAndNoLogout() async throws {
        let fleet = Fleet()
        let engines = try (0..<4).map { _ in try fleet.engine() }
        fleet.server.expireAll()
        let results = try await fleet.run {
            await withTaskGroup(of: Result<HTTPResponse, PolicyEngineError>.self) { group in
                for engine in engines {
                    for _ in 0..<5 { group.addTask { await send(engine) } }
                }
                return await group.reduce(into: []) { $0.append($1) }
            }
        }
        #expect(results.allSatisfy { (try? $0.get()) != nil }, "\(results)")
        #expect(fleet.server.calls == 1)
        #expect(fleet.server.reuses == 0)
        #expect(fleet.logouts == 0)
    }

    /// The coordinator's answers to each engine's refresh turns are counted for its metrics: one
    /// lease across the fleet (the one token call), the others answered by the holder's pair.
    @Test func eachEnginesMetricsCountTheCoordinatorsAnswersToItsTurns() async throws {
        let fleet = Fleet()
        let engines = try (0..<4).map { _ in try fleet.engine() }
        let metrics = engines.map { engine in
            let metrics = PolicyMetrics()
            metrics.attach(engine)
            return metrics
        }
        fleet.server.expireAll()
        _ = try await fleet.run {
            await withTaskGroup(of: Void.self) { group in
                for engine in engines {
                    for _ in 0..<3 { group.addTask { _ = await send(engine) } }
                }
            }
        }
        let turns = engines.map(\.gauges.coordinationTurns)
        #expect(fleet.server.calls == 1)
        #expect(turns.map { $0["lease", default: 0] }.reduce(0, +) == 1, "\(turns)")
        for answers in turns where answers["lease"] == nil {
            #expect(answers["adopted", default: 0] + answers["published", default: 0] >= 1, "\(turns)")
        }
        #expect(turns.allSatisfy { $0["limited"] == nil && $0["unavailable"] == nil && $0["failed_elsewhere"] == nil })
        let holder = try #require(turns.firstIndex { $0["lease"] == 1 })
        let text = metrics[holder].exposition()
        #expect(text.contains("# TYPE response_policy_coordination_turns_total counter"), "\(text)")
        #expect(text.contains("response_policy_coordination_turns_total{result=\"lease\"} 1\n"), "\(text)")
    }

    /// The credentials file keeps `expires_at` to the second, the shared codecs to the millisecond:
    /// the same token read from both is not new credentials (issue 19, item 1).
    @Test func theSameTokenWithAnExpiryRoundedToTheSecondIsNotAdoptedAsFresh() async throws {
        let fleet = Fleet()
        let refreshing = try fleet.engine()
        fleet.server.expireAll()
        _ = try await fleet.run { await send(refreshing) }
        let shared = try #require(fleet.store.record.credentials)
        #expect(fleet.store.record.generation == 1)
        // A process restarting with what its credentials file holds: the same tokens, the expiry
        // to the second.
        var rounded = shared
        rounded.expiresAt = shared.expiresAt.map {
            Date(timeIntervalSince1970: $0.timeIntervalSince1970.rounded(.down))
        }
        #expect(rounded.expiresAt != shared.expiresAt)
        let restarted = try fleet.engine(credentials: rounded)
        let result = try await fleet.run { await send(restarted) }
        #expect((try? result.get()) != nil, "\(result)")
        #expect(restarted.debugSnapshot.generation == 0, "the same tokens bumped the generation")
        #expect(restarted.debugSnapshot.sharedGeneration == 1)
        #expect(fleet.server.calls == 1)
    }

    /// A request on the wire with the old token when the fleet's newer one arrives is re-sent with
    /// it; that re-send is not one of its refreshes, and a refusal of the adopted token leads to a
    /// coordinated refresh, never a logout (invariant d).
    @Test func aReSendWithAdoptedCredentialsDoesNotUseUpMaxPerRequest() async throws {
        let fleet = Fleet()
        let engine = try fleet.engine()
        let other = fleet.store.coordinator()
        let adopted = Credentials(accessToken: "adopted", refreshToken: "refresh-adopted")
        fleet.server.expireAll()  // token-0 and "adopted" are both refused
        fleet.server.delay = .milliseconds(50)
        let result = try await fleet.run { () async -> Result<HTTPResponse, PolicyEngineError> in
            async let outcome = send(engine)
            // While the first attempt is on the wire, another process signs the fleet in.
            try? await fleet.clock.sleep(until: .milliseconds(10))
            _ = await other.start(local: nil, updates: { _ in })
            _ = await other.publishSignIn(adopted)
            return await outcome
        }
        #expect((try? result.get()) != nil, "\(result)")
        #expect(fleet.server.presented == ["refresh-adopted"])
        #expect(fleet.logouts == 0)
    }

    /// Invariant b with `on-unavailable: wait` (the default): while the store is down nobody
    /// refreshes alone; at refresh.timeout the requests fail with the reason; nobody is logged out.
    @Test func anOutageLongerThanTheRefreshTimeoutFailsRequestsWithoutALogoutOrARefresh() async throws {
        let fleet = Fleet()
        let engines = try (0..<3).map { _ in try fleet.engine() }
        fleet.server.expireAll()
        fleet.store.isAvailable = false
        let results = try await fleet.run {
            await withTaskGroup(of: Result<HTTPResponse, PolicyEngineError>.self) { group in
                for engine in engines { group.addTask { await send(engine) } }
                return await group.reduce(into: []) { $0.append($1) }
            }
        }
        for result in results {
            guard case .failure(.refreshFailed(let reason)) = result else {
                Issue.record("expected a failed refresh, got \(result)")
                continue
            }
            #expect(reason.contains("coordination unavailable"), "\(reason)")
        }
        #expect(fleet.clock.now >= .seconds(2))
        #expect(fleet.server.calls == 0)
        #expect(fleet.logouts == 0)
        #expect(engines.allSatisfy { !$0.isLoggedOut })
        #expect(engines.allSatisfy { $0.problems.contains { $0.kind == .coordination } })
    }

    @Test func anOutageShorterThanTheRefreshTimeoutDelaysTheRefreshAndMakesOne() async throws {
        let fleet = Fleet()
        let engines = try (0..<3).map { _ in try fleet.engine() }
        fleet.server.expireAll()
        fleet.store.isAvailable = false
        let results = try await fleet.run { () async -> [Result<HTTPResponse, PolicyEngineError>] in
            async let all = withTaskGroup(of: Result<HTTPResponse, PolicyEngineError>.self) { group in
                for engine in engines { group.addTask { await send(engine) } }
                return await group.reduce(into: []) { $0.append($1) }
            }
            try? await fleet.clock.sleep(until: .milliseconds(700))
            fleet.store.isAvailable = true
            return await all
        }
        #expect(results.allSatisfy { (try? $0.get()) != nil }, "\(results)")
        #expect(fleet.server.calls == 1)
        #expect(fleet.server.reuses == 0)
        #expect(fleet.logouts == 0)
        #expect(engines.allSatisfy { $0.problems.isEmpty }, "recovered: no problem left")
    }

    /// `on-unavailable: local` is the old behaviour, kept as a setting: every process refreshes
    /// alone, and a rotating token server sees the same refresh token twice. (Why it is not the
    /// default.)
    @Test func onUnavailableLocalRefreshesInEveryProcess() async throws {
        let fleet = Fleet()
        let local =
            Self.policy
            + "\ncoordination: { use: redis, with: { url: \"redis://127.0.0.1:1/0\", on-unavailable: local } }\n"
        let engines = try (0..<2).map { _ in try fleet.engine(local) }
        fleet.server.expireAll()
        fleet.store.isAvailable = false
        _ = try await fleet.run {
            await withTaskGroup(of: Result<HTTPResponse, PolicyEngineError>.self) { group in
                for engine in engines { group.addTask { await send(engine) } }
                return await group.reduce(into: []) { $0.append($1) }
            }
        }
        #expect(fleet.server.calls == 2)
        #expect(fleet.server.reuses == 1)
    }

    /// Invariant f: the store went down while the holder refreshed; the pair is kept and used, and
    /// published when the store is back (the other process adopts it, no second token call).
    @Test func aPairWhosePublicationFailedIsKeptAndPublishedWhenTheStoreIsBack() async throws {
        let fleet = Fleet()
        let holder = try fleet.engine()
        let other = try fleet.engine()
        fleet.server.expireAll()
        fleet.server.onRefresh = { fleet.store.isAvailable = false }
        let first = try await fleet.run { await send(holder) }
        #expect((try? first.get()) != nil, "\(first)")
        #expect(holder.debugSnapshot.credentials?.accessToken == "token-1")
        #expect(fleet.store.record.credentials?.accessToken != "token-1")
        fleet.server.onRefresh = nil
        let second = try await fleet.run { () async -> Result<HTTPResponse, PolicyEngineError> in
            fleet.store.isAvailable = true
            // The holder republishes on `.recovered`; then the other process's request goes out.
            for _ in 0..<1000 where fleet.store.record.credentials?.accessToken != "token-1" { await Task.yield() }
            return await send(other)
        }
        #expect(fleet.store.record.credentials?.accessToken == "token-1")
        #expect((try? second.get()) != nil, "\(second)")
        #expect(fleet.server.calls == 1)
        #expect(fleet.server.reuses == 0)
    }

    /// Invariant c: a process started during a fleet cooldown fails its first request without
    /// touching the network.
    @Test func aProcessStartedDuringAFleetCooldownDoesNotSend() async throws {
        let fleet = Fleet()
        let first = try fleet.engine()
        fleet.server.logoutNext = true
        let loggedOut = try await fleet.run { () async -> Result<HTTPResponse, PolicyEngineError> in
            let result = await send(first)
            await first.waitForBackgroundWork()
            return result
        }
        guard case .failure(.loggedOut) = loggedOut else { Issue.record("expected a logout, got \(loggedOut)"); return }
        let counting = RecordingTransport { _, _ in response(#"{"status":0}"#) }
        let late = try fleet.engine(transport: counting)
        let result = try await fleet.run { await send(late) }
        guard case .failure(.loggedOut(_, let reason)) = result else {
            Issue.record("expected the fleet's cooldown, got \(result)"); return
        }
        #expect(counting.requests.isEmpty)
        if case .elsewhere = reason {} else { Issue.record("reason \(reason)") }
    }

    /// Invariant e: a logout made while the store was down reaches the others when it is back.
    @Test func aLogoutDuringAnOutageIsPublishedWhenTheStoreIsBack() async throws {
        let fleet = Fleet()
        let a = try fleet.engine()
        let b = try fleet.engine()
        try await fleet.run { _ = await send(b) }  // both joined
        fleet.store.isAvailable = false
        fleet.server.logoutNext = true
        try await fleet.run {
            _ = await send(a)
            await a.waitForBackgroundWork()
        }
        #expect(a.isLoggedOut && !b.isLoggedOut)
        try await fleet.run {
            fleet.store.isAvailable = true
            for _ in 0..<1000 where !b.isLoggedOut { await Task.yield() }
        }
        #expect(b.isLoggedOut)
        #expect(fleet.events.events.filter { $0.kind == .logout }.count == 2, "one logout per process")
    }

    /// A cooldown read from the store is never longer than the policy's own (issue 23).
    @Test func aForgedEternalLogoutIsClampedToThePolicysCooldown() async throws {
        let fleet = Fleet()
        let engine = try fleet.engine()
        let forger = fleet.store.coordinator()
        try await fleet.run {
            _ = await send(engine)
            await forger.publishLogout(until: Date(timeIntervalSince1970: 32_503_680_000), reason: "forged")
        }
        let result = try await fleet.run { await send(engine) }
        guard case .failure(.loggedOut(let until, _)) = result else { Issue.record("got \(result)"); return }
        #expect(until.timeIntervalSince(fleet.clock.date) <= 60.001)
        #expect(until.timeIntervalSince(fleet.clock.date) > 59)
    }
}

/// Sends one request to `/profile` and returns its outcome.
private func send(_ engine: PolicyEngine) async -> Result<HTTPResponse, PolicyEngineError> {
    do throws(PolicyEngineError) {
        return .success(try await engine.send(HTTPRequest(url: testURL)))
    } catch {
        return .failure(error)
    }
}

/// A token server whose refresh tokens are single use, and a refresh plugin calling it: accepts
/// only the newest access token it issued (none after ``expireAll()``), counts token calls and
/// refresh tokens presented twice (a reuse, which a real server punishes by revoking the family).
final class RotatingTokenServer: Transport, RefreshPlugin {
    static let initial = Credentials(accessToken: "token-0", refreshToken: "refresh-0")

    private struct State {
        var valid: String? = "token-0"
        var spent: Set<String> = []
        var presented: [String] = []
        var calls = 0
        var reuses = 0
        var delay: Duration = .zero
        var logoutNext = false
        var onRefresh: (@Sendable () -> Void)?
    }

    private let state = Locked(State())
    let clock: VirtualClock

    init(clock: VirtualClock) { self.clock = clock }

    var calls: Int { state.withLock { $0.calls } }
    var reuses: Int { state.withLock { $0.reuses } }
    var presented: [String] { state.withLock { $0.presented } }
    var delay: Duration {
        get { state.withLock { $0.delay } }
        set { state.withLock { $0.delay = newValue } }
    }
    var logoutNext: Bool {
        get { state.withLock { $0.logoutNext } }
        set { state.withLock { $0.logoutNext = newValue } }
    }
    var onRefresh: (@Sendable () -> Void)? {
        get { state.withLock { $0.onRefresh } }
        set { state.withLock { $0.onRefresh = newValue } }
    }

    /// The current access token stops being accepted.
    func expireAll() { state.withLock { $0.valid = nil } }

    func send(_ request: HTTPRequest) async throws -> HTTPResponse {
        let delay = state.withLock { $0.delay }
        if delay > .zero { try await clock.sleep(until: clock.now + delay) }
        return state.withLock { state in
            if state.logoutNext {
                state.logoutNext = false
                return response(#"{"status":202}"#)
            }
            let token = request.headers["Authorization"].map { String($0.dropFirst("Bearer ".count)) }
            return token != nil && token == state.valid ? response(#"{"status":0}"#) : response(#"{"status":1401}"#)
        }
    }

    func refresh(_ context: RefreshContext) async throws -> Credentials {
        let (call, hook) = state.withLock { state -> (Int, (@Sendable () -> Void)?) in
            state.calls += 1
            return (state.calls, state.onRefresh)
        }
        try await clock.sleep(until: clock.now + .milliseconds(100))
        hook?()
        return try state.withLock { state throws(RefreshFailure) -> Credentials in
            let presented = context.credentials?.refreshToken ?? ""
            state.presented.append(presented)
            guard !state.spent.contains(presented) else {
                state.reuses += 1
                throw RefreshFailure("invalid_grant: refresh token reused")
            }
            state.spent.insert(presented)
            state.valid = "token-\(call)"
            // Milliseconds in the expiry, as a server's expires_in gives them after a clock read.
            return Credentials(
                accessToken: "token-\(call)", refreshToken: "refresh-\(call)",
                expiresAt: clock.date.addingTimeInterval(3600.123))
        }
    }
}
