import Foundation
import ResponsePolicy

/// Runs the real engine against a scripted server on a virtual clock: no sleeping, no network,
/// the same events for the same script every time.
///
/// The refresh plugin is replaced by the script's `refresh` steps and the logout plugin does
/// nothing; everything else — classification, single flight, cooldown, backoff with seeded
/// jitter, deadlines, reloads — is the engine as it runs in production. Determinism comes from
/// ``SimulationScheduler``: every task the engine starts runs on one thread in FIFO order, and
/// virtual time moves only when nothing else can run.
package enum Simulator {
    package struct Summary: Sendable, Equatable {
        package var requests = 0
        package var delivered = 0
        package var failed = 0
        package var loggedOut = 0
        package var cancelled = 0
        package var refreshes = 0
        package var logouts = 0
        package var attempts = 0

        package init(
            requests: Int = 0, delivered: Int = 0, failed: Int = 0, loggedOut: Int = 0, cancelled: Int = 0,
            refreshes: Int = 0, logouts: Int = 0, attempts: Int = 0
        ) {
            self.requests = requests
            self.delivered = delivered
            self.failed = failed
            self.loggedOut = loggedOut
            self.cancelled = cancelled
            self.refreshes = refreshes
            self.logouts = logouts
            self.attempts = attempts
        }

        /// Counts what `event` says: an attempt sent, a logout, a request's outcome.
        package mutating func count(_ event: PolicyEvent) {
            switch event.kind {
            case .send: attempts += 1
            case .logout: logouts += 1
            case .outcome:
                switch event.result {
                case .delivered?: delivered += 1
                case .failed?: failed += 1
                case .loggedOut?: loggedOut += 1
                case .cancelled?: cancelled += 1
                case nil: break
                }
            default: break
            }
        }

        package var jsonLine: String {
            "{\"event\":\"summary\",\"requests\":\(requests),\"delivered\":\(delivered),\"failed\":\(failed),"
                + "\"logged-out\":\(loggedOut),\"refreshes\":\(refreshes),\"logouts\":\(logouts),\"attempts\":\(attempts)}"
        }
    }

    /// The most attempts one simulation may put on the wire: 1,000,000 (ten for each of the
    /// most requests a script may send). A run that reaches it stops with ``Failure/tooManyAttempts(limit:at:)``.
    package static let maxAttempts = 1_000_000

    package struct Result: Sendable {
        /// Every event in order; empty when they were streamed to `onEvent` instead.
        package var events: [PolicyEvent]
        package var summary: Summary
        /// Requests still registered and refresh waiters still parked after the run: both must
        /// be 0, or the engine leaked a continuation.
        package var leftovers: Int
    }

    package enum Failure: Error, Equatable, CustomStringConvertible {
        case stalled(at: Duration)
        case tooLong(at: Duration)
        case tooManyAttempts(limit: Int, at: Duration)

        package var description: String {
            switch self {
            case .stalled(let t):
                return
                    "the simulation stalled at t=\(PolicyEvent.seconds(t))s: requests wait for something that never happens"
            case .tooLong(let t): return "the simulation passed its virtual time limit at t=\(PolicyEvent.seconds(t))s"
            case .tooManyAttempts(let limit, let t):
                return
                    "the simulation stopped at t=\(PolicyEvent.seconds(t))s: it would put more than \(limit) attempts on the wire; send fewer requests or retries"
            }
        }
    }

    /// Runs `script` under `policy`. `loadPolicy` loads a reload step's file (relative paths are
    /// the caller's business) and throws its diagnostics when it fails lint.
    ///
    /// Memory stays bounded by the script, not by how long it runs: with `onEvent`, each event
    /// goes there as it happens and none is kept (the summary is counted on the way), and a run
    /// that would put more than `maxAttempts` attempts on the wire is stopped.
    package static func run(
        policy: Policy, script: SimulationScript, maxAttempts: Int = Simulator.maxAttempts,
        loadPolicy: @escaping @Sendable (String) throws(PolicyError) -> Policy = { path throws(PolicyError) in
            try Policy.load(path: path, limits: YAMLLimits(maxFileBytes: SimulationScript.maxReloadPolicyBytes))
        },
        onEvent: (@Sendable (PolicyEvent) -> Void)? = nil
    ) throws(Failure) -> Result {
        let clock = VirtualClock()
        let scheduler = SimulationScheduler(clock: clock, externalWorkGracePeriod: .zero)
        let collector = EventCollector(maxAttempts: maxAttempts, onEvent: onEvent)
        let tokenServer = script.tokens.map { TokenServer($0) }
        let refresh = ScriptedRefresh(steps: script.refresh, clock: clock, tokenServer: tokenServer)
        var options = PolicyEngine.Options()
        options.clock = clock
        options.taskExecutor = scheduler.executor
        options.random = SeededRandomSource(seed: script.seed)
        options.observers = [collector]
        options.refreshPlugin = refresh
        options.logoutPlugin = NoLogout()
        options.environment = [:]
        let engine = PolicyEngine(
            policy: policy,
            transport: ScriptedTransport(
                script: script, clock: clock, tokenServer: tokenServer, stopped: collector.isStopped),
            credentials: MemoryCredentialStore(Credentials(accessToken: "\(TokenServer.prefix)0")), options: options)

        do {
            try scheduler.run {
                await withTaskGroup(of: Void.self) { group in
                    for request in script.requests {
                        group.addTask {
                            try? await clock.sleep(until: request.at)
                            guard !Task.isCancelled else { return }
                            var headers = HTTPHeaders(request.headers)
                            if request.body != nil, headers["Content-Type"] == nil {
                                headers.set("Content-Type", "application/json")
                            }
                            let url =
                                URL(
                                    string: "https://simulated.invalid" + (request.path.hasPrefix("/") ? "" : "/")
                                        + request.path)
                                ?? URL(fileURLWithPath: "/")
                            _ = try? await engine.send(
                                HTTPRequest(
                                    method: request.method, url: url, headers: headers,
                                    body: request.body.map { Data($0.utf8) }, id: request.id))
                        }
                    }
                    // A file does not change on the virtual clock: each is compiled once.
                    let compiled = Locked<[String: Swift.Result<Policy, PolicyError>]>([:])
                    for step in script.reload {
                        group.addTask {
                            try? await clock.sleep(until: step.at)
                            guard !Task.isCancelled else { return }
                            _ = try? engine.reload(loading: { () throws(PolicyError) -> Policy in
                                let result =
                                    compiled.withLock { $0[step.policy] }
                                    ?? Swift.Result { () throws(PolicyError) -> Policy in
                                        try Self.checkPlugins(try loadPolicy(step.policy))
                                    }
                                compiled.withLock { $0[step.policy] = result }
                                return try result.get()
                            })
                        }
                    }
                    // Past the attempt limit every attempt fails at once; the first request to
                    // end then cancels the rest.
                    for await _ in group where collector.isStopped() { group.cancelAll() }
                }
                // As a process does before it exits: a token call still out (past its waiters'
                // timeout) answers or is abandoned, and a pair it brings is kept.
                if !collector.isStopped() { await engine.waitForBackgroundWork() }
            }
        } catch {
            throw .stalled(at: clock.now)
        }
        if collector.isStopped() { throw .tooManyAttempts(limit: maxAttempts, at: collector.stoppedAt) }
        var summary = collector.summary
        summary.requests = script.requests.count
        summary.refreshes = refresh.calls
        let leftovers = engine.leftovers
        return Result(events: collector.events, summary: summary, leftovers: leftovers)
    }

    /// `policy` when every plugin it names can be made, as a production reload would make them
    /// with the built-in factories: the simulation replaces the refresh and logout plugins, but a
    /// reload the engine would refuse for the plugin itself (an `exec` command that is not there,
    /// an option its factory refuses, a weak signing key) is refused in the simulation too (issue
    /// 32: it said `ok: true`). A simulation runs without the service's environment, so every
    /// variable the policy names (`*-env`, `{env:NAME}`) counts as set, to a placeholder: the
    /// same script gives the same events on every machine. Host plugins only declared
    /// (`--plugin`) are not made.
    static func checkPlugins(_ policy: Policy) throws(PolicyError) -> Policy {
        var references =
            [
                policy.refresh.plugin, policy.logout.plugin, policy.authorize, policy.store,
                policy.coordination,
            ].compactMap { $0 } + policy.observe
        for route in policy.routes {
            references += [route.refresh.plugin, route.logout.plugin, route.authorize].compactMap { $0 }
        }
        var environment: [String: String] = [:]
        func scan(_ key: String?, _ option: PluginOption) {
            switch option {
            case .string(let text):
                if let key, key.hasSuffix("-env") { environment[text] = placeholder }
                var rest = Substring(text)
                while let start = rest.range(of: "{env:") {
                    guard let end = rest[start.upperBound...].firstIndex(of: "}") else { break }
                    environment[String(rest[start.upperBound..<end])] = placeholder
                    rest = rest[rest.index(after: end)...]
                }
            case .list(let items): for item in items { scan(nil, item) }
            case .map(let fields): for (name, value) in fields { scan(name, value) }
            case .number, .bool: break
            }
        }
        for reference in references {
            for (key, option) in reference.options { scan(key, option) }
        }
        let problems = PluginRegistry().problems(in: policy, environment: environment, onlyRegistered: true)
        guard problems.isEmpty else {
            throw .invalid(file: policy.file, diagnostics: problems.map { $0.diagnostic(file: policy.file) })
        }
        return policy
    }

    /// What a variable the policy names holds while its plugins are checked: as long and varied
    /// as a real key, so no check refuses it for its form.
    static let placeholder = "simulation-placeholder-Q7w4Zx9Kp2Lm8Rt"

    /// ``run(policy:script:loadPolicy:)`` on its own thread, for async callers: the simulation
    /// blocks the thread it runs on, which must not be one of the concurrency pool's few.
    package static func run(
        policy: Policy, script: SimulationScript,
        maxAttempts: Int = Simulator.maxAttempts,
        loadPolicy: @escaping @Sendable (String) throws(PolicyError) -> Policy = { path throws(PolicyError) in
            try Policy.load(path: path, limits: YAMLLimits(maxFileBytes: SimulationScript.maxReloadPolicyBytes))
        },
        onEvent: (@Sendable (PolicyEvent) -> Void)? = nil
    ) async throws(Failure) -> Result {
        let outcome: Swift.Result<Result, Failure> = await withCheckedContinuation { continuation in
            let thread = Thread {
                do throws(Failure) {
                    continuation.resume(
                        returning: .success(
                            try run(
                                policy: policy, script: script, maxAttempts: maxAttempts, loadPolicy: loadPolicy,
                                onEvent: onEvent)))
                } catch {
                    continuation.resume(returning: .failure(error))
                }
            }
            thread.stackSize = 8 << 20
            thread.start()
        }
        return try outcome.get()
    }
}

/// Counts what the summary needs and keeps the events in order, or hands each to `onEvent` as it
/// comes and keeps none. Past `maxAttempts` sends it stops: later events are dropped and the
/// scripted transport fails every attempt.
final class EventCollector: PolicyObserver {
    private struct State {
        var events: [PolicyEvent] = []
        var summary = Simulator.Summary()
        var stopped = false
        /// When the attempt over the limit was to be sent.
        var stoppedAt: Duration = .zero
    }

    private let state = Locked(State())
    private let maxAttempts: Int
    private let onEvent: (@Sendable (PolicyEvent) -> Void)?

    init(maxAttempts: Int = Simulator.maxAttempts, onEvent: (@Sendable (PolicyEvent) -> Void)? = nil) {
        self.maxAttempts = maxAttempts
        self.onEvent = onEvent
    }

    func observe(_ event: PolicyEvent) {
        let forward: Bool = state.withLock { state in
            guard !state.stopped else { return false }
            if event.kind == .send, state.summary.attempts >= maxAttempts {
                state.stopped = true
                state.stoppedAt = event.time
                return false
            }
            state.summary.count(event)
            if onEvent == nil { state.events.append(event) }
            return true
        }
        if forward { onEvent?(event) }
    }

    var events: [PolicyEvent] { state.withLock { $0.events } }
    var summary: Simulator.Summary { state.withLock { $0.summary } }
    var stoppedAt: Duration { state.withLock { $0.stoppedAt } }
    var isStopped: @Sendable () -> Bool { { [state] in state.withLock { $0.stopped } } }
}

/// The scripted server: attempt n of a request gets its n-th response (the last repeats),
/// after the response's latency on the virtual clock. With a ``TokenServer``, an attempt signed
/// with a token the server does not accept gets the script's `rejected` answer instead, and does
/// not use up a response.
final class ScriptedTransport: Transport {
    let responses: [String: [SimulationScript.Response]]
    let latency: Duration
    let clock: VirtualClock
    let tokenServer: TokenServer?
    let attempts = Locked<[String: Int]>([:])
    /// Whether the run passed its attempt limit: then every attempt fails at once.
    let stopped: @Sendable () -> Bool

    init(
        script: SimulationScript, clock: VirtualClock, tokenServer: TokenServer?,
        stopped: @escaping @Sendable () -> Bool = { false }
    ) {
        self.stopped = stopped
        var responses: [String: [SimulationScript.Response]] = [:]
        for request in script.requests { responses[request.id] = request.responses }
        self.responses = responses
        latency = script.latency
        self.clock = clock
        self.tokenServer = tokenServer
    }

    func send(_ request: HTTPRequest) async throws -> HTTPResponse {
        if stopped() { throw TransportError(.connection, "the simulation stopped") }
        if let tokenServer, !tokenServer.accepts(request, at: clock.now) {
            return try await answer(tokenServer.rejected)
        }
        let id = request.id ?? ""
        let attempt = attempts.withLock { counts in
            counts[id, default: 0] += 1
            return counts[id, default: 1]
        }
        guard let list = responses[id], let last = list.last else {
            throw TransportError(.connection, "no scripted response")
        }
        return try await answer(attempt <= list.count ? list[attempt - 1] : last)
    }

    private func answer(_ scripted: SimulationScript.Response) async throws -> HTTPResponse {
        try await clock.sleep(until: clock.now + (scripted.latency ?? latency))
        if let error = scripted.error { throw TransportError(error, "scripted") }
        return HTTPResponse(
            status: scripted.status, headers: HTTPHeaders(scripted.headers), body: Data(scripted.body.utf8))
    }
}

/// The script's `refresh` steps as a refresh plugin: call n takes step n (the last repeats).
final class ScriptedRefresh: RefreshPlugin {
    let steps: [SimulationScript.RefreshStep]
    let clock: VirtualClock
    let tokenServer: TokenServer?
    private let count = Locked(0)

    init(steps: [SimulationScript.RefreshStep], clock: VirtualClock, tokenServer: TokenServer?) {
        self.steps = steps
        self.clock = clock
        self.tokenServer = tokenServer
    }

    var calls: Int { count.withLock { $0 } }

    func refresh(_ context: RefreshContext) async throws -> Credentials {
        let call = count.withLock { count in
            count += 1
            return count
        }
        let step = steps.isEmpty ? SimulationScript.RefreshStep() : steps[min(call, steps.count) - 1]
        return try await Self.answer(step, call: call, context, clock: clock, tokenServer: tokenServer)
    }

    /// What refresh call number `call` does for `step`: waits its `after`, then returns new
    /// tokens or throws its failure. (A replay's refresh answers with the same steps.)
    static func answer(
        _ step: SimulationScript.RefreshStep, call: Int, _ context: RefreshContext, clock: VirtualClock,
        tokenServer: TokenServer?
    ) async throws -> Credentials {
        try await clock.sleep(until: clock.now + step.after)
        switch step.result {
        case .ok:
            tokenServer?.issued(call, at: clock.now)
            if let body = step.body {
                // The token endpoint's 2xx answer as written, read by the oauth2 plugin's own parser:
                // an odd expires_in, token_type or refresh_token behaves as it does against a server.
                let response = HTTPResponse(status: step.status ?? 200, body: Data(body.utf8))
                return try OAuth2Refresh.pair(from: response, context, presented: context.credentials?.refreshToken)
            }
            return Credentials(
                accessToken: "\(TokenServer.prefix)\(call)", refreshToken: "sim-refresh-\(call)",
                expiresAt: step.expiresIn.map { clock.date.addingTimeInterval($0.seconds) })
        case .fail:
            let response = step.status.map { HTTPResponse(status: $0, body: Data((step.body ?? "").utf8)) }
            let answered = response.map { " (answered \($0.status)\(TokenEndpoint.oauthError(in: $0)))" } ?? ""
            throw RefreshFailure(
                "scripted refresh failure" + answered, response: response, retryAfter: step.retryAfter)
        case .transient:
            throw RefreshFailure(
                "scripted refresh failure: no answer (connection reset)", kind: .transient, retryAfter: step.retryAfter)
        }
    }
}

/// The server side of `tokens:`: which token it accepts now.
///
/// The simulated engine starts with token `sim-token-0`, and refresh call n issues `sim-token-n`.
/// The server accepts the newest token issued (the initial one until a refresh issues another,
/// and only when `initial: valid`) until an `expire` time at or after its issue passes.
///
/// Concurrency contract: any task may call it; the state lives behind one lock.
final class TokenServer: Sendable {
    static let prefix = "sim-token-"

    let rejected: SimulationScript.Response
    private let expire: [Duration]
    /// The newest token and when it was issued; nil while no token is accepted at all.
    private let newest: Locked<(number: Int, at: Duration)?>

    init(_ tokens: SimulationScript.Tokens) {
        rejected = tokens.rejected
        expire = tokens.expire
        newest = Locked(tokens.initial == .valid ? (0, .zero) : nil)
    }

    func issued(_ number: Int, at now: Duration) {
        newest.withLock { $0 = (number, now) }
    }

    /// The family was revoked (a refresh token presented twice): no token is accepted any more.
    func revoke() {
        newest.withLock { $0 = nil }
    }

    func accepts(_ request: HTTPRequest, at now: Duration) -> Bool {
        guard let token = Self.token(in: request), let newest = newest.withLock({ $0 }), token == newest.number else {
            return false
        }
        return !expire.contains { newest.at <= $0 && $0 <= now }
    }

    /// The number of the simulated token that signed `request`, wherever the authorizer put it
    /// (a header's value or the URL's query).
    static func token(in request: HTTPRequest) -> Int? {
        for field in request.headers {
            if let number = token(in: field.value) { return number }
        }
        return token(in: request.url.absoluteString)
    }

    private static func token(in text: String) -> Int? {
        guard let start = text.range(of: prefix)?.upperBound else { return nil }
        return Int(text[start...].prefix(while: \.isNumber))
    }
}
