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
/// | `response-policy:{key}:session` | hash: `gen`, `creds` (JSON), `epoch` (last sign-in's `gen`, sealed if keyed) |
/// | `response-policy:{key}:lease` | the fencing token of the process refreshing now, `PX lease` |
/// | `response-policy:{key}:fence` | the counter fencing tokens come from (`INCR`) |
/// | `response-policy:{key}:logout` | the cooldown's end (ms since 1970; sealed with its epoch), TTL to that end |
/// | `response-policy:{key}:refreshes` | sorted set of lease grants, for `refresh.limit` fleet-wide |
/// | `response-policy:{key}:events` | the pub/sub channel of publications, logouts and failures |
///
/// Each coordinator call is one round trip: a Lua script (`EVAL`) that compares, decides and
/// writes atomically. A refresh trigger first compares generations (newer credentials in Redis:
/// retry with them); otherwise it takes the lease (`SET NX PX` with a token from `INCR`). The
/// holder's publication stores the credentials and a new generation only while `GET lease` still
/// returns its token, then `PUBLISH`es them. The others wait for that message on a subscription
/// (a second connection read by its own thread), bounded by `refresh.timeout`; when the lease
/// expires (its holder died) the next question is granted a new one.
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
/// serial queue (never on the cooperative pool), each bounded by `connect-timeout`.
public final class RedisSessionCoordinator: SessionCoordinator {
    public struct Configuration: Sendable, Equatable {
        /// `redis://[user@]host[:port][/db]`; no password in it.
        public var url: String
        /// Processes with the same key share one session.
        public var key: String
        /// How long a refresh lease lasts if its holder never ends it; `15s` by default.
        public var lease: Duration
        /// The most any call waits for Redis itself; `250ms` by default.
        public var connectTimeout: Duration
        /// From the environment variable named by `password-env`; never logged.
        public var password: String?
        /// From the environment variable named by `signing-key-env`: credentials and logouts read
        /// from Redis are used only when signed with it. `nil` (unsigned) by default.
        public var signingKey: Data?

        public init(
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
    }

    struct Keys {
        let session, lease, fence, logout, refreshes, channel: String
        init(_ key: String) {
            let prefix = "response-policy:{\(key)}:"
            session = prefix + "session"
            lease = prefix + "lease"
            fence = prefix + "fence"
            logout = prefix + "logout"
            refreshes = prefix + "refreshes"
            channel = prefix + "events"
        }
    }

    private struct State {
        var updates: (@Sendable (SessionUpdate) -> Void)?
        /// The newest session this process has seen.
        var latest: SharedSession?
        /// Refreshes that failed elsewhere, by the fencing token of their lease (the last few).
        var failures: [UInt64: String] = [:]
        var health = CoordinatorHealth()
        var stopped = false
        var subscriberRunning = false
        /// A logout this process could not publish (Redis was unreachable): its end and reason.
        var pendingLogout: (until: Int64, reason: String, epoch: UInt64)?
        /// The highest fencing token seen (signing-key-env): the next grant must carry the one after.
        var fence: UInt64 = 0
        /// The latest session epoch known (signing-key-env): the generation of the last sign-in.
        /// A logout decided in an earlier epoch is a replay (a sign-in already ended it).
        var epoch: UInt64 = 0
    }

    /// The command connection; touched only on `queue`.
    private final class ConnectionBox: @unchecked Sendable {
        // @unchecked: read and written only by blocks running on the coordinator's serial queue.
        var connection: RedisConnection?
        /// The SHA1 of each script the server has loaded (`SCRIPT LOAD`), so calls send `EVALSHA`.
        var scripts: [String: String] = [:]
    }

    public let configuration: Configuration
    let endpoint: RedisEndpoint
    let keys: Keys
    let signer: SharedStateSigner?
    private let state = Locked(State())
    private let signal = ChangeSignal()
    private let queue = DispatchQueue(label: "response-policy.redis-coordinator")
    private let box = ConnectionBox()

    /// - Throws: ``CoordinationError`` when the URL or key cannot be used.
    public init(_ configuration: Configuration) throws(CoordinationError) {
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

    // MARK: - SessionCoordinator

    public func start(local: Credentials?, updates: @escaping @Sendable (SessionUpdate) -> Void) async
        -> SharedSession?
    {
        let startSubscriber = state.withLock { state -> Bool in
            state.updates = updates
            if state.latest == nil, let local { state.latest = SharedSession(credentials: local, generation: 0) }
            defer { state.subscriberRunning = true }
            return !state.subscriberRunning
        }
        var shared: SharedSession?
        if case .success(let reply) = await run(seedCommand(local)) {
            let items = reply.items
            // {1}: seeded from `local`; {0, …} with no credentials: nothing shared yet.
            if items.count >= 4, items[0].integer == 0, case .success(let session) = session(items) {
                if session.credentials != nil || session.loggedOutUntil != nil {
                    remember(session)
                    shared = session
                }
            }
        }
        // After `remember`: the subscriber's first read must not announce what start returns.
        if startSubscriber {
            let thread = Thread { [self] in subscriberLoop() }
            thread.name = "response-policy.redis-subscriber"
            thread.start()
        }
        return shared
    }

    public func beginRefresh(_ request: RefreshTurnRequest) async -> RefreshTurn {
        let deadline = ContinuousClock.now + request.timeout
        var waited = false
        var holder: UInt64?
        var predictions = 0
        while true {
            if Task.isCancelled { return .unavailable("the refresh was cancelled while it waited for its turn") }
            let seen = signal.version
            if waited {
                let (latest, failure) = state.withLock { state in
                    (state.latest, holder.flatMap { state.failures[$0] })
                }
                if let latest, latest.generation > request.failedGeneration { return .published(latest) }
                if let failure { return .failedElsewhere(failure) }
            }
            let remaining = deadline - ContinuousClock.now
            if waited, remaining <= .zero {
                return .failedElsewhere("another process's refresh did not finish within \(request.timeout)")
            }
            let limit = request.limit
            let leaseMs = request.leaseLength(configured: configuration.lease).milliseconds()
            let arguments = [
                "EVAL", Self.beginScript, "5", keys.session, keys.lease, keys.fence, keys.logout, keys.refreshes,
                // Never shorter than the refresh it covers (a live holder keeps its lease).
                String(request.failedGeneration), String(leaseMs),
                String(limit?.count ?? 0), String(limit?.per.milliseconds() ?? 0),
            ] + sealedLeaseArguments(leaseMs: leaseMs)
            switch await run(arguments) {
            case .failure(let error): return .unavailable(error.message)
            case .success(let reply):
                let items = reply.items
                switch items.first?.integer {
                case 0 where items.count >= 4:
                    switch session(items) {
                    case .failure(let error): return .unavailable(error.reason)
                    case .success(let session):
                        remember(session)
                        return waited ? .published(session) : .newer(session)
                    }
                case 1 where items.count >= 3:
                    let granted = RefreshLease(
                        fencingToken: UInt64(items[1].integer ?? 0), generation: UInt64(items[2].integer ?? 0))
                    if let refusal = grantProblem(granted) {
                        await endRefresh(granted, failure: nil)
                        // Redis lost the session (a restart, a flush): re-seeded from what this
                        // process holds, and asked again. Anything older that is there is refused.
                        if granted.generation == 0, case .success(let reply) = await run(seedCommand(nil)),
                            reply.items.first?.integer == 1
                        {
                            continue
                        }
                        send(.problem(refusal))
                        return .unavailable(refusal)
                    }
                    return .lease(granted)
                case 2 where items.count >= 3:
                    switch leaseHolder(items[1]) {
                    case .failure(let error): return .unavailable(error.reason)
                    case .success(let fence): holder = fence
                    }
                    waited = true
                    let leaseLeft = Duration.milliseconds(max(1, items[2].integer ?? 1)) + .milliseconds(5)
                    // At most 500 ms between looks at Redis, in case a message was lost in a reconnect.
                    await signal.wait(after: seen, timeout: min(remaining, leaseLeft, .milliseconds(500)))
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
                        return .unavailable("the fencing counter of \(keys.fence) on \(endpoint) kept moving; try again")
                    }
                default:
                    let problem = "unexpected reply from \(endpoint) to a refresh question"
                    send(.problem(problem))
                    return .unavailable(problem)
                }
            }
        }
    }

    public func publish(_ credentials: Credentials, with lease: RefreshLease) async -> PublishResult {
        let arguments = [
            "EVAL", Self.publishScript, "3", keys.session, keys.lease, keys.fence, String(lease.fencingToken),
            String(lease.generation),
            SharedCredentialsCodec.encode(credentials, signer: signer, generation: lease.generation + 1), keys.channel,
        ]
        switch await run(arguments) {
        case .failure(let error): return .unavailable(error.message)
        case .success(let reply):
            let items = reply.items
            let generation = UInt64(items.count > 1 ? items[1].integer ?? 0 : 0)
            if items.first?.integer == 1 {
                let session = SharedSession(credentials: credentials, generation: generation)
                remember(session)
                return .published(session)
            }
            let stored =
                items.count > 2 ? self.credentials(items[2].text, generation: generation, source: "the session hash") : nil
            return .leaseLost(current: stored.map { SharedSession(credentials: $0, generation: generation) })
        }
    }

    public func endRefresh(_ lease: RefreshLease, failure: String?) async {
        var message = ""
        if let failure {
            let text = String(failure.prefix(300))
            var object: [String: Any] = ["t": "f", "f": lease.fencingToken, "w": text]
            if let signer { object["s"] = signer.seal("failure", [String(lease.fencingToken), text]) }
            message = Self.json(object)
        }
        _ = await run([
            "EVAL", Self.endScript, "1", keys.lease, String(lease.fencingToken), message, keys.channel,
        ])
    }

    public func publishLogout(until: Date, reason: String) async {
        let untilMs = until.millisecondsSince1970
        let ttl = max(1, untilMs - Date().millisecondsSince1970)
        // The session epoch it was decided in: a logout racing a refresh (same epoch) applies; one
        // put back after a sign-in (a later epoch) is refused as a replay.
        let epoch = state.withLock { $0.epoch }
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
    private func logoutCommand(_ untilMs: Int64, ttl: Int64, reason: String, epoch: UInt64) -> [String] {
        [
            "EVAL", Self.logoutScript, "2", keys.logout, keys.session, String(untilMs), String(ttl),
            logoutMessage(untilMs, reason, epoch: epoch), keys.channel,
        ] + [signer?.logoutSuffix(until: untilMs, epoch: epoch) ?? "", String(epoch)]
    }

    /// `logoutScript` refused a logout decided before the sign-in that started the stored epoch
    /// (`{0, epoch}`): this process had not heard of that sign-in. Nothing was stored or announced
    /// (it ended only the session the sign-in had already ended); the epoch is learned, so this
    /// process's next logout belongs to the current session. An epoch that fails its seal is a
    /// problem, and is not learned.
    private func learnFromRefusedLogout(_ reply: RedisReply) {
        let items = reply.items
        guard items.first?.integer == 0, items.count > 1 else { return }
        guard let signer else {
            if let epoch = Self.plainEpoch(items[1].text) { state.withLock { $0.epoch = max($0.epoch, epoch) } }
            return
        }
        switch signer.checkEpoch(items[1].text) {
        case .success(let epoch): state.withLock { $0.epoch = max($0.epoch, epoch) }
        case .failure(let error): send(.problem("the session epoch in \(keys.session) on \(endpoint) \(error.reason)"))
        }
    }

    /// A logout's announcement, signed when the fleet has a key (with the session epoch it was
    /// decided in).
    private func logoutMessage(_ untilMs: Int64, _ reason: String, epoch: UInt64) -> String {
        let text = String(reason.prefix(300))
        var object: [String: Any] = ["t": "l", "u": untilMs, "r": text]
        if let signer {
            object["e"] = epoch
            object["s"] = signer.seal("logout", [String(untilMs), text, String(epoch)])
        }
        return Self.json(object)
    }

    /// Why a logout decided in session `epoch` may not be applied: this process knows of a later
    /// sign-in (`known`), which already ended that session. Nil when it may.
    private func epochProblem(_ epoch: UInt64, known: UInt64, source: String) -> String? {
        guard signer != nil, epoch < known else { return nil }
        return "\(source) was refused: it was decided in session epoch \(epoch), before the sign-in of epoch "
            + "\(known) that ended it (a logout put back after a sign-in: replayed; signing-key-env)"
    }

    /// Under a key: the session epoch a sign-in's (or publication's) announcement carries, checked,
    /// remembered when later than the one known. A refused one is a problem, and never lowers it.
    private func learnEpoch(_ value: Any?, generation: UInt64) {
        guard let text = value as? String else { return }
        guard let signer else {
            // Unsigned: a number, trusted as everything else is without a key; it only keeps a
            // logout decided before it from being stored.
            if let epoch = Self.plainEpoch(text), epoch <= generation {
                state.withLock { $0.epoch = max($0.epoch, epoch) }
            }
            return
        }
        switch signer.checkEpoch(text) {
        case .failure(let error):
            send(.problem("the session epoch of a publication on \(keys.channel) \(error.reason)"))
        case .success(let epoch) where epoch <= generation: state.withLock { $0.epoch = max($0.epoch, epoch) }
        case .success(let epoch):
            send(
                .problem(
                    "the session epoch of a publication on \(keys.channel) was refused: epoch \(epoch) is past its "
                        + "generation \(generation)"))
        }
    }

    /// Publishes a logout that could not be published while Redis was unreachable, unless its
    /// cooldown is over by now.
    private func publishPendingLogout(on connection: RedisConnection) throws(RedisError) {
        guard let (untilMs, reason, epoch) = state.withLock({ $0.pendingLogout }) else { return }
        let ttl = untilMs - Date().millisecondsSince1970
        if ttl > 0 {
            let command = logoutCommand(untilMs, ttl: ttl, reason: reason, epoch: epoch)
            learnFromRefusedLogout(try connection.command(command))
        }
        state.withLock { state in if state.pendingLogout?.until == untilMs { state.pendingLogout = nil } }
    }

    public func publishSignIn(_ credentials: Credentials) async -> SharedSession? {
        // Under a key the credentials are sealed with the generation they get, so the script stores
        // them only over the generation this process expected ({gen} otherwise: ask again).
        var expected = state.withLock { $0.latest?.generation ?? 0 }
        for _ in 0..<8 {
            // The sign-in starts session epoch `expected + 1` (the generation it stores at), sealed.
            let arguments = [
                "EVAL", Self.signInScript, "3", keys.session, keys.lease, keys.logout,
                SharedCredentialsCodec.encode(credentials, signer: signer, generation: expected + 1), keys.channel,
                signer == nil ? "" : String(expected), signer?.epochValue(expected + 1) ?? "",
            ]
            guard case .success(let reply) = await run(arguments) else { return nil }
            if let generation = reply.integer {
                let session = SharedSession(credentials: credentials, generation: UInt64(generation))
                state.withLock { $0.epoch = max($0.epoch, UInt64(generation)) }
                remember(session)
                return session
            }
            guard let current = reply.items.first?.integer, current >= 0 else { return nil }
            expected = UInt64(current)
        }
        return nil
    }

    public func stop() {
        state.withLock { $0.stopped = true }
        queue.async { [box] in box.connection = nil }
        signal.bump()
    }

    // MARK: - Commands

    /// Runs one command on the private queue. Fails at once while Redis is known to be down (the
    /// subscriber finds out when it is back), so a request never waits on a dead server twice.
    private func run(_ arguments: [String]) async -> Result<RedisReply, RedisError> {
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
            let reply = try evaluate(arguments, on: connection)
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

    /// Sends `EVAL script …` as `EVALSHA sha …` (the script text crosses the network once per
    /// server), loading the script first when the server does not know it (`NOSCRIPT` after a
    /// restart or `SCRIPT FLUSH`).
    private func evaluate(_ arguments: [String], on connection: RedisConnection) throws(RedisError) -> RedisReply {
        guard arguments.count > 1, arguments[0] == "EVAL" else { return try connection.command(arguments) }
        let script = arguments[1]
        for _ in 0..<2 {
            let sha: String
            if let known = box.scripts[script] {
                sha = known
            } else {
                guard case .string(let loaded) = try connection.command(["SCRIPT", "LOAD", script]) else {
                    return try connection.command(arguments)
                }
                box.scripts[script] = loaded
                sha = loaded
            }
            let reply = try connection.command(["EVALSHA", sha] + arguments.dropFirst(2))
            guard case .error(let message) = reply, message.hasPrefix("NOSCRIPT") else { return reply }
            box.scripts[script] = nil
        }
        return try connection.command(arguments)
    }

    private func connect() throws(RedisError) -> RedisConnection {
        try RedisConnection(endpoint, password: configuration.password, timeout: configuration.connectTimeout)
    }

    private func seedCommand(_ local: Credentials?) -> [String] {
        let (latest, epoch) = state.withLock { ($0.latest, $0.epoch) }
        let seed = latest?.credentials ?? local
        let generation = latest?.generation ?? 0
        // A re-seed keeps the session epoch known, so a logout decided before it stays refused
        // and one decided after it (in this epoch) applies.
        let sealedEpoch = epoch > 0 && epoch <= generation ? signer?.epochValue(epoch) ?? String(epoch) : nil
        return [
            "EVAL", Self.seedScript, "2", keys.session, keys.logout,
            seed.map { SharedCredentialsCodec.encode($0, signer: signer, generation: generation) } ?? "",
            String(generation), sealedEpoch ?? "",
        ]
    }

    // MARK: - Subscriber

    /// Reads the channel on its own connection; reconnects with backoff after a problem.
    private func subscriberLoop() {
        var connection: RedisConnection?
        while !state.withLock({ $0.stopped }) {
            if state.withLock({ $0.health.down }) { connection = nil }
            if connection == nil {
                if state.withLock({ $0.health.down }) { pause(state.withLock { $0.health.backoff }) }
                if state.withLock({ $0.stopped }) { break }
                do {
                    let subscribed = try connect()
                    try subscribed.send(["SUBSCRIBE", keys.channel])
                    try resync()
                    connection = subscribed
                    if let update = state.withLock({ $0.health.recover() }) {
                        queue.async { [box] in box.connection = nil }  // it died with the outage
                        send(update)
                    }
                } catch {
                    fail(error.message)
                    continue
                }
            }
            do {
                if let reply = try connection?.nextReply(waitingAtMost: 50) { receive(reply) }
            } catch {
                connection = nil
                fail(error.message)
            }
        }
    }

    /// After (re)connecting: reads what was missed, re-seeding a session Redis lost.
    private func resync() throws(RedisError) {
        let reader = try connect()
        try publishPendingLogout(on: reader)
        let reply = try reader.command(seedCommand(nil))
        let items = reply.items
        guard items.count >= 4, items[0].integer == 0, case .success(let session) = session(items) else { return }
        if session.credentials != nil, isNewer(session) {
            remember(session)
            send(.credentials(session))
        }
        if let until = session.loggedOutUntil { send(.loggedOut(until: until, reason: "logged out elsewhere")) }
        signal.bump()
    }

    private func receive(_ reply: RedisReply) {
        let items = reply.items
        guard items.count == 3, items[0].text == "message", let payload = items[2].text,
            let object = try? JSONSerialization.jsonObject(with: Data(payload.utf8)) as? [String: Any],
            let type = object["t"] as? String
        else { return }
        switch type {
        case "c":
            guard let number = object["g"] as? NSNumber, number.doubleValue.isFinite, number.doubleValue >= 0,
                number.doubleValue < 9e15, case let generation = number.uint64Value,
                let credentials = object["c"].flatMap({
                    credentials(object: $0, generation: generation, source: "a publication")
                })
            else { break }
            learnEpoch(object["e"], generation: generation)
            let session = SharedSession(credentials: credentials, generation: generation)
            if isNewer(session) {
                remember(session)
                send(.credentials(session))
            }
        case "l":
            guard let number = object["u"] as? NSNumber, number.doubleValue.isFinite, number.doubleValue >= 0,
                number.doubleValue <= Double(SharedCredentialsCodec.maxMilliseconds)
            else {
                send(.problem("a logout on \(keys.channel) was refused: its end is out of range"))
                break
            }
            let until = number.int64Value
            let reason = object["r"] as? String ?? "logged out elsewhere"
            let sealedEpoch = object["e"] as? NSNumber
            let epoch = sealedEpoch.map { $0.doubleValue.isFinite && $0.doubleValue >= 0 ? $0.uint64Value : 0 } ?? 0
            if let refusal = signer?.check(object["s"] as? String, "logout", [String(until), reason, String(epoch)])
                .refusal
            {
                send(.problem("a logout on \(keys.channel) was refused: \(refusal)"))
                break
            }
            let known = state.withLock { $0.epoch }
            if let problem = epochProblem(epoch, known: known, source: "a logout on \(keys.channel)") {
                send(.problem(problem))
                break
            }
            send(.loggedOut(until: Date(milliseconds: until), reason: reason))
        case "f":
            guard let number = object["f"] as? NSNumber, number.doubleValue.isFinite, number.doubleValue >= 0,
                number.doubleValue < 9e15
            else { break }
            let fence = number.uint64Value
            let reason = object["w"] as? String ?? "the refresh failed in another process"
            if let refusal = signer?.check(object["s"] as? String, "failure", [String(fence), reason]).refusal {
                send(.problem("a failed-refresh notice on \(keys.channel) was refused: \(refusal)"))
                break
            }
            state.withLock { state in
                if state.failures.count > 64 { state.failures.removeAll() }
                state.failures[fence] = object["w"] as? String ?? "the refresh failed in another process"
            }
        default: break
        }
        signal.bump()
    }

    // MARK: - Checked values (signing-key-env)

    /// The session in a `{0, gen, creds, logout-until}` reply, every value checked. Under a key, a
    /// refused value is a `problem` naming the key and coordination trouble for the caller (never
    /// a logout, never the credentials); without one, malformed credentials are dropped.
    private func session(_ items: [RedisReply]) -> Result<SharedSession, CoordinationError> {
        let generation = UInt64(max(0, items[1].integer ?? 0))
        let text = items[2].text ?? ""
        func refuse(_ reason: String) -> Result<SharedSession, CoordinationError> {
            send(.problem(reason))
            return .failure(CoordinationError(reason))
        }
        guard let signer else {
            learnEpoch(items.count > 4 ? items[4].text : nil, generation: generation)
            return .success(
                SharedSession(
                    credentials: credentials(text, generation: generation, source: "the session hash"),
                    generation: generation, loggedOutUntil: Self.until(items[3])))
        }
        var credentials: Credentials?
        if !text.isEmpty {
            switch SharedCredentialsCodec.check(text, signer: signer, generation: generation) {
            case .success(let value): credentials = value
            case .failure(let error): return refuse("the session hash \(keys.session) on \(endpoint): \(error.reason)")
            }
        } else if generation > 0 {
            return refuse(
                "the session hash \(keys.session) on \(endpoint) was refused: generation \(generation) without credentials")
        }
        let seen = state.withLock { $0.latest?.generation ?? 0 }
        if generation < seen {
            return refuse(
                "the session hash \(keys.session) on \(endpoint) was refused: its generation \(generation) is older than "
                    + "\(seen), already seen (replayed, or Redis restored from an older snapshot)")
        }
        // The session epoch stored with the session (its own seal): never past the generation.
        var stored: UInt64 = 0
        switch signer.checkEpoch(items.count > 4 ? items[4].text : nil) {
        case .failure(let error): return refuse("the session epoch in \(keys.session) on \(endpoint) \(error.reason)")
        case .success(let epoch) where epoch > generation:
            return refuse(
                "the session epoch in \(keys.session) on \(endpoint) was refused: epoch \(epoch) is past its "
                    + "generation \(generation)")
        case .success(let epoch): stored = epoch
        }
        let known = state.withLock { state -> UInt64 in
            state.epoch = max(state.epoch, stored)
            return state.epoch
        }
        switch signer.checkLogoutEnd(items[3].text) {
        case .failure(let error): return refuse("the cooldown \(keys.logout) on \(endpoint) \(error.reason)")
        case .success(let end):
            let source = "the cooldown \(keys.logout) on \(endpoint)"
            var until = end?.until
            // An end decided before the sign-in of the known epoch (put back after it, or stored by
            // a process that ran an older logout script) ended only the session that sign-in
            // ended: a problem, and no cooldown. The session itself is the current one, so it is
            // not refused: refusing it paused every refresh turn and join until the end expired.
            if let end, let problem = epochProblem(end.epoch, known: known, source: source) {
                send(.problem(problem))
                until = nil
            }
            let now = Date().millisecondsSince1970
            return .success(
                SharedSession(
                    credentials: credentials, generation: generation,
                    loggedOutUntil: until.flatMap { $0 > now ? Date(milliseconds: $0) : nil }))
        }
    }

    /// Under a key, `beginScript`'s last two arguments: the fencing token this process asks for
    /// (after every one it has seen) and its lease's sealed expiry.
    private func sealedLeaseArguments(leaseMs: Int64) -> [String] {
        guard let signer else { return [] }
        let fence = state.withLock { $0.fence } + 1
        return [String(fence), signer.leaseSuffix(fence: fence, expires: Date().millisecondsSince1970 + leaseMs)]
    }

    /// Why a granted lease may not be used: the session it starts from is older than one this
    /// process has seen (a rolled-back record). Nil when it may.
    private func grantProblem(_ granted: RefreshLease) -> String? {
        guard signer != nil else { return nil }
        let seen = state.withLock { state -> UInt64 in
            state.fence = max(state.fence, granted.fencingToken)
            return state.latest?.generation ?? 0
        }
        guard granted.generation < seen else { return nil }
        return "the session hash \(keys.session) on \(endpoint) was refused: its generation \(granted.generation) is "
            + "older than \(seen), already seen (replayed, or Redis restored from an older snapshot)"
    }

    /// The fencing token of the lease another process holds, checked under a key.
    private func leaseHolder(_ reply: RedisReply) -> Result<UInt64?, CoordinationError> {
        let text = reply.text ?? ""
        guard let signer else { return .success(UInt64(text.prefix { $0 != ":" })) }
        switch signer.checkLease(text, notBefore: Date().millisecondsSince1970) {
        case .failure(let error):
            let problem = "the lease \(keys.lease) on \(endpoint) \(error.reason)"
            send(.problem(problem))
            return .failure(CoordinationError(problem))
        case .success(let lease):
            state.withLock { $0.fence = max($0.fence, lease.fence) }
            return .success(lease.fence)
        }
    }

    /// Under a key, the grants that make `refresh.limit` used up must each be a sealed lease of
    /// the limit's window: a forged or replayed one is refused (a problem), not counted.
    private func limitProblem(_ members: [RedisReply], perMs: Int64) -> String? {
        guard let signer else { return nil }
        let notBefore = Date().millisecondsSince1970 - perMs
        for member in members {
            if case .failure(let error) = signer.checkLease(member.text ?? "", notBefore: notBefore) {
                let problem = "a refresh.limit grant in \(keys.refreshes) on \(endpoint) \(error.reason)"
                send(.problem(problem))
                return problem
            }
        }
        return nil
    }

    /// The fencing counter moved past this process's guess: the next guess goes after it. Its
    /// value is never trusted otherwise (a lower one is simply passed).
    private func counterProblem(_ reply: RedisReply) -> String? {
        guard let current = reply.integer, current >= 0, current < 9_000_000_000_000_000 else {
            let problem = "the fencing counter \(keys.fence) on \(endpoint) was refused: it is out of range"
            send(.problem(problem))
            return problem
        }
        state.withLock { $0.fence = max($0.fence, UInt64(current)) }
        return nil
    }

    // MARK: - State

    /// Credentials read from Redis, or nil (with a `problem` naming where they came from) when
    /// they are malformed or out of range: a forged or corrupted value never reaches the engine.
    private func credentials(_ text: String?, generation: UInt64, source: String) -> Credentials? {
        guard let text, !text.isEmpty else { return nil }
        switch SharedCredentialsCodec.check(text, signer: signer, generation: generation) {
        case .success(let credentials): return credentials
        case .failure(let error):
            send(.problem("\(source) of \(keys.session) on \(endpoint) was refused: \(error.reason)"))
            return nil
        }
    }

    private func credentials(object: Any, generation: UInt64, source: String) -> Credentials? {
        switch SharedCredentialsCodec.check(object: object, signer: signer, generation: generation) {
        case .success(let credentials): return credentials
        case .failure(let error):
            send(.problem("\(source) on \(keys.channel) was refused: \(error.reason)"))
            return nil
        }
    }

    private func isNewer(_ session: SharedSession) -> Bool {
        state.withLock { session.generation > ($0.latest?.generation ?? 0) || $0.latest?.credentials == nil }
    }

    private func remember(_ session: SharedSession) {
        state.withLock { state in
            if session.generation >= (state.latest?.generation ?? 0) { state.latest = session }
        }
    }

    private func send(_ update: SessionUpdate) {
        let updates = state.withLock { $0.stopped ? nil : $0.updates }
        updates?(update)
    }

    private func fail(_ reason: String) {
        if let update = state.withLock({ $0.health.fail(reason) }) { send(update) }
        signal.bump()
    }

    private func pause(_ duration: Duration) {
        let end = ContinuousClock.now + duration
        while ContinuousClock.now < end, !state.withLock({ $0.stopped }) {
            Thread.sleep(forTimeInterval: 0.02)
        }
    }

    private static func until(_ reply: RedisReply) -> Date? {
        // A keyed peer stores `<ms>:<seal>`; the number comes first.
        let number = reply.integer ?? reply.text.flatMap { Int64($0.prefix { $0 != ":" }) }
        guard let milliseconds = number, milliseconds > Date().millisecondsSince1970 else { return nil }
        return Date(milliseconds: min(milliseconds, SharedCredentialsCodec.maxMilliseconds))
    }

    /// The number a session epoch starts with (sealed or not), when it is one.
    private static func plainEpoch(_ text: String?) -> UInt64? {
        guard let text, let epoch = UInt64(text.prefix { $0 != ":" }), epoch < 9_000_000_000_000_000 else { return nil }
        return epoch
    }

    private static func json(_ object: [String: Any]) -> String {
        let data = (try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])) ?? Data()
        return String(decoding: data, as: UTF8.self)
    }

    // MARK: - Scripts

    /// KEYS: session, logout. ARGV: credentials JSON (or empty), generation to seed with, and under
    /// a key the sealed session epoch known (or empty). Returns {1} when it seeded, else
    /// {0, gen, creds, logout-until, epoch}.
    static let seedScript = """
        local gen = redis.call('HGET', KEYS[1], 'gen')
        if not gen and ARGV[1] ~= '' then
          redis.call('HSET', KEYS[1], 'gen', ARGV[2], 'creds', ARGV[1])
          if (ARGV[3] or '') ~= '' then redis.call('HSET', KEYS[1], 'epoch', ARGV[3]) end
          return {1}
        end
        return {0, gen or '0', redis.call('HGET', KEYS[1], 'creds') or '', redis.call('GET', KEYS[2]) or '0',
          redis.call('HGET', KEYS[1], 'epoch') or ''}
        """

    /// KEYS: session, lease, fence, logout, refreshes. ARGV: failed generation, lease ms, limit
    /// count (0: none), limit window ms; under a key, the fencing token asked for and the lease's
    /// sealed suffix. Returns {0, gen, creds, logout-until, epoch} (newer), {1, fence, gen} (lease
    /// granted), {2, holder lease, lease ms left} (wait), {3, grants…} (limit reached), {4, counter}
    /// (the token asked for is not past the counter: ask again).
    static let beginScript = """
        local gen = tonumber(redis.call('HGET', KEYS[1], 'gen') or '0')
        if gen > tonumber(ARGV[1]) then
          return {0, tostring(gen), redis.call('HGET', KEYS[1], 'creds') or '', redis.call('GET', KEYS[4]) or '0',
            redis.call('HGET', KEYS[1], 'epoch') or ''}
        end
        local holder = redis.call('GET', KEYS[2])
        if holder then
          local left = redis.call('PTTL', KEYS[2])
          if left < 0 or left > tonumber(ARGV[2]) then
            redis.call('PEXPIRE', KEYS[2], ARGV[2])
            left = tonumber(ARGV[2])
          end
          return {2, holder, left}
        end
        local count = tonumber(ARGV[3])
        local now = 0
        if count > 0 then
          local t = redis.call('TIME')
          now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
          redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now - tonumber(ARGV[4]))
          if redis.call('ZCARD', KEYS[5]) >= count then return {3, unpack(redis.call('ZRANGE', KEYS[5], 0, count - 1))} end
        end
        local fence
        if (ARGV[5] or '') ~= '' then
          local current = redis.call('GET', KEYS[3]) or '0'
          if tonumber(current) >= tonumber(ARGV[5]) then return {4, current} end
          redis.call('SET', KEYS[3], ARGV[5])
          fence = ARGV[5]
        else
          fence = tostring(redis.call('INCR', KEYS[3]))
        end
        local value = fence .. (ARGV[6] or '')
        redis.call('SET', KEYS[2], value, 'PX', ARGV[2])
        if count > 0 then
          redis.call('ZADD', KEYS[5], now, value)
          redis.call('PEXPIRE', KEYS[5], ARGV[4])
        end
        return {1, fence, tostring(gen)}
        """

    /// KEYS: session, lease, fence. ARGV: fence, generation the lease started from, credentials
    /// JSON, channel. Announces the session epoch stored in the hash (`e`). Stores while the lease
    /// holds, or when it lapsed with no lease granted and no publication since
    /// (``CoordinationRecord/publish(_:with:now:)``). Returns {1, gen} when stored and announced,
    /// {0, gen, creds} when refused.
    static let publishScript = """
        local gen = redis.call('HGET', KEYS[1], 'gen') or '0'
        local held = redis.call('GET', KEYS[2])
        if held then held = string.match(held, '^[^:]*') end
        local nobodySince = (not held) and (redis.call('GET', KEYS[3]) or '0') == ARGV[1]
        if gen ~= ARGV[2] or (held ~= ARGV[1] and not nobodySince) then
          return {0, gen, redis.call('HGET', KEYS[1], 'creds') or ''}
        end
        local new = redis.call('HINCRBY', KEYS[1], 'gen', 1)
        redis.call('HSET', KEYS[1], 'creds', ARGV[3])
        redis.call('DEL', KEYS[2])
        local epoch = redis.call('HGET', KEYS[1], 'epoch') or ''
        if not string.match(epoch, '^[%w:.]+$') then epoch = '' else epoch = ',"e":"' .. epoch .. '"' end
        redis.call('PUBLISH', ARGV[4], '{"t":"c","g":' .. new .. epoch .. ',"c":' .. ARGV[3] .. '}')
        return {1, tostring(new)}
        """

    /// KEYS: lease. ARGV: fence, failure message (or empty), channel.
    static let endScript = """
        local held = redis.call('GET', KEYS[1])
        if held and string.match(held, '^[^:]*') == ARGV[1] then redis.call('DEL', KEYS[1]) end
        if ARGV[2] ~= '' then redis.call('PUBLISH', ARGV[3], ARGV[2]) end
        return 1
        """

    /// KEYS: logout, session. ARGV: until ms, ttl ms, message, channel, under a key the end's
    /// session epoch and seal (`:<epoch>:<seal>`, stored after the number; empty without one),
    /// and the session epoch the logout was decided in.
    /// A logout decided in an epoch older than the session hash's (by a process that had not heard
    /// of the sign-in that started it) ended only the session that sign-in ended: it is neither
    /// stored nor announced, and the reply is {0, stored epoch}. Otherwise it stores before it
    /// announces, never shortens a longer cooldown, and replies {1}.
    static let logoutScript = """
        if (ARGV[6] or '') ~= '' then
          local epoch = redis.call('HGET', KEYS[2], 'epoch') or ''
          if tonumber(ARGV[6]) < (tonumber(string.match(epoch, '^%d+') or '0') or 0) then return {0, epoch} end
        end
        local current = tonumber(string.match(redis.call('GET', KEYS[1]) or '0', '^%d*') or '0') or 0
        if tonumber(ARGV[1]) > current then redis.call('SET', KEYS[1], ARGV[1] .. (ARGV[5] or ''), 'PX', ARGV[2]) end
        redis.call('PUBLISH', ARGV[4], ARGV[3])
        return {1}
        """

    /// KEYS: session, lease, logout. ARGV: credentials JSON, channel, and under a key the generation
    /// the credentials were sealed after ({gen} when it is not the stored one) and the sealed
    /// session epoch the sign-in starts. The epoch (without a key: the new generation, unsealed)
    /// is stored in the hash's `epoch` and announced as `e`. Ends a cooldown and voids a refresh
    /// in progress (its holder's publication is refused).
    static let signInScript = """
        local gen = redis.call('HGET', KEYS[1], 'gen') or '0'
        if (ARGV[3] or '') ~= '' and gen ~= ARGV[3] then return {gen} end
        local new = redis.call('HINCRBY', KEYS[1], 'gen', 1)
        redis.call('HSET', KEYS[1], 'creds', ARGV[1])
        redis.call('DEL', KEYS[2], KEYS[3])
        local epoch = ARGV[4] or ''
        if epoch == '' then epoch = tostring(new) end
        redis.call('HSET', KEYS[1], 'epoch', epoch)
        epoch = ',"e":"' .. epoch .. '"'
        redis.call('PUBLISH', ARGV[2], '{"t":"c","g":' .. new .. epoch .. ',"c":' .. ARGV[1] .. '}')
        return new
        """
}

extension RedisSessionCoordinator: TrustWarning {
    /// A Redis on another host without `signing-key-env`: every client of it can forge the session.
    package var trustWarning: String? {
        guard signer == nil, !endpoint.isLoopback else { return nil }
        return "\(endpoint) is not a loopback address and 'signing-key-env' is not set: any client of that Redis can sign "
            + "this fleet in with tokens of its choosing, log it out or hold its refreshes; name an environment "
            + "variable holding a shared key (every process of the fleet the same)"
    }
}
