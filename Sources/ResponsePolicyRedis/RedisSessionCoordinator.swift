import Dispatch
import Foundation
import ResponsePolicy

/// Shares one session between processes on many machines through Redis: one refresh and one
/// logout for every process that uses the same `key`.
///
/// What lives in Redis, under keys that share the hash tag `{key}` (so a cluster keeps them on one
/// slot and the scripts may touch them together):
///
/// | key | what |
/// |---|---|
/// | `response-policy:{key}:session` | hash: `gen`, `creds` (JSON), `epoch` (last sign-in's `gen`, sealed if keyed), `lease` and `lease-until` (a copy of the lease), `retry-after` and `retry-after-why` (the token endpoint's `Retry-After` a holder was given: ms since 1970, sealed if keyed; no lease before it), `accepted` (the newest generation a process saw accepted) |
/// | `response-policy:{key}:lease` | the fencing token of the process refreshing now, `PX lease` |
/// | `response-policy:{key}:fence` | the counter fencing tokens come from |
/// | `response-policy:{key}:logout` | the cooldown's end (ms since 1970; sealed with its epoch), TTL to that end |
/// | `response-policy:{key}:loops` | sorted set of the generations `refresh.limit` counts fleet-wide (a token refused before any process saw it accepted; sealed if keyed), scored by when, `PX` the window |
/// | `response-policy:{key}:events` | the pub/sub channel of publications, grants, logouts and failures |
///
/// Each coordinator call is one round trip: a Lua script (`EVAL`) that compares, decides and
/// writes atomically (``seedScript``, ``beginScript``, ``publishScript``…). A refresh trigger first
/// compares generations (newer credentials in Redis: retry with them); otherwise, unless the token
/// endpoint asked a holder to wait (`retry-after`: answered with that end, and nobody calls it
/// before) or `refresh.limit` is used up, it takes the lease (`SET PX`, with a fencing token past
/// every one seen) and announces it. The holder's
/// publication stores the credentials and a new generation when nobody published since its lease
/// was granted, then `PUBLISH`es them. The others wait for that message on a subscription (a
/// second connection read by its own thread), bounded by `refresh.timeout`; when the lease
/// expires (its holder died) the next question is granted a new one.
///
/// Redis may forget (FLUSHALL, an eviction, a restart with no persistence, a failover) or stall
/// (`CLIENT PAUSE`). Each process remembers (``CoordinationMemory``) the newest session it has
/// seen or saved, the highest fencing token and the last lease announced, and tells every
/// question: a Redis behind that is re-seeded from the newest pair (with the lease the process
/// saw put back, or a quarantine of one lease when it cannot vouch for the last lease length),
/// so generations never go backwards and a lease is honoured for its term. A publication is
/// never abandoned on a client timeout: it keeps its connection until Redis answers (a paused
/// Redis runs it first when the pause ends, before any question sent after it), while the caller
/// is told it is in flight.
///
/// The hot path never touches Redis: nothing here runs for a request that triggers no refresh
/// and no logout, and the subscription is pushed to, never polled.
///
/// When Redis cannot be reached, calls answer `.unavailable` (or return quietly) within
/// `connect-timeout`, one `.problem` update is sent, the subscriber reconnects with backoff (50 ms
/// doubling to 2 s), re-reads the session (re-seeding it when Redis lost it) and sends
/// `.recovered`.
///
/// ```swift
/// let coordinator = try RedisSessionCoordinator(
///     .init(url: "redis://127.0.0.1:6379/0", key: "mobile-api", password: env["REDIS_PASSWORD"]))
/// ```
///
/// Concurrency contract: see ``SessionCoordinator``. Commands run one at a time on a private
/// serial queue (never on the cooperative pool), each bounded by `connect-timeout`; a publication
/// runs on a connection of its own.
package final class RedisSessionCoordinator: SessionCoordinator {
    package struct Configuration: Sendable, Equatable {
        /// `redis://[user@]host[:port][/db]`; no password in it.
        package var url: String
        /// Processes with the same key share one session.
        package var key: String
        /// How long a refresh lease lasts if its holder never ends it; `15s` by default.
        package var lease: Duration
        /// The most any call waits for Redis itself; `250ms` by default. A publication waits for
        /// its answer longer (see ``publicationWait``): abandoning it would drop a pair.
        package var connectTimeout: Duration
        /// From the environment variable named by `password-env`; never logged.
        package var password: String?
        /// From the environment variable named by `signing-key-env`: credentials and logouts read
        /// from Redis are used only when signed with it. `nil` (unsigned) by default.
        package var signingKey: Data?

        package init(
            url: String, key: String, lease: Duration = .seconds(15), connectTimeout: Duration = .milliseconds(250),
            password: String? = nil, signingKey: Data? = nil
        ) {
            self.url = url
            self.key = key
            self.lease = lease
            self.connectTimeout = connectTimeout
            self.password = password
            self.signingKey = signingKey
        }

        /// How long `publish` waits for Redis's answer before it tells the caller the pair is in
        /// flight: one lease (at least `connectTimeout`). The command is not abandoned then: its
        /// connection stays open (up to ``publicationLimit``) so Redis runs it when it can.
        var publicationWait: Duration { max(connectTimeout, lease) }
    }

    /// The longest a publication's connection is kept open for Redis's answer.
    static let publicationLimit: Duration = .seconds(600)

    struct Keys {
        let session, lease, fence, logout, loops, channel: String
        init(_ key: String) {
            let prefix = "response-policy:{\(key)}:"
            session = prefix + "session"
            lease = prefix + "lease"
            fence = prefix + "fence"
            logout = prefix + "logout"
            loops = prefix + "loops"
            channel = prefix + "events"
        }
    }

    struct State {
        var updates: (@Sendable (SessionUpdate) -> Void)?
        /// What this process remembers of the session (the newest generation, the fence, the last
        /// lease announced, whether it has heard everything lately).
        var memory = CoordinationMemory()
        /// Refreshes that failed elsewhere, by the fencing token of their lease (the last few).
        var failures: [UInt64: String] = [:]
        var health = CoordinatorHealth()
        var stopped = false
        var subscriberRunning = false
        /// A logout this process could not publish (Redis was unreachable): its end and reason.
        var pendingLogout: (until: Int64, reason: String, epoch: UInt64)?
        /// Leases granted to this process: their announcements are not another's lease.
        var own: Set<UInt64> = []
        /// Publications sent whose answer has not come yet.
        var inFlight = 0
        /// Whether Redis's eviction settings were checked (once, on the first connection).
        var settingsChecked = false
        /// Turns whose answers were lost: the next question asks under one of their ids.
        var abandoned = AbandonedAskers()
        /// When this process last corrected a store re-seeded with an older pair (its clock, ms).
        var lastCorrection: Int64 = -1_000_000
    }

    /// The command connection; touched only on `queue`.
    final class ConnectionBox: @unchecked Sendable {
        // @unchecked: read and written only by blocks running on the coordinator's serial queue.
        var connection: RedisConnection?
        /// The SHA1 of each script the server has loaded (`SCRIPT LOAD`), so calls send `EVALSHA`.
        var scripts: [String: String] = [:]
    }

    package let configuration: Configuration
    let endpoint: RedisEndpoint
    let keys: Keys
    let signer: SharedStateSigner?
    let state = Locked(State())
    let signal = ChangeSignal()
    let queue = DispatchQueue(label: "response-policy.redis-coordinator")
    let box = ConnectionBox()

    /// - Throws: ``CoordinationError`` when the URL or key cannot be used.
    package init(_ configuration: Configuration) throws(CoordinationError) {
        switch RedisEndpoint.parse(configuration.url) {
        case .failure(let error): throw CoordinationError(error.message)
        case .success(let endpoint):
            if endpoint.tls {
                throw CoordinationError(
                    "rediss:// (TLS) needs hiredis built with SSL, which this build lacks; reach Redis through a TLS tunnel on a loopback port"
                )
            }
            self.endpoint = endpoint
        }
        guard !configuration.key.isEmpty, !configuration.key.contains(where: { "{}".contains($0) || $0.isWhitespace })
        else { throw CoordinationError("'key' must be a non-empty name without spaces or braces") }
        self.configuration = configuration
        keys = Keys(configuration.key)
        signer = configuration.signingKey.map { SharedStateSigner(key: $0, scope: "redis:" + configuration.key) }
    }

    deinit {
        state.withLock { $0.stopped = true }
    }

    /// This process's clock for what it remembers.
    static var monotonicNow: Int64 { ContinuousClock.now.coordinationMilliseconds }

    // MARK: - SessionCoordinator

    package func start(local: Credentials?, updates: @escaping @Sendable (SessionUpdate) -> Void) async
        -> SharedSession?
    {
        await start(saved: local.map { SharedSession(credentials: $0, generation: 0) }, updates: updates)
    }

    package func start(saved: SharedSession?, updates: @escaping @Sendable (SessionUpdate) -> Void) async
        -> SharedSession?
    {
        let startSubscriber = state.withLock { state -> Bool in
            state.updates = updates
            if let saved { state.memory.saw(saved) }
            defer { state.subscriberRunning = true }
            return !state.subscriberRunning
        }
        var shared: SharedSession?
        let seen = state.withLock { $0.memory.generation }
        if case .success(let reply) = await run(seedCommand()) {
            let items = reply.items
            // {1}: seeded from what this process saved; {0, …} with no credentials: nothing shared yet.
            if items.first?.integer == 1, saved?.credentials != nil {
                state.withLock { $0.memory.sawStoreSession() }
            }
            if items.count >= 4, items[0].integer == 0, case .success(let session) = session(items, seenBefore: seen) {
                if session.credentials != nil || session.loggedOutUntil != nil {
                    remember(session)
                    shared = session
                }
            }
            checkStoreSettings()
        }
        // After `remember`: the subscriber's first read must not announce what start returns.
        if startSubscriber {
            let thread = Thread { [self] in subscriberLoop() }
            thread.name = "response-policy.redis-subscriber"
            thread.start()
        }
        return shared
    }

    package func beginRefresh(_ request: RefreshTurnRequest) async -> RefreshTurn {
        let deadline = ContinuousClock.now + request.timeout
        let leaseLength = request.leaseLength(configured: configuration.lease)
        let leaseMs = leaseLength.milliseconds()
        var waited = false
        var holder: UInt64?
        var predictions = 0
        var reseeds = 0
        // A `retry-after` in Redis this process refused (forged, unsigned under a key): removed.
        var refusedEmbargo = ""
        var embargoChecks = 0
        while true {
            if Task.isCancelled { return .unavailable("the refresh was cancelled while it waited for its turn") }
            let seen = signal.version
            if waited {
                let (latest, failure) = state.withLock { state in
                    (state.memory.newest, holder.flatMap { state.failures[$0] })
                }
                if let latest, latest.generation > request.failedGeneration, latest.credentials != nil {
                    return .published(latest)
                }
                if let failure { return .failedElsewhere(failure) }
            }
            let remaining = deadline - ContinuousClock.now
            if waited, remaining <= .zero {
                return .failedElsewhere(WaitFailure.reason(holder: holder, timeout: request.timeout))
            }
            let limit = request.limit
            let sent = ContinuousClock.now
            let asker = state.withLock { $0.abandoned.take() }
            let knownBefore = state.withLock { $0.memory.generation }
            let arguments =
                [
                    "EVAL", Self.beginScript, "5", keys.session, keys.lease, keys.fence, keys.logout, keys.loops,
                    // Never shorter than the refresh it covers (a live holder keeps its lease).
                    String(request.failedGeneration), String(leaseMs),
                    String(limit?.count ?? 0), String(limit?.per.milliseconds() ?? 0),
                ] + sealedLeaseArguments(leaseMs: leaseMs) + knowledgeArguments(leaseMs: leaseMs)
                + [keys.channel, String(asker), state.withLock { $0.memory.knowledge(now: 0).hasPair } ? "1" : ""]
                + [
                    loopMember(request.failedGeneration), refusedEmbargo,
                    String(CoordinationRecord.longestEmbargoMs),
                ]
            switch await run(arguments) {
            case .failure(let error):
                // Redis may have run it (a client timeout): a lease granted to it is this
                // coordinator's next question's.
                state.withLock { $0.abandoned.abandon(asker) }
                return .unavailable(error.message)
            case .success(let reply):
                let items = reply.items
                switch items.first?.integer {
                case 0 where items.count >= 4:
                    switch session(items, seenBefore: knownBefore) {
                    case .failure(let error): return .unavailable(error.reason)
                    case .success(let session):
                        remember(session)
                        return waited ? .published(session) : .newer(session)
                    }
                case 1 where items.count >= 3:
                    var granted = RefreshLease(
                        fencingToken: UInt64(items[1].integer ?? 0), generation: UInt64(items[2].integer ?? 0))
                    state.withLock { state in
                        state.memory.holds(fence: granted.fencingToken)
                        state.own.insert(granted.fencingToken)
                    }
                    if let refusal = grantProblem(granted) {
                        await endRefresh(granted, failure: nil)
                        send(.problem(refusal))
                        return .unavailable(refusal)
                    }
                    // Its term runs from when this process asked: a grant that reached it late (a
                    // freeze, a slow reply) has less left, and the refresh must fit in it.
                    granted.term = leaseLength - (ContinuousClock.now - sent)
                    if items.count > 3, let left = items[3].integer {
                        granted.term = min(leaseLength, .milliseconds(left)) - (ContinuousClock.now - sent)
                    }
                    return .lease(granted)
                case 2 where items.count >= 3:
                    switch leaseHolder(items[1]) {
                    case .failure(let error): return .unavailable(error.reason)
                    case .success(let fence): holder = fence
                    }
                    // A lease this process saw is honoured for its whole term, even if Redis forgets
                    // it before its holder publishes (its call may be at the token endpoint).
                    if let fence = holder, fence > 0, let value = items[1].text {
                        let left = max(1, items[2].integer ?? 1)
                        state.withLock { state in
                            state.memory.heardGrant(
                                fence: fence, generation: request.failedGeneration, value: value, leaseMs: left,
                                now: Self.monotonicNow)
                        }
                    }
                    waited = true
                    let leaseLeft = Duration.milliseconds(max(1, items[2].integer ?? 1)) + .milliseconds(5)
                    // At most 500 ms between looks at Redis, in case a message was lost in a reconnect.
                    await signal.wait(after: seen, timeout: min(remaining, leaseLeft, .milliseconds(500)))
                case 6 where items.count >= 3:
                    // The token endpoint asked a holder to wait: no lease, and no call, before then.
                    switch retryAfter(items[1], reason: items[2].text ?? "") {
                    case .success(let embargo): return embargo
                    case .failure(let error):
                        embargoChecks += 1
                        guard embargoChecks <= 2 else { return .unavailable(error.reason) }
                        refusedEmbargo = items[1].text ?? ""
                    }
                case 3:
                    if let refusal = limitProblem(Array(items.dropFirst()), perMs: limit?.per.milliseconds() ?? 0) {
                        return .unavailable(refusal)
                    }
                    return .limited
                case 4 where items.count >= 2 && signer != nil:
                    // The fencing counter moved since this process last saw it: ask again with the
                    // token after it (a grant must carry the token this process sealed its lease for).
                    if let refusal = counterProblem(items[1]) { return .unavailable(refusal) }
                    predictions += 1
                    if predictions > 8 {
                        return .unavailable(
                            "the fencing counter of \(keys.fence) on \(endpoint) kept moving; try again")
                    }
                case 5 where items.count >= 2:
                    // Redis holds an older generation than this process knows: it forgot (a flush,
                    // an eviction, a restart) or was put back. Re-seeded from the newest pair this
                    // process holds, then asked again.
                    reseeds += 1
                    let stored = items[1].integer ?? 0
                    guard reseeds <= 4, case .success = await run(seedCommand()) else {
                        let problem =
                            "\(keys.session) on \(endpoint) holds generation \(stored), older than this process knows, "
                            + "and could not be re-seeded"
                        send(.problem(problem))
                        return .unavailable(problem)
                    }
                default:
                    let problem = "unexpected reply from \(endpoint) to a refresh question"
                    send(.problem(problem))
                    return .unavailable(problem)
                }
            }
        }
    }

    package func publish(_ credentials: Credentials, with lease: RefreshLease) async -> PublishResult {
        let arguments = [
            "EVAL", Self.publishScript, "3", keys.session, keys.lease, keys.fence, String(lease.fencingToken),
            String(lease.generation),
            SharedCredentialsCodec.encode(credentials, signer: signer, generation: lease.generation + 1), keys.channel,
        ]
        let late: @Sendable (RedisReply) -> Void = { [self] reply in
            if case .published(let session) = publicationResult(reply, credentials, lease) {
                send(.credentials(session))
            }
        }
        switch await runPublication(arguments, late: late) {
        case .failure(let error): return .unavailable(error.message)
        case .success(let reply): return publicationResult(reply, credentials, lease)
        }
    }

    /// What a publication's answer says (also for one that answered after the caller was told
    /// it was in flight).
    func publicationResult(_ reply: RedisReply, _ credentials: Credentials, _ lease: RefreshLease) -> PublishResult {
        let items = reply.items
        let generation = UInt64(items.count > 1 ? items[1].integer ?? 0 : 0)
        if items.first?.integer == 1 {
            let epoch = learnEpoch(items.count > 2 ? items[2].text : nil, generation: generation) ?? 0
            let session = SharedSession(credentials: credentials, generation: generation, epoch: epoch)
            remember(session)
            return .published(session)
        }
        let stored =
            items.count > 2 ? self.credentials(items[2].text, generation: generation, source: "the session hash") : nil
        let epoch = learnEpoch(items.count > 3 ? items[3].text : nil, generation: generation) ?? 0
        return .leaseLost(current: stored.map { SharedSession(credentials: $0, generation: generation, epoch: epoch) })
    }

    package func endRefresh(_ lease: RefreshLease, failure: String?) async {
        await endRefresh(lease, failure: failure, retryAfter: nil)
    }

    package func endRefresh(_ lease: RefreshLease, failure: String?, retryAfter: Date?) async {
        var object: [String: Any] = ["t": "e", "f": lease.fencingToken]
        if let signer { object["s"] = signer.seal("end", [String(lease.fencingToken)]) }
        if let failure {
            let text = String(failure.prefix(300))
            object = ["t": "f", "f": lease.fencingToken, "w": text]
            if let signer { object["s"] = signer.seal("failure", [String(lease.fencingToken), text]) }
        }
        _ = await run(
            [
                "EVAL", Self.endScript, "2", keys.lease, keys.session, String(lease.fencingToken), Self.json(object),
                keys.channel,
            ] + retryAfterArguments(retryAfter, reason: failure))
    }

    /// A response accepted the token of `generation`: `refresh.limit` never counts it fleet-wide.
    package func noteAccepted(generation: UInt64) async {
        _ = await run(["EVAL", Self.acceptScript, "2", keys.session, keys.loops, String(generation)])
    }

    package func publishLogout(until: Date, reason: String) async {
        // The latest session epoch this process knows.
        await publishLogout(until: until, reason: reason, epoch: state.withLock { $0.memory.epoch })
    }

    package func publishLogout(until: Date, reason: String, epoch: UInt64) async {
        let untilMs = until.millisecondsSince1970
        let ttl = max(1, untilMs - Date().millisecondsSince1970)
        // The session epoch it was decided in: a logout racing a refresh (same epoch) applies; one
        // on an older session's token, or put back after a sign-in (a later epoch), is refused.
        switch await run(logoutCommand(untilMs, ttl: ttl, reason: reason, epoch: epoch)) {
        case .success(let reply): learnFromRefusedLogout(reply)
        case .failure:
            // Published by the subscriber when Redis is back (issue 19: a logout during an outage
            // was never heard by the others, who kept sending through the cooldown).
            state.withLock { state in
                if untilMs > (state.pendingLogout?.until ?? 0) { state.pendingLogout = (untilMs, reason, epoch) }
            }
        }
    }

    /// `logoutScript`'s command for a logout until `untilMs` decided in session `epoch`.
    func logoutCommand(_ untilMs: Int64, ttl: Int64, reason: String, epoch: UInt64) -> [String] {
        [
            "EVAL", Self.logoutScript, "2", keys.logout, keys.session, String(untilMs), String(ttl),
            logoutMessage(untilMs, reason, epoch: epoch), keys.channel,
        ] + [signer?.logoutSuffix(until: untilMs, epoch: epoch) ?? "", String(epoch)]
    }

    package func publishSignIn(_ credentials: Credentials) async -> SharedSession? {
        // Under a key the credentials are sealed with the generation they get, so the script stores
        // them only over the generation this process expected ({gen} otherwise: ask again).
        var expected = state.withLock { $0.memory.generation }
        for _ in 0..<8 {
            // The sign-in starts session epoch `expected + 1` (the generation it stores at), sealed.
            let arguments = [
                "EVAL", Self.signInScript, "3", keys.session, keys.lease, keys.logout,
                SharedCredentialsCodec.encode(credentials, signer: signer, generation: expected + 1), keys.channel,
                String(expected), signer?.epochValue(expected + 1) ?? "",
            ]
            guard case .success(let reply) = await run(arguments) else { return nil }
            if let generation = reply.integer {
                let session = SharedSession(
                    credentials: credentials, generation: UInt64(generation), epoch: UInt64(generation))
                remember(session)
                return session
            }
            guard let current = reply.items.first?.integer, current >= 0 else { return nil }
            expected = max(expected, UInt64(current))
        }
        return nil
    }

    package func stop() {
        state.withLock { $0.stopped = true }
        queue.async { [box] in box.connection = nil }
        signal.bump()
    }

    // MARK: - Commands

    /// Runs one command on the private queue. Fails at once while Redis is known to be down (the
    /// subscriber finds out when it is back), so a request never waits on a dead server twice.
    func run(_ arguments: [String]) async -> Result<RedisReply, RedisError> {
        if let refusal = refusal() { return .failure(refusal) }
        return await withCheckedContinuation { continuation in
            queue.async { [self] in continuation.resume(returning: runOnQueue(arguments)) }
        }
    }

    private func refusal() -> RedisError? {
        state.withLock { state in
            if state.stopped { return RedisError(message: "the Redis coordinator is stopped") }
            if state.health.down {
                return RedisError(message: "\(endpoint) is unreachable; coordinating locally until it is back")
            }
            return nil
        }
    }

    private func runOnQueue(_ arguments: [String]) -> Result<RedisReply, RedisError> {
        if let refusal = refusal() { return .failure(refusal) }
        do throws(RedisError) {
            let connection: RedisConnection
            if let open = box.connection { connection = open } else { connection = try connect() }
            box.connection = connection
            let reply = try evaluate(arguments, on: connection, scripts: &box.scripts)
            if case .error(let message) = reply {
                let problem = "\(endpoint) refused a coordination command: \(message)"
                send(.problem(problem))
                return .failure(RedisError(message: problem))
            }
            return .success(reply)
        } catch {
            box.connection = nil
            fail(error.message)
            return .failure(error)
        }
    }

    /// Runs a publication whatever the health (a pair must be tried), on the command connection
    /// when it is open (`EVALSHA` of the loaded script: one round trip) or on a new one whose set-up
    /// is queued with it, and waits for the answer up to ``Configuration/publicationWait``. When none
    /// came by then (Redis paused, slow), the caller is told the pair is in flight and the
    /// connection is handed to a thread that keeps reading until the answer arrives (at most
    /// ``publicationLimit``): closing it would make Redis drop the command, and a question sent
    /// after it would be answered first. `late` hears an answer that came after that.
    private func runPublication(_ arguments: [String], late: (@Sendable (RedisReply) -> Void)? = nil) async
        -> Result<RedisReply, RedisError>
    {
        if state.withLock({ $0.stopped }) { return .failure(RedisError(message: "the Redis coordinator is stopped")) }
        let wait = configuration.publicationWait
        return await withCheckedContinuation { continuation in
            queue.async { [self] in
                state.withLock { $0.inFlight += 1 }
                switch startPublication(arguments) {
                case .failure(let error):
                    state.withLock { $0.inFlight -= 1 }
                    continuation.resume(returning: .failure(error))
                case .success(let sent):
                    switch read(sent, until: ContinuousClock.now + wait) {
                    case .answered(let result):
                        state.withLock { $0.inFlight -= 1 }
                        if case .success = result { box.connection = sent.connection }
                        signal.bump()
                        continuation.resume(returning: result)
                    case .stillWaiting:
                        let reason =
                            "\(endpoint) did not answer a publication within \(wait.policyText); it stays in flight "
                            + "(Redis runs it when it can) and the pair is kept"
                        fail(reason)
                        continuation.resume(returning: .failure(RedisError(message: reason)))
                        let thread = Thread { [self] in
                            let outcome = read(sent, until: ContinuousClock.now + Self.publicationLimit)
                            state.withLock { $0.inFlight -= 1 }
                            if case .answered(.success(let reply)) = outcome { late?(reply) }
                            signal.bump()
                        }
                        thread.name = "response-policy.redis-publication"
                        thread.start()
                    }
                }
            }
        }
    }

    /// A publication on its way: its connection, the answers to skip first (a new connection's
    /// queued AUTH and SELECT), and the command (to send again as `EVAL` after a `NOSCRIPT`).
    private final class SentPublication: @unchecked Sendable {
        // @unchecked: read by the queue, then by the one thread that takes over its reading.
        let connection: RedisConnection
        var setUp: Int
        let arguments: [String]
        var resent = false

        init(_ connection: RedisConnection, setUp: Int, arguments: [String]) {
            self.connection = connection
            self.setUp = setUp
            self.arguments = arguments
        }
    }

    private enum PublicationRead {
        case answered(Result<RedisReply, RedisError>)
        case stillWaiting
    }

    /// Sends the publication (on the queue): `EVALSHA` when the script is loaded, else `EVAL`.
    private func startPublication(_ arguments: [String]) -> Result<SentPublication, RedisError> {
        // Loaded once per server on a healthy connection (the steady state sends `EVALSHA`); a
        // connection that cannot load it now (Redis paused) is dropped, and the publication goes
        // as `EVAL` on a new one.
        if let open = box.connection, box.scripts[arguments[1]] == nil {
            if case .string(let sha)? = try? open.command(["SCRIPT", "LOAD", arguments[1]]) {
                box.scripts[arguments[1]] = sha
            } else {
                box.connection = nil
            }
        }
        do throws(RedisError) {
            let sent: SentPublication
            if let open = box.connection {
                sent = SentPublication(open, setUp: 0, arguments: arguments)
            } else {
                let connection = try RedisConnection(
                    queueing: endpoint, password: configuration.password, timeout: configuration.connectTimeout)
                sent = SentPublication(connection, setUp: connection.setUpReplies, arguments: arguments)
            }
            // Taken from the queue's other commands until its answer is in.
            box.connection = nil
            if let sha = box.scripts[arguments[1]] {
                try sent.connection.send(["EVALSHA", sha] + arguments.dropFirst(2))
            } else {
                sent.resent = true
                try sent.connection.send(arguments)
            }
            return .success(sent)
        } catch {
            fail(error.message)
            return .failure(error)
        }
    }

    /// Reads the publication's answer until `deadline`.
    private func read(_ sent: SentPublication, until deadline: ContinuousClock.Instant) -> PublicationRead {
        do throws(RedisError) {
            while ContinuousClock.now < deadline {
                guard let reply = try sent.connection.nextReply(waitingAtMost: 100) else { continue }
                if sent.setUp > 0 {
                    sent.setUp -= 1
                    if case .error(let message) = reply {
                        return .answered(.failure(RedisError(message: "\(endpoint) refused: \(message)")))
                    }
                    continue
                }
                if case .error(let message) = reply {
                    if message.hasPrefix("NOSCRIPT"), !sent.resent {
                        // Redis restarted or flushed its scripts: the script's text this time.
                        sent.resent = true
                        try sent.connection.send(sent.arguments)
                        continue
                    }
                    return .answered(
                        .failure(RedisError(message: "\(endpoint) refused a coordination command: \(message)")))
                }
                return .answered(.success(reply))
            }
            return .stillWaiting
        } catch {
            fail(error.message)
            return .answered(.failure(error))
        }
    }

    /// Sends `EVAL script …` as `EVALSHA sha …` (the script text crosses the network once per
    /// server), loading the script first when the server does not know it (`NOSCRIPT` after a
    /// restart or `SCRIPT FLUSH`).
    func evaluate(_ arguments: [String], on connection: RedisConnection, scripts: inout [String: String])
        throws(RedisError) -> RedisReply
    {
        guard arguments.count > 1, arguments[0] == "EVAL" else { return try connection.command(arguments) }
        let script = arguments[1]
        for _ in 0..<2 {
            let sha: String
            if let known = scripts[script] {
                sha = known
            } else {
                guard case .string(let loaded) = try connection.command(["SCRIPT", "LOAD", script]) else {
                    return try connection.command(arguments)
                }
                scripts[script] = loaded
                sha = loaded
            }
            let reply = try connection.command(["EVALSHA", sha] + arguments.dropFirst(2))
            guard case .error(let message) = reply, message.hasPrefix("NOSCRIPT") else { return reply }
            scripts[script] = nil
        }
        return try connection.command(arguments)
    }

    func connect() throws(RedisError) -> RedisConnection {
        try RedisConnection(endpoint, password: configuration.password, timeout: configuration.connectTimeout)
    }

    /// `seedScript`'s command from what this process remembers: its newest pair with its
    /// generation and epoch, its fence, and the lease to put back should Redis need re-seeding (a
    /// lease it heard of in term, else a quarantine unless it has heard everything lately).
    func seedCommand() -> [String] {
        let now = Self.monotonicNow
        let leaseMs = configuration.lease.milliseconds()
        let (seed, heard) = state.withLock { state in
            (state.memory.seed(now: now, leaseMs: leaseMs), state.memory.leaseInTerm(now: now))
        }
        var leaseValue = ""
        var leaseLeft: Int64 = 0
        if let lease = seed?.lease {
            leaseLeft = lease.leftMs
            if let heard, heard.fence == lease.fence {
                leaseValue = heard.value
            } else {
                // A quarantine: held by nobody (fencing token 0), sealed under a key like any lease.
                leaseValue =
                    "0" + (signer?.leaseSuffix(fence: 0, expires: Date().millisecondsSince1970 + lease.leftMs) ?? "")
            }
        }
        // A re-seed keeps the session epoch known, so a logout decided before it stays refused
        // and one decided after it (in this epoch) applies.
        let generation = seed?.generation ?? 0
        let epoch = seed?.epoch ?? 0
        let sealedEpoch = epoch > 0 && epoch <= generation ? signer?.epochValue(epoch) ?? String(epoch) : ""
        return [
            "EVAL", Self.seedScript, "4", keys.session, keys.logout, keys.lease, keys.fence,
            seed.map { SharedCredentialsCodec.encode($0.credentials, signer: signer, generation: generation) } ?? "",
            String(generation), sealedEpoch, leaseValue, String(leaseLeft), String(seed?.fence ?? 0), keys.channel,
        ]
    }

    /// `beginScript`'s knowledge arguments: the newest generation known, the highest fencing token
    /// seen, and a lease heard of in term (its value and ms left; empty and 0 for none).
    private func knowledgeArguments(leaseMs: Int64) -> [String] {
        let now = Self.monotonicNow
        let (knows, heard) = state.withLock { ($0.memory.knowledge(now: now), $0.memory.leaseInTerm(now: now)) }
        let signed = signer == nil ? ["", ""] : []
        return signed + [
            String(knows.generation), String(knows.fence), heard?.value ?? "", String(knows.lease?.leftMs ?? 0),
        ]
    }

    // MARK: - State

    /// A session read from Redis, or stored there by this process.
    func remember(_ session: SharedSession) {
        state.withLock { state in
            state.memory.saw(session)
            if session.credentials != nil { state.memory.sawStoreSession() }
        }
    }

    func isNewer(_ session: SharedSession) -> Bool {
        state.withLock { state in
            session.generation > state.memory.generation || state.memory.newest?.credentials == nil
        }
    }

    func send(_ update: SessionUpdate) {
        let updates = state.withLock { $0.stopped ? nil : $0.updates }
        updates?(update)
    }

    func fail(_ reason: String) {
        if let update = state.withLock({ $0.health.fail(reason) }) { send(update) }
        signal.bump()
    }

    static func json(_ object: [String: Any]) -> String {
        let data = (try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])) ?? Data()
        return String(decoding: data, as: UTF8.self)
    }
}

extension RedisSessionCoordinator: PendingPublications {
    package var unpublished: [String] {
        state.withLock { state in
            var pending: [String] = []
            if state.inFlight > 0 { pending.append("a pair whose publication to \(endpoint) is in flight") }
            if let logout = state.pendingLogout, logout.until > Date().millisecondsSince1970 {
                pending.append("a logout until \(FileCredentialStore.rfc3339(Date(milliseconds: logout.until)))")
            }
            return pending
        }
    }

    package func flushPending(timeout: Duration) async -> [String] {
        let giveUp = ContinuousClock.now + timeout
        while true {
            if let (untilMs, reason, epoch) = state.withLock({ $0.pendingLogout }) {
                let ttl = untilMs - Date().millisecondsSince1970
                if ttl <= 0 {
                    state.withLock { state in if state.pendingLogout?.until == untilMs { state.pendingLogout = nil } }
                } else if case .success(let reply) = await runIgnoringHealth(
                    logoutCommand(untilMs, ttl: ttl, reason: reason, epoch: epoch))
                {
                    learnFromRefusedLogout(reply)
                    state.withLock { state in if state.pendingLogout?.until == untilMs { state.pendingLogout = nil } }
                }
            }
            let left = unpublished
            if left.isEmpty || ContinuousClock.now >= giveUp { return left }
            await signal.wait(after: signal.version, timeout: min(giveUp - ContinuousClock.now, .milliseconds(100)))
        }
    }

    /// A command tried now even while Redis is known to be down (a process about to exit has no
    /// later to wait for).
    private func runIgnoringHealth(_ arguments: [String]) async -> Result<RedisReply, RedisError> {
        await withCheckedContinuation { continuation in
            queue.async { [self] in
                do throws(RedisError) {
                    let connection: RedisConnection
                    if let open = box.connection { connection = open } else { connection = try connect() }
                    box.connection = connection
                    let reply = try evaluate(arguments, on: connection, scripts: &box.scripts)
                    continuation.resume(returning: .success(reply))
                } catch {
                    box.connection = nil
                    continuation.resume(returning: .failure(error))
                }
            }
        }
    }
}

extension RedisSessionCoordinator: TrustWarning {
    /// A Redis on another host without `signing-key-env`: every client of it can forge the session.
    package var trustWarning: String? {
        guard signer == nil, !endpoint.isLoopback else { return nil }
        return
            "\(endpoint) is not a loopback address and 'signing-key-env' is not set: any client of that Redis can sign "
            + "this fleet in with tokens of its choosing, log it out or hold its refreshes; name an environment "
            + "variable holding a shared key (every process of the fleet the same)"
    }
}
