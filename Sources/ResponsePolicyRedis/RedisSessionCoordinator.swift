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
/// | `response-policy:{key}:session` | hash: `gen` (the generation) and `creds` (the credentials JSON) |
/// | `response-policy:{key}:lease` | the fencing token of the process refreshing now, `PX lease` |
/// | `response-policy:{key}:fence` | the counter fencing tokens come from (`INCR`) |
/// | `response-policy:{key}:logout` | the cooldown's end in ms since 1970, with a TTL to that end |
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
        var pendingLogout: (until: Int64, reason: String)?
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
        signer = configuration.signingKey.map(SharedStateSigner.init(key:))
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
            if items.count >= 4, items[0].integer == 0 {
                let session = SharedSession(
                    credentials: credentials(items[2].text, source: "the session hash"),
                    generation: UInt64(items[1].integer ?? 0), loggedOutUntil: Self.until(items[3]))
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
            let arguments = [
                "EVAL", Self.beginScript, "5", keys.session, keys.lease, keys.fence, keys.logout, keys.refreshes,
                // Never shorter than the refresh it covers (a live holder keeps its lease).
                String(request.failedGeneration), String(request.leaseLength(configured: configuration.lease).milliseconds()),
                String(limit?.count ?? 0), String(limit?.per.milliseconds() ?? 0),
            ]
            switch await run(arguments) {
            case .failure(let error): return .unavailable(error.message)
            case .success(let reply):
                let items = reply.items
                switch items.first?.integer {
                case 0 where items.count >= 4:
                    let session = SharedSession(
                        credentials: credentials(items[2].text, source: "the session hash"),
                        generation: UInt64(items[1].integer ?? 0), loggedOutUntil: Self.until(items[3]))
                    remember(session)
                    return waited ? .published(session) : .newer(session)
                case 1 where items.count >= 3:
                    return .lease(
                        RefreshLease(
                            fencingToken: UInt64(items[1].integer ?? 0), generation: UInt64(items[2].integer ?? 0)))
                case 2 where items.count >= 3:
                    holder = items[1].integer.map { UInt64($0) }
                    waited = true
                    let leaseLeft = Duration.milliseconds(max(1, items[2].integer ?? 1)) + .milliseconds(5)
                    // At most 500 ms between looks at Redis, in case a message was lost in a reconnect.
                    await signal.wait(after: seen, timeout: min(remaining, leaseLeft, .milliseconds(500)))
                case 3:
                    return .limited
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
            String(lease.generation), SharedCredentialsCodec.encode(credentials, signer: signer), keys.channel,
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
            let stored = items.count > 2 ? self.credentials(items[2].text, source: "the session hash") : nil
            return .leaseLost(current: stored.map { SharedSession(credentials: $0, generation: generation) })
        }
    }

    public func endRefresh(_ lease: RefreshLease, failure: String?) async {
        var message = ""
        if let failure {
            let text = String(failure.prefix(300))
            var object: [String: Any] = ["t": "f", "f": lease.fencingToken, "w": text]
            if let signer { object["s"] = signer.sign("failure\n\(lease.fencingToken)\n\(text)") }
            message = Self.json(object)
        }
        _ = await run([
            "EVAL", Self.endScript, "1", keys.lease, String(lease.fencingToken), message, keys.channel,
        ])
    }

    public func publishLogout(until: Date, reason: String) async {
        let untilMs = until.millisecondsSince1970
        let ttl = max(1, untilMs - Date().millisecondsSince1970)
        let message = logoutMessage(untilMs, reason)
        let result = await run([
            "EVAL", Self.logoutScript, "1", keys.logout, String(untilMs), String(ttl), message, keys.channel,
        ])
        if case .failure = result {
            // Published by the subscriber when Redis is back (issue 19: a logout during an outage
            // was never heard by the others, who kept sending through the cooldown).
            state.withLock { state in
                if untilMs > (state.pendingLogout?.until ?? 0) { state.pendingLogout = (untilMs, reason) }
            }
        }
    }

    /// A logout's announcement, signed when the fleet has a key.
    private func logoutMessage(_ untilMs: Int64, _ reason: String) -> String {
        let text = String(reason.prefix(300))
        var object: [String: Any] = ["t": "l", "u": untilMs, "r": text]
        if let signer { object["s"] = signer.sign("logout\n\(untilMs)\n\(text)") }
        return Self.json(object)
    }

    /// Publishes a logout that could not be published while Redis was unreachable, unless its
    /// cooldown is over by now.
    private func publishPendingLogout(on connection: RedisConnection) throws(RedisError) {
        guard let (untilMs, reason) = state.withLock({ $0.pendingLogout }) else { return }
        let ttl = untilMs - Date().millisecondsSince1970
        if ttl > 0 {
            let message = logoutMessage(untilMs, reason)
            _ = try connection.command([
                "EVAL", Self.logoutScript, "1", keys.logout, String(untilMs), String(ttl), message, keys.channel,
            ])
        }
        state.withLock { state in if state.pendingLogout?.until == untilMs { state.pendingLogout = nil } }
    }

    public func publishSignIn(_ credentials: Credentials) async -> SharedSession? {
        let arguments = [
            "EVAL", Self.signInScript, "3", keys.session, keys.lease, keys.logout,
            SharedCredentialsCodec.encode(credentials, signer: signer), keys.channel,
        ]
        guard case .success(let reply) = await run(arguments), let generation = reply.integer else { return nil }
        let session = SharedSession(credentials: credentials, generation: UInt64(generation))
        remember(session)
        return session
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
        let latest = state.withLock { $0.latest }
        let seed = latest?.credentials ?? local
        return [
            "EVAL", Self.seedScript, "2", keys.session, keys.logout, seed.map { SharedCredentialsCodec.encode($0, signer: signer) } ?? "",
            String(latest?.generation ?? 0),
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
        guard items.count >= 4, items[0].integer == 0 else { return }
        let session = SharedSession(
            credentials: credentials(items[2].text, source: "the session hash"),
            generation: UInt64(items[1].integer ?? 0), loggedOutUntil: Self.until(items[3]))
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
                let credentials = object["c"].flatMap({ credentials(object: $0, source: "a publication") })
            else { break }
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
            if let signer, !signer.verify("logout\n\(until)\n\(reason)", mac: object["s"] as? String) {
                send(.problem("a logout on \(keys.channel) was refused: not signed with this fleet's key (signing-key-env)"))
                break
            }
            send(.loggedOut(until: Date(milliseconds: until), reason: reason))
        case "f":
            guard let number = object["f"] as? NSNumber, number.doubleValue.isFinite, number.doubleValue >= 0,
                number.doubleValue < 9e15
            else { break }
            let fence = number.uint64Value
            let reason = object["w"] as? String ?? "the refresh failed in another process"
            if let signer, !signer.verify("failure\n\(fence)\n\(reason)", mac: object["s"] as? String) { break }
            state.withLock { state in
                if state.failures.count > 64 { state.failures.removeAll() }
                state.failures[fence] = object["w"] as? String ?? "the refresh failed in another process"
            }
        default: break
        }
        signal.bump()
    }

    // MARK: - State

    /// Credentials read from Redis, or nil (with a `problem` naming where they came from) when
    /// they are malformed or out of range: a forged or corrupted value never reaches the engine.
    private func credentials(_ text: String?, source: String) -> Credentials? {
        guard let text, !text.isEmpty else { return nil }
        switch SharedCredentialsCodec.check(text, signer: signer) {
        case .success(let credentials): return credentials
        case .failure(let error):
            send(.problem("\(source) of \(keys.session) on \(endpoint) was refused: \(error.reason)"))
            return nil
        }
    }

    private func credentials(object: Any, source: String) -> Credentials? {
        switch SharedCredentialsCodec.check(object: object, signer: signer) {
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
        guard let milliseconds = reply.integer, milliseconds > Date().millisecondsSince1970 else { return nil }
        return Date(milliseconds: milliseconds)
    }

    private static func json(_ object: [String: Any]) -> String {
        let data = (try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])) ?? Data()
        return String(decoding: data, as: UTF8.self)
    }

    // MARK: - Scripts

    /// KEYS: session, logout. ARGV: credentials JSON (or empty), generation to seed with.
    /// Returns {1} when it seeded, else {0, gen, creds, logout-until}.
    static let seedScript = """
        local gen = redis.call('HGET', KEYS[1], 'gen')
        if not gen and ARGV[1] ~= '' then
          redis.call('HSET', KEYS[1], 'gen', ARGV[2], 'creds', ARGV[1])
          return {1}
        end
        return {0, gen or '0', redis.call('HGET', KEYS[1], 'creds') or '', redis.call('GET', KEYS[2]) or '0'}
        """

    /// KEYS: session, lease, fence, logout, refreshes. ARGV: failed generation, lease ms, limit
    /// count (0: none), limit window ms. Returns {0, gen, creds, logout-until} (newer), {1, fence,
    /// gen} (lease granted), {2, holder fence, lease ms left} (wait), {3} (limit reached).
    static let beginScript = """
        local gen = tonumber(redis.call('HGET', KEYS[1], 'gen') or '0')
        if gen > tonumber(ARGV[1]) then
          return {0, tostring(gen), redis.call('HGET', KEYS[1], 'creds') or '', redis.call('GET', KEYS[4]) or '0'}
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
          if redis.call('ZCARD', KEYS[5]) >= count then return {3} end
        end
        local fence = redis.call('INCR', KEYS[3])
        redis.call('SET', KEYS[2], fence, 'PX', ARGV[2])
        if count > 0 then
          redis.call('ZADD', KEYS[5], now, fence)
          redis.call('PEXPIRE', KEYS[5], ARGV[4])
        end
        return {1, tostring(fence), tostring(gen)}
        """

    /// KEYS: session, lease, fence. ARGV: fence, generation the lease started from, credentials
    /// JSON, channel. Stores while the lease holds, or when it lapsed with no lease granted and no
    /// publication since (``CoordinationRecord/publish(_:with:now:)``). Returns {1, gen} when
    /// stored and announced, {0, gen, creds} when refused.
    static let publishScript = """
        local gen = redis.call('HGET', KEYS[1], 'gen') or '0'
        local held = redis.call('GET', KEYS[2])
        local nobodySince = (not held) and (redis.call('GET', KEYS[3]) or '0') == ARGV[1]
        if gen ~= ARGV[2] or (held ~= ARGV[1] and not nobodySince) then
          return {0, gen, redis.call('HGET', KEYS[1], 'creds') or ''}
        end
        local new = redis.call('HINCRBY', KEYS[1], 'gen', 1)
        redis.call('HSET', KEYS[1], 'creds', ARGV[3])
        redis.call('DEL', KEYS[2])
        redis.call('PUBLISH', ARGV[4], '{"t":"c","g":' .. new .. ',"c":' .. ARGV[3] .. '}')
        return {1, tostring(new)}
        """

    /// KEYS: lease. ARGV: fence, failure message (or empty), channel.
    static let endScript = """
        if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
        if ARGV[2] ~= '' then redis.call('PUBLISH', ARGV[3], ARGV[2]) end
        return 1
        """

    /// KEYS: logout. ARGV: until ms, ttl ms, message, channel. Stores before it announces, and
    /// never shortens a longer cooldown.
    static let logoutScript = """
        local current = tonumber(redis.call('GET', KEYS[1]) or '0')
        if tonumber(ARGV[1]) > current then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) end
        redis.call('PUBLISH', ARGV[4], ARGV[3])
        return 1
        """

    /// KEYS: session, lease, logout. ARGV: credentials JSON, channel. Ends a cooldown and voids a
    /// refresh in progress (its holder's publication is refused).
    static let signInScript = """
        local new = redis.call('HINCRBY', KEYS[1], 'gen', 1)
        redis.call('HSET', KEYS[1], 'creds', ARGV[1])
        redis.call('DEL', KEYS[2], KEYS[3])
        redis.call('PUBLISH', ARGV[2], '{"t":"c","g":' .. new .. ',"c":' .. ARGV[1] .. '}')
        return new
        """
}
