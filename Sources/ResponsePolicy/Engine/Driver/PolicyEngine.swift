import Foundation
import Synchronization

/// Applies a policy to every request: signs it, sends it, classifies the response with the
/// compiled rule graph, and refreshes, logs out, retries or delivers as the matching rule says.
///
/// ```swift
/// let policy = try Policy.load(contentsOf: url, plugins: registry.catalog)
/// let engine = PolicyEngine(policy: policy, transport: URLSessionTransport(), plugins: registry,
///                           credentials: MemoryCredentialStore(Credentials(accessToken: token)))
/// let response = try await engine.send(HTTPRequest(url: profileURL))
/// ```
///
/// Concurrency contract: `send` may be called from any number of tasks at once; every call ends
/// with exactly one outcome (a response or one ``PolicyEngineError``). All mutable state —
/// credentials and their generation, the refresh in flight and its waiters, the logout
/// cooldown, the requests in flight, the retry budget — lives in one `Locked` (pthread-mutex) struct,
/// never held across an `await`. A refresh runs in its own task so that cancelling the request
/// that started it does not cancel it for the others waiting. Cancelling a caller's task
/// cancels its request, on the wire or in any wait, and `send` throws ``PolicyEngineError/cancelled``.
public final class PolicyEngine: Sendable {
    /// What the engine runs on besides the policy. Defaults are for production.
    public struct Options: Sendable {
        /// `SystemPolicyClock()` by default; a `VirtualClock` in tests and simulations.
        public var clock: any PolicyClock = SystemPolicyClock()
        /// The system generator by default; seed it for deterministic jitter.
        public var random: any RandomSource = SystemRandomSource()
        /// Observers besides the policy's `observe:` plugins.
        public var observers: [any PolicyObserver] = []
        /// Where plugins read secrets named in the policy; the process environment by default.
        public var environment: [String: String] = ProcessInfo.processInfo.environment
        /// The executor for tasks the engine starts itself (refreshes, logout calls, requests);
        /// `nil` (the global pool) by default. Simulations pass their scheduler.
        package var taskExecutor: (any TaskExecutor)?
        /// Replaces the policy's refresh plugin (the simulator's scripted refresh).
        package var refreshPlugin: (any RefreshPlugin)?
        /// Replaces the policy's logout plugin.
        package var logoutPlugin: (any LogoutPlugin)?
        /// Shares the session (its refresh, its logout, its credentials) with other engines and
        /// processes. `nil` by default: the coordinator the policy's `coordination:` names,
        /// `LocalSessionCoordinator` when it names none. One given here is shared as given; the
        /// engine does not stop it.
        public var coordinator: (any SessionCoordinator)?
        /// The longest body read for a business code: `1 MiB` by default. The scan reads a body
        /// whole (a code in a body that is not valid JSON is none, and the last of duplicate keys
        /// wins), so a longer body has no code rather than costing its length on every response.
        public var bodyScanLimit = 1 << 20
        /// The `User-Agent` of the engine's own calls (the refresh and logout plugins' token and
        /// logout requests) when they set none: `ResponsePolicy/<version>` by default; the `policy`
        /// command sends `policy/<version>`. Requests the host sends keep whatever the host and its
        /// transport give them.
        public var userAgent = ResponsePolicyVersion.userAgent

        /// Every option at its default (each says which).
        public init() {}
    }

    struct Overrides: Sendable {
        var refresh: (any RefreshPlugin)?
        var logout: (any LogoutPlugin)?
        var observers: [any PolicyObserver]
    }

    let transport: any Transport
    /// The transport of the refresh and logout calls (``Transport/sessionCallTransport``): they
    /// never queue behind the requests.
    let sessionTransport: any Transport
    /// The transport as a ``CancellableTransport`` when it is one (`attemptsInline`): attempts
    /// then run inline. (Not an optional: unwrapping one copied the existential on every attempt.)
    let inlineTransport: any CancellableTransport
    let attemptsInline: Bool
    let registry: PluginRegistry
    let store: (any CredentialStore)?
    let options: Options
    let clock: any PolicyClock
    let state: Locked<EngineState>
    let timers: TimerService
    /// Held by whoever resumes a parked request while it resumes it, and taken by the request once
    /// it is awake: the happens-before ThreadSanitizer needs between the waker's last read of the
    /// continuation and the request's next writes to the same task memory. (The runtime orders
    /// them with atomics of its own, which the sanitizer does not see: without this, a request
    /// woken by its backoff's timer and sent at once was reported as a race in one TSan run of four.)
    /// Uncontended but for the instant of a wake. (An `Int`, not `()`: in a debug build a zero-sized
    /// value shares its address with the lock's acquisition counter, which the sanitizer reports.)
    let resumeGate = Locked(0)
    /// The refresh flight's timer on the heap, by flight, with its token (see `armFlightTimer`).
    let flightTimers = Locked<[UInt64: (token: UInt64, node: TimerNode)]>([:])
    /// Serialises credential-store writes; holds the generation last written.
    let saving = Locked<UInt64>(0)
    /// Where refresh turns, publications and logouts are shared (see ``SessionCoordinator``).
    let coordinator: any SessionCoordinator
    /// The coordinator is the built-in local one: answered inline, never awaited.
    let coordinatorIsLocal: Bool
    /// The engine made the coordinator from the policy, so it stops it.
    let ownsCoordinator: Bool
    /// What the coordinator says about its store's trust at start (a Redis on another host with no
    /// `signing-key-env`): a `problem` event at start, and listed in ``problems`` for good.
    package let coordinationWarning: PluginError?
    /// The join of the shared session is still running: new requests wait for it (read without
    /// the lock on every `send`; `joining` holds the waiters).
    let joinPending = Atomic<Bool>(false)
    let joining = Locked(JoinState())

    struct JoinState {
        var pending = false
        var waiters: [CheckedContinuation<Void, Never>] = []
    }

    /// - Parameters:
    ///   - policy: a loaded policy.
    ///   - transport: what sends requests.
    ///   - plugins: the registry the policy's `use:` names are made from; built-ins by default.
    ///   - credentials: where credentials are loaded from at start and saved after a refresh;
    ///     `nil` for none (requests go out unsigned until ``signIn(_:)``).
    ///   - options: clock, randomness, observers, executor.
    public init(
        policy: Policy, transport: any Transport, plugins: PluginRegistry = PluginRegistry(),
        credentials: (any CredentialStore)? = nil, options: Options = Options()
    ) {
        self.transport = transport
        sessionTransport = UserAgentTransport(transport.sessionCallTransport, userAgent: options.userAgent)
        if let cancellable = transport as? any CancellableTransport {
            inlineTransport = cancellable
            attemptsInline = true
        } else {
            inlineTransport = NotCancellable()
            attemptsInline = false
        }
        registry = plugins
        store = credentials
        self.options = options
        clock = options.clock
        let runtime = PolicyRuntime(
            policy: policy, registry: plugins, transport: sessionTransport, environment: options.environment,
            overrides: Overrides(
                refresh: options.refreshPlugin, logout: options.logoutPlugin, observers: options.observers))
        timers = TimerService(clock: options.clock, executor: options.taskExecutor)
        var initial = EngineState(runtime: runtime)
        var loadProblem: String?
        do {
            if let stamping = credentials as? any SessionStampingStore {
                // With the generation and epoch the fleet gave them: a restarted process never
                // takes the fleet backwards (issue 30).
                let saved = try stamping.loadSaved()
                initial.credentials = saved?.credentials
                initial.sharedGeneration = saved?.generation ?? 0
                initial.sharedEpoch = saved?.epoch ?? 0
                if let saved, !saved.published {
                    // A pair a previous run got but could not publish (issue 30, case 4): published
                    // over the generation it replaces before this run refreshes.
                    initial.refresh.unpublished = (
                        saved.credentials, RefreshLease(fencingToken: 0, generation: saved.generation)
                    )
                }
            } else {
                initial.credentials = try credentials?.load()
            }
        } catch {
            loadProblem = "the credential store could not be read (\(Self.describe(error))); requests go out unsigned"
        }
        var coordinationProblem: String?
        if let given = options.coordinator {
            coordinator = given
            ownsCoordinator = false
        } else {
            do {
                // A `file` coordinator shares the file this engine's store keeps its tokens in.
                coordinator = try plugins.makeCoordinator(
                    for: policy, environment: options.environment,
                    credentialsPath: (credentials as? any FileBackedCredentialStore)?.credentialsFilePath)
            } catch {
                if policy.coordinationOnUnavailable == .wait {
                    // Refreshing alone would present the refresh token the rest of the fleet holds.
                    coordinationProblem = "\(error.reason); refreshes fail until it is fixed (on-unavailable: wait)"
                    coordinator = UnavailableSessionCoordinator(reason: error.reason)
                } else {
                    coordinationProblem = "\(error.reason); the session is coordinated in this engine alone"
                    coordinator = LocalSessionCoordinator()
                }
            }
            ownsCoordinator = true
        }
        coordinatorIsLocal = coordinator is LocalSessionCoordinator
        coordinationWarning = (coordinator as? any TrustWarning)?.trustWarning.map { warning in
            PluginError(
                kind: .coordination, name: policy.coordination.name, reason: warning, range: policy.coordination.range)
        }
        let saved = initial.credentials.map {
            SharedSession(credentials: $0, generation: initial.sharedGeneration, epoch: initial.sharedEpoch)
        }
        state = Locked(initial)
        reportProblems(runtime)
        if let loadProblem { problem(loadProblem, runtime) }
        if let coordinationProblem {
            state.withLock { state in
                state.coordinationProblem = PluginError(
                    kind: .coordination, name: policy.coordination.name, reason: coordinationProblem,
                    range: policy.coordination.range)
            }
            problem("coordination plugin '\(policy.coordination.name)': " + coordinationProblem, runtime)
        }
        if let coordinationWarning { problem("coordination: \(coordinationWarning.reason)", runtime) }
        if !coordinatorIsLocal {
            joining.withLock { $0.pending = true }
            joinPending.store(true, ordering: .releasing)
            startCoordination(saved: saved)
        }
    }

    deinit {
        if ownsCoordinator { coordinator.stop() }
    }

    /// Emits a `problem` event.
    func problem(_ reason: String, _ runtime: PolicyRuntime) {
        emit(runtime) {
            var event = PolicyEvent(.problem, time: clock.now)
            event.reason = reason
            return event
        }
    }

    /// Reports the plugins a runtime could not make, as soon as it is installed: a deployment
    /// error (a missing environment variable) should show at start, not at the first refresh.
    func reportProblems(_ runtime: PolicyRuntime) {
        for error in runtime.problems { problem(error.description, runtime) }
    }

    /// Saves the current credentials, reporting a failure as a `problem` event (a rotated refresh
    /// token that is not saved is lost at the next start).
    ///
    /// Saves are serialised and each writes what is current when it runs, skipping a generation
    /// already written: two refreshes (or a refresh and a sign-in) ending together cannot leave
    /// the store holding the older credentials, however slow its first write. Lock order: the
    /// save lock, then the engine's; never the reverse. The event is emitted outside both.
    func saveCredentials(_ runtime: PolicyRuntime, again: Bool = false) {
        guard let store else { return }
        let failure = saving.withLock { lastSaved -> (any Error)? in
            let (credentials, generation, shared, epoch, unpublished) = state.withLock {
                ($0.credentials, $0.generation, $0.sharedGeneration, $0.sharedEpoch, $0.refresh.unpublished)
            }
            // `again`: the same credentials, now numbered by the fleet (a pair just published).
            guard let credentials, generation > lastSaved || (again && generation == lastSaved) else { return nil }
            do {
                // With the fleet's numbering (issue 30): the generation these credentials have, or
                // for a pair not yet published the one they replace (never more than the truth).
                if let stamping = store as? any SessionStampingStore {
                    let pending = unpublished.map { $0.credentials.sameTokens(as: credentials) } ?? false
                    let numbered = pending ? unpublished?.lease.generation ?? shared : shared
                    try stamping.save(
                        SavedCredentials(
                            credentials: credentials, generation: numbered, epoch: epoch, published: !pending))
                } else {
                    try store.save(credentials)
                }
                lastSaved = generation
                return nil
            } catch {
                return error
            }
        }
        if let failure {
            problem("the credential store could not be written (\(Self.describe(failure)))", runtime)
        }
    }

    /// An error's description for events: its own text when it is one of ours (they carry no
    /// secrets), else only its type.
    static func describe(_ error: any Error) -> String {
        switch error {
        case let error as PluginError: return error.description
        case let error as TransportError: return error.description
        case let error as RefreshFailure: return error.description
        default: return String(describing: type(of: error))
        }
    }

    /// The policy new requests run under.
    public var policy: Policy { state.withLock { $0.runtime.policy } }

    /// Whether the session is in its logout cooldown.
    public var isLoggedOut: Bool {
        let now = clock.now
        return state.withLock { $0.isLoggedOut(at: now) }
    }

    /// Signs in with new credentials: ends a logout cooldown early and makes every request that
    /// hits a trigger afterwards use these.
    ///
    /// The coordinator publishes the sign-in to every engine that shares the session.
    public func signIn(_ credentials: Credentials) {
        let runtime = state.withLock { state in
            state.signIn(credentials)
            return state.runtime
        }
        saveCredentials(runtime)
        guard !coordinatorIsLocal else { return }
        let coordinator = coordinator
        runInBackground { [weak self] in
            guard let session = await coordinator.publishSignIn(credentials) else { return }
            self?.signedIn(session, credentials)
        }
    }

    /// Makes an engine, refusing a policy whose plugins cannot be made: an unset `{env:…}` or
    /// `*-env` variable, an unreadable `{file:…}` or `*-file`, a missing `exec` command, a host
    /// plugin that is not registered. Use it at start so a deployment mistake stops the service
    /// instead of logging users out at the first refresh.
    ///
    /// ```swift
    /// let engine = try PolicyEngine(checking: policy, transport: URLSessionTransport(), plugins: registry)
    /// ```
    ///
    /// - Throws: ``PolicyError/invalid(file:diagnostics:)`` with one `plugin-unavailable` finding
    ///   per plugin that could not be made (names of variables and files, never their values).
    public convenience init(
        checking policy: Policy, transport: any Transport, plugins: PluginRegistry = PluginRegistry(),
        credentials: (any CredentialStore)? = nil, options: Options = Options()
    ) throws(PolicyError) {
        self.init(policy: policy, transport: transport, plugins: plugins, credentials: credentials, options: options)
        // A warning about the store's trust is not a plugin that cannot be made.
        let problems = self.problems.filter { $0 != coordinationWarning }
        if !problems.isEmpty {
            throw .invalid(file: policy.file, diagnostics: problems.map { $0.diagnostic(file: policy.file) })
        }
    }

    /// The plugins of the running policy that could not be made; empty when all could. Each
    /// was also reported as a `problem` event. Check it at start (or use ``init(checking:transport:plugins:credentials:options:)``):
    ///
    /// ```swift
    /// for problem in engine.problems { logger.critical("\(problem)") }
    /// precondition(engine.problems.isEmpty)
    /// ```
    ///
    /// Coordination trouble is listed too, while it lasts: a coordinator that could not be made
    /// (an unset `password-env`, a `rediss://` URL this build cannot use), or a store that is
    /// unreachable now (removed when it is back).
    /// A warning about the store's trust stays listed (`coordinationWarning`: a Redis on another
    /// host without `signing-key-env`, a `file` store in a folder other users can write); it does
    /// not make ``init(checking:transport:plugins:credentials:options:)`` throw.
    public var problems: [PluginError] {
        state.withLock { state in
            state.runtime.problems + (state.coordinationProblem.map { [$0] } ?? [])
                + (coordinationWarning.map { [$0] } ?? [])
        }
    }

    /// Runs new requests under `policy`; requests in flight finish under the one they started with.
    /// A policy whose plugins cannot be made (see ``problems``) is refused: the running policy
    /// stays and a `reload` event with `ok: false` is emitted.
    ///
    /// - Throws: ``PolicyError/invalid(file:diagnostics:)`` with `plugin-unavailable` findings.
    public func reload(_ policy: Policy) throws(PolicyError) {
        let runtime = makeRuntime(policy)
        guard runtime.problems.isEmpty else {
            let error = PolicyError.invalid(
                file: policy.file, diagnostics: runtime.problems.map { $0.diagnostic(file: policy.file) })
            refused(error)
            throw error
        }
        state.withLock { $0.runtime = runtime }
        var event = PolicyEvent(.reload, time: clock.now)
        event.ok = true
        emit(event, runtime)
    }

    /// Emits the `reload` event of a refused policy, under the running one.
    private func refused(_ error: PolicyError) {
        var event = PolicyEvent(.reload, time: clock.now)
        event.ok = false
        let errors = error.diagnostics.filter { $0.severity == .error }
        event.reason =
            errors.first.map { "\($0.range.start.line):\($0.range.start.column): \($0.message)" } ?? "\(error)"
        emit(event, state.withLock { $0.runtime })
    }

    /// Loads and lints a policy file and runs new requests under it. A file with errors is
    /// refused, the running policy stays, and a `reload` event with `ok: false` is emitted.
    ///
    /// - Throws: ``PolicyError`` with the file's diagnostics when it is refused.
    @discardableResult
    public func reload(contentsOf url: URL) throws(PolicyError) -> Policy {
        let catalog = registry.catalog
        return try reload(loading: { () throws(PolicyError) -> Policy in
            try Policy.load(contentsOf: url, plugins: catalog)
        })
    }

    /// Reloads from whatever `load` produces; refused (with a `reload` event) when it throws.
    package func reload(loading load: () throws(PolicyError) -> Policy) throws(PolicyError) -> Policy {
        let policy: Policy
        do {
            policy = try load()
        } catch {
            refused(error)
            throw error
        }
        try reload(policy)
        return policy
    }

    func makeRuntime(_ policy: Policy) -> PolicyRuntime {
        PolicyRuntime(
            policy: policy, registry: registry, transport: sessionTransport, environment: options.environment,
            overrides: Overrides(
                refresh: options.refreshPlugin, logout: options.logoutPlugin, observers: options.observers))
    }

    /// Hands `event` to the observers with the wall-clock time. (Events about a request carry its
    /// method and path from its ``RequestContext``.)
    func emit(_ event: PolicyEvent, _ runtime: PolicyRuntime) {
        guard !runtime.observers.isEmpty else { return }
        var event = event
        event.date = clock.date
        for observer in runtime.observers { observer.observe(event) }
    }

    /// Builds and emits an event only when someone observes: with no observers the request path
    /// creates no event at all.
    @inline(__always)
    func emit(_ runtime: PolicyRuntime, _ build: () -> PolicyEvent) {
        guard !runtime.observers.isEmpty else { return }
        emit(build(), runtime)
    }

    /// Sends `request` under the policy and returns the delivered response.
    ///
    /// - Throws: ``PolicyEngineError``; exactly one outcome per call.
    public func send(_ request: HTTPRequest) async throws(PolicyEngineError) -> HTTPResponse {
        if joinPending.load(ordering: .acquiring) { await awaitJoin() }
        let machine = try admit(request)
        // The loop runs in the caller's task. Its cancellation reaches an inline attempt as task
        // cancellation (a transport must honour it); a park or an attempt in a task of its own
        // installs a handler for as long as it lasts. (One handler around the whole loop cost
        // 125 ns per send, most of it on requests that never wait.)
        await drive(machine)
        return try outcome(of: machine)
    }

    @inline(never)  // its temporaries stay out of `send`'s async frame
    private func outcome(of machine: RequestMachine) throws(PolicyEngineError) -> HTTPResponse {
        // (Its slot left the state in the transition that decided the outcome.)
        try machine.result.get()
    }

    /// Numbers a request and makes its machine, or refuses it at once: during the logout
    /// cooldown (without touching the network) or when the caller is already cancelled.
    @inline(never)  // its temporaries stay out of the waiting request's async frame
    private func admit(_ request: HTTPRequest) throws(PolicyEngineError) -> RequestMachine {
        let now = clock.now
        let (number, runtime, loggedOutUntil) = state.withLock { state in
            state.nextRequest += 1
            state.budget.recordRequest(at: now)
            let refused = state.isLoggedOut(at: now) ? state.cooldown : nil
            return (state.nextRequest, state.runtime, refused)
        }
        // The path is computed once: `URL.path` builds a new string on every call.
        let context = RequestContext(
            number: number, explicitID: request.id, runtime: runtime, start: now, method: request.method,
            path: request.path)
        if let (until, reason) = loggedOutUntil {
            emit(runtime) {
                var event = PolicyEvent(.outcome, time: now, context: context)
                event.result = .loggedOut
                event.scope = runtime.policy.graph.scope(method: context.method, path: context.path).id
                return event
            }
            throw .loggedOut(until: until, reason: reason)
        }
        if Task.isCancelled {
            emit(runtime) {
                var event = PolicyEvent(.outcome, time: now, context: context)
                event.result = .cancelled
                event.scope = runtime.policy.graph.scope(method: context.method, path: context.path).id
                return event
            }
            throw .cancelled
        }
        return RequestMachine(engine: self, original: request, context: context, date: clock.date)
    }

    /// Ends a request from outside its loop: marks why, cancels its attempt, ends its park.
    func end(_ id: UInt64, _ reason: EngineState.EndReason) {
        perform(state.withLock { $0.end(id, reason) }, for: nil)
    }

    /// Requests still registered or waiting on a refresh: zero once every `send` has returned.
    package var leftovers: Int { state.withLock { $0.leftovers } }
}

/// One request's identity and the runtime it started under.
struct RequestContext: Sendable {
    let number: UInt64
    /// The caller's id for the request, when it gave one.
    let explicitID: String?
    let runtime: PolicyRuntime
    let start: Duration
    /// The request's method and path (never its query), for the machine and for events.
    let method: String
    let path: String

    /// The id events use: the caller's, or `r<number>` (made only when an event needs it).
    var id: String { explicitID ?? "r\(number)" }
}

/// The placeholder `inlineTransport` of an engine whose transport is not a
/// ``CancellableTransport``; never called.
private struct NotCancellable: CancellableTransport {
    func send(_ request: HTTPRequest) async throws -> HTTPResponse { throw CancellationError() }
    func send(_ request: HTTPRequest, cancellation: AttemptCancellation) async throws -> HTTPResponse {
        throw CancellationError()
    }
}
