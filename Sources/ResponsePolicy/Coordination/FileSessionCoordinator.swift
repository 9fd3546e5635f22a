import Dispatch
import Foundation

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// Shares one session between the processes of one host, with no server: the protocol of
/// ``RedisSessionCoordinator`` over two files next to the credentials file.
///
/// - `<credentials>.lock`: `flock(2)`ed around every read-modify-write of the shared state, only
///   for the few microseconds one takes (never across a refresh), so a process that dies holding
///   it releases it with its descriptors.
/// - `<credentials>.shared`: the shared state as JSON (mode 0600, it holds the tokens): generation,
///   credentials, the lease (fencing token, holder pid, expiry), the last fencing token, the
///   cooldown's end, the last failed refresh, the recent lease grants for `refresh.limit`. It is
///   replaced with `rename(2)`, so a reader without the lock sees an old state or a new one.
///
/// A watcher thread notices a new state file (its inode changes with each rename) within
/// `watch-interval` (`20ms` by default) and re-reads it: other processes' publications and
/// logouts reach the engine as updates, and waiters wake. A holder that dies delays the others
/// by at most `lease` (its expiry is in the file), or less when its pid is gone.
///
/// ```swift
/// let coordinator = try FileSessionCoordinator(.init(path: "/var/lib/app/credentials.json"))
/// ```
///
/// Concurrency contract: see ``SessionCoordinator``. File work runs on a private serial queue;
/// the lock is waited for at most `connect-timeout` (`250ms` by default).
public final class FileSessionCoordinator: SessionCoordinator {
    public struct Configuration: Sendable, Equatable {
        /// The credentials file the lock and state files sit next to.
        public var path: String
        public var lease: Duration
        public var connectTimeout: Duration
        public var watchInterval: Duration

        public init(
            path: String, lease: Duration = .seconds(15), connectTimeout: Duration = .milliseconds(250),
            watchInterval: Duration = .milliseconds(20)
        ) {
            self.path = path
            self.lease = lease
            self.connectTimeout = connectTimeout
            self.watchInterval = watchInterval
        }
    }

    /// What `<credentials>.shared` holds.
    struct Shared: Equatable {
        var generation: UInt64 = 0
        var credentials: Credentials?
        var fence: UInt64 = 0
        var lease: (fence: UInt64, pid: Int32, expires: Int64)?
        var loggedOutUntil: Int64?
        var failure: (fence: UInt64, reason: String)?
        var refreshes: [Int64] = []

        static func == (a: Self, b: Self) -> Bool {
            a.generation == b.generation && a.credentials == b.credentials && a.fence == b.fence
                && a.lease?.fence == b.lease?.fence && a.loggedOutUntil == b.loggedOutUntil
                && a.failure?.fence == b.failure?.fence
        }
    }

    private struct State {
        var updates: (@Sendable (SessionUpdate) -> Void)?
        var seen = Shared()
        var health = CoordinatorHealth()
        var stopped = false
        var watching = false
    }

    public let configuration: Configuration
    let lockPath: String
    let statePath: String
    private let state = Locked(State())
    private let signal = ChangeSignal()
    private let queue = DispatchQueue(label: "response-policy.file-coordinator")

    public init(_ configuration: Configuration) throws(CoordinationError) {
        guard !configuration.path.isEmpty else { throw CoordinationError("the file coordinator needs a file path") }
        self.configuration = configuration
        let path = (configuration.path as NSString).expandingTildeInPath
        lockPath = path + ".lock"
        statePath = path + ".shared"
    }

    // MARK: - SessionCoordinator

    public func start(local: Credentials?, updates: @escaping @Sendable (SessionUpdate) -> Void) async
        -> SharedSession?
    {
        let startWatcher = state.withLock { state -> Bool in
            state.updates = updates
            defer { state.watching = true }
            return !state.watching
        }
        let result = await transact { shared -> SharedSession? in
            if shared.credentials == nil, let local {
                shared.credentials = local
                return nil
            }
            guard shared.credentials != nil || shared.loggedOutUntil != nil else { return nil }
            return Self.session(shared)
        }
        var shared: SharedSession?
        if case .success(let session) = result, let session {
            state.withLock { $0.seen.generation = max($0.seen.generation, session.generation) }
            shared = session
        }
        // After `seen`: the watcher's first look must not announce what start returns.
        if startWatcher {
            let thread = Thread { [self] in watchLoop() }
            thread.name = "response-policy.file-coordinator-watch"
            thread.start()
        }
        return shared
    }

    public func beginRefresh(_ request: RefreshTurnRequest) async -> RefreshTurn {
        let deadline = ContinuousClock.now + request.timeout
        var waited = false
        var holder: UInt64?
        let leaseMs = configuration.lease.milliseconds()
        while true {
            if Task.isCancelled { return .unavailable("the refresh was cancelled while it waited for its turn") }
            let seen = signal.version
            let remaining = deadline - ContinuousClock.now
            if waited, remaining <= .zero {
                return .failedElsewhere("another process's refresh did not finish within \(request.timeout)")
            }
            enum Step {
                case turn(RefreshTurn)
                case wait(UInt64, Int64)
            }
            let (waitedNow, holderNow) = (waited, holder)
            let step = await transact { shared -> Step in
                let now = Date().millisecondsSince1970
                if shared.generation > request.failedGeneration {
                    let session = Self.session(shared)
                    return .turn(waitedNow ? .published(session) : .newer(session))
                }
                if let holder = holderNow, let failure = shared.failure, failure.fence == holder {
                    return .turn(.failedElsewhere(failure.reason))
                }
                if let lease = shared.lease, lease.expires > now, Self.isAlive(lease.pid) {
                    return .wait(lease.fence, lease.expires - now)
                }
                if let limit = request.limit {
                    shared.refreshes.removeAll { $0 <= now - limit.per.milliseconds() }
                    if shared.refreshes.count >= limit.count { return .turn(.limited) }
                    shared.refreshes.append(now)
                }
                shared.fence += 1
                shared.lease = (shared.fence, getpid(), now + leaseMs)
                return .turn(.lease(RefreshLease(fencingToken: shared.fence, generation: shared.generation)))
            }
            switch step {
            case .failure(let error): return .unavailable(error.reason)
            case .success(.turn(let turn)): return turn
            case .success(.wait(let fence, let leftMs)):
                holder = fence
                waited = true
                let slice = min(remaining, .milliseconds(leftMs + 5), .milliseconds(250))
                await signal.wait(after: seen, timeout: slice)
            }
        }
    }

    public func publish(_ credentials: Credentials, with lease: RefreshLease) async -> PublishResult {
        let result = await transact { shared -> PublishResult in
            let now = Date().millisecondsSince1970
            guard let held = shared.lease, held.fence == lease.fencingToken, held.expires > now,
                shared.generation == lease.generation
            else {
                return .leaseLost(current: shared.credentials == nil ? nil : Self.session(shared))
            }
            shared.generation += 1
            shared.credentials = credentials
            shared.lease = nil
            return .published(SharedSession(credentials: credentials, generation: shared.generation))
        }
        switch result {
        case .failure(let error): return .unavailable(error.reason)
        case .success(let outcome):
            if case .published(let session) = outcome { state.withLock { $0.seen.generation = session.generation } }
            return outcome
        }
    }

    public func endRefresh(_ lease: RefreshLease, failure: String?) async {
        _ = await transact { shared in
            if shared.lease?.fence == lease.fencingToken { shared.lease = nil }
            if let failure { shared.failure = (lease.fencingToken, String(failure.prefix(300))) }
        }
    }

    public func publishLogout(until: Date, reason: String) async {
        _ = await transact { shared in
            let end = until.millisecondsSince1970
            if end > (shared.loggedOutUntil ?? 0) { shared.loggedOutUntil = end }
        }
        // This process knows of its own logout: the watcher need not announce it back.
        state.withLock { state in
            state.seen.loggedOutUntil = max(state.seen.loggedOutUntil ?? 0, until.millisecondsSince1970)
        }
    }

    public func publishSignIn(_ credentials: Credentials) async -> SharedSession? {
        let result = await transact { shared -> SharedSession in
            shared.generation += 1
            shared.credentials = credentials
            shared.lease = nil
            shared.loggedOutUntil = nil
            return SharedSession(credentials: credentials, generation: shared.generation)
        }
        guard case .success(let session) = result else { return nil }
        state.withLock { $0.seen.generation = max($0.seen.generation, session.generation) }
        return session
    }

    public func stop() {
        state.withLock { $0.stopped = true }
        signal.bump()
    }

    // MARK: - Files

    /// Runs `body` over the shared state under the lock, writing it back when it changed.
    private func transact<R: Sendable>(_ body: @escaping @Sendable (inout Shared) -> R) async
        -> Result<R, CoordinationError>
    {
        if state.withLock({ $0.stopped }) { return .failure(CoordinationError("the file coordinator is stopped")) }
        let result = await withCheckedContinuation { continuation in
            queue.async { [self] in continuation.resume(returning: transactOnQueue(body)) }
        }
        switch result {
        case .failure(let error):
            if let update = state.withLock({ $0.health.fail(error.reason) }) { send(update) }
        case .success:
            if let update = state.withLock({ $0.health.recover() }) { send(update) }
        }
        return result
    }

    private func transactOnQueue<R>(_ body: (inout Shared) -> R) -> Result<R, CoordinationError> {
        let descriptor = open(lockPath, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        guard descriptor >= 0 else {
            return .failure(
                CoordinationError("cannot open the lock file '\(lockPath)': \(String(cString: strerror(errno)))"))
        }
        defer { close(descriptor) }
        let deadline = ContinuousClock.now + configuration.connectTimeout
        while flock(descriptor, LOCK_EX | LOCK_NB) != 0 {
            guard errno == EWOULDBLOCK || errno == EINTR, ContinuousClock.now < deadline else {
                return .failure(
                    CoordinationError(
                        "the lock file '\(lockPath)' stayed locked longer than \(configuration.connectTimeout)"))
            }
            usleep(500)
        }
        defer { flock(descriptor, LOCK_UN) }
        var shared: Shared
        switch Self.read(statePath) {
        case .failure(let error): return .failure(error)
        case .success(let value): shared = value ?? Shared()
        }
        let before = shared
        let result = body(&shared)
        if shared != before || shared.refreshes != before.refreshes {
            if let error = Self.write(shared, to: statePath) { return .failure(error) }
        }
        return .success(result)
    }

    static func read(_ path: String) -> Result<Shared?, CoordinationError> {
        guard let data = FileManager.default.contents(atPath: path) else {
            if FileManager.default.fileExists(atPath: path) {
                return .failure(CoordinationError("cannot read the shared session file '\(path)'"))
            }
            return .success(nil)
        }
        guard let object = try? JSONSerialization.jsonObject(with: data) as? [String: Any] else {
            return .failure(CoordinationError("the shared session file '\(path)' is malformed"))
        }
        func number(_ key: String, in map: [String: Any]? = nil) -> NSNumber? { (map ?? object)[key] as? NSNumber }
        var shared = Shared()
        shared.generation = number("generation")?.uint64Value ?? 0
        shared.credentials = object["credentials"].flatMap(SharedCredentialsCodec.decode(object:))
        shared.fence = number("fence")?.uint64Value ?? 0
        if let lease = object["lease"] as? [String: Any], let fence = number("fence", in: lease)?.uint64Value,
            let expires = number("expires", in: lease)?.int64Value
        {
            shared.lease = (fence, number("pid", in: lease)?.int32Value ?? 0, expires)
        }
        shared.loggedOutUntil = number("logged-out-until")?.int64Value
        if let failure = object["failure"] as? [String: Any], let fence = number("fence", in: failure)?.uint64Value {
            shared.failure = (fence, failure["reason"] as? String ?? "the refresh failed in another process")
        }
        shared.refreshes = (object["refreshes"] as? [NSNumber])?.map(\.int64Value) ?? []
        return .success(shared)
    }

    static func write(_ shared: Shared, to path: String) -> CoordinationError? {
        var object: [String: Any] = ["generation": shared.generation, "fence": shared.fence]
        if let credentials = shared.credentials,
            let encoded = try? JSONSerialization.jsonObject(with: Data(SharedCredentialsCodec.encode(credentials).utf8))
        {
            object["credentials"] = encoded
        }
        if let lease = shared.lease {
            object["lease"] = ["fence": lease.fence, "pid": lease.pid, "expires": lease.expires]
        }
        if let until = shared.loggedOutUntil { object["logged-out-until"] = until }
        if let failure = shared.failure { object["failure"] = ["fence": failure.fence, "reason": failure.reason] }
        if !shared.refreshes.isEmpty { object["refreshes"] = shared.refreshes }
        guard let data = try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys]) else {
            return CoordinationError("cannot encode the shared session")
        }
        let temporary = path + ".tmp-\(getpid())"
        let descriptor = open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard descriptor >= 0 else {
            return CoordinationError(
                "cannot write the shared session file '\(path)': \(String(cString: strerror(errno)))")
        }
        let written = data.withUnsafeBytes { bytes in Glibc.write(descriptor, bytes.baseAddress, bytes.count) }
        close(descriptor)
        guard written == data.count, rename(temporary, path) == 0 else {
            unlink(temporary)
            return CoordinationError("cannot replace the shared session file '\(path)'")
        }
        return nil
    }

    /// Whether a lease holder's process still exists (on this host, where the file lives).
    static func isAlive(_ pid: Int32) -> Bool {
        guard pid > 0 else { return true }
        return kill(pid, 0) == 0 || errno == EPERM
    }

    static func session(_ shared: Shared) -> SharedSession {
        let now = Date().millisecondsSince1970
        return SharedSession(
            credentials: shared.credentials, generation: shared.generation,
            loggedOutUntil: shared.loggedOutUntil.flatMap { $0 > now ? Date(milliseconds: $0) : nil })
    }

    // MARK: - Watcher

    /// Re-reads the state file when it was replaced, and tells the engine what changed.
    private func watchLoop() {
        // Nothing seen yet: the first look reads the file, so a publication made between `start`
        // and this thread's first run is not missed.
        var identity: [Int] = [-1]
        while !state.withLock({ $0.stopped }) {
            Thread.sleep(forTimeInterval: Double(configuration.watchInterval.milliseconds()) / 1000)
            let current = Self.identity(statePath)
            guard current != identity else { continue }
            identity = current
            guard case .success(let read) = Self.read(statePath), let shared = read else { continue }
            var news: [SessionUpdate] = []
            state.withLock { state in
                let seen = state.seen
                if shared.generation > seen.generation, shared.credentials != nil {
                    news.append(.credentials(Self.session(shared)))
                }
                if let until = shared.loggedOutUntil, until > (seen.loggedOutUntil ?? 0),
                    until > Date().millisecondsSince1970
                {
                    news.append(.loggedOut(until: Date(milliseconds: until), reason: "logged out by another process"))
                }
                if shared.generation >= seen.generation { state.seen = shared }
            }
            for update in news { send(update) }
            signal.bump()
        }
    }

    private static func identity(_ path: String) -> [Int] {
        var info = stat()
        guard stat(path, &info) == 0 else { return [] }
        return [Int(info.st_ino), Int(info.st_size), Int(info.st_mtim.tv_nsec), Int(info.st_mtim.tv_sec)]
    }

    private func send(_ update: SessionUpdate) {
        let updates = state.withLock { $0.stopped ? nil : $0.updates }
        updates?(update)
    }
}
