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
///   cooldown's end, the session epoch (the last sign-in's generation), the last failed refresh,
///   the token endpoint's `Retry-After` a holder was given (no lease before it ends), and the
///   generations `refresh.limit` counts with the newest one a process saw accepted. It is
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
package final class FileSessionCoordinator: SessionCoordinator {
    package struct Configuration: Sendable, Equatable {
        /// The credentials file the lock and state files sit next to.
        package var path: String
        package var lease: Duration
        package var connectTimeout: Duration
        package var watchInterval: Duration
        /// From `signing-key-env`: the shared record is used only when sealed with it (every field).
        package var signingKey: Data?

        package init(
            path: String, lease: Duration = .seconds(15), connectTimeout: Duration = .milliseconds(250),
            watchInterval: Duration = .milliseconds(20), signingKey: Data? = nil
        ) {
            self.path = path
            self.lease = lease
            self.connectTimeout = connectTimeout
            self.watchInterval = watchInterval
            self.signingKey = signingKey
        }
    }

    /// What `<credentials>.shared` holds: the protocol's record.
    typealias Shared = CoordinationRecord

    private struct State {
        var updates: (@Sendable (SessionUpdate) -> Void)?
        var seen = Shared()
        /// What this process remembers of the session, so a state file that was removed or put
        /// back never takes the fleet backwards (``CoordinationMemory``).
        var memory = CoordinationMemory()
        var health = CoordinatorHealth()
        var stopped = false
        var watching = false
        /// A logout this process could not store (the lock file was busy or unwritable): its end
        /// and the session epoch it was decided in.
        var pendingLogout: (until: Int64, epoch: UInt64)?
        /// The highest revision of a sealed record read or written: an older copy put back is a replay.
        var revision: UInt64 = 0
    }

    package let configuration: Configuration
    let lockPath: String
    let statePath: String
    let signer: SharedStateSigner?
    private let state = Locked(State())
    private let signal = ChangeSignal()
    private let queue = DispatchQueue(label: "response-policy.file-coordinator")

    package init(_ configuration: Configuration) throws(CoordinationError) {
        guard !configuration.path.isEmpty else { throw CoordinationError("the file coordinator needs a file path") }
        self.configuration = configuration
        let path = (configuration.path as NSString).expandingTildeInPath
        lockPath = path + ".lock"
        statePath = path + ".shared"
        signer = configuration.signingKey.map { SharedStateSigner(key: $0, scope: "file") }
    }

    // MARK: - SessionCoordinator

    package func start(local: Credentials?, updates: @escaping @Sendable (SessionUpdate) -> Void) async
        -> SharedSession?
    {
        await start(saved: local.map { SharedSession(credentials: $0, generation: 0) }, updates: updates)
    }

    package func start(saved: SharedSession?, updates: @escaping @Sendable (SessionUpdate) -> Void) async
        -> SharedSession?
    {
        let leaseMs = configuration.lease.milliseconds()
        let startWatcher = state.withLock { state -> Bool in
            state.updates = updates
            if let saved { state.memory.saw(saved) }
            defer { state.watching = true }
            return !state.watching
        }
        let seed = state.withLock { $0.memory.seed(now: Self.monotonicNow, leaseMs: leaseMs) }
        let result = await transact { shared -> SharedSession? in
            shared.join(seed: seed, now: Date().millisecondsSince1970)
        }
        var shared: SharedSession?
        if case .success(let session) = result, let session {
            state.withLock { state in
                state.seen.generation = max(state.seen.generation, session.generation)
                state.memory.saw(session)
            }
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

    package func beginRefresh(_ request: RefreshTurnRequest) async -> RefreshTurn {
        let deadline = ContinuousClock.now + request.timeout
        var holder: UInt64?
        // Never shorter than the refresh it covers: a live holder must not lose its lease while
        // its refresh is still allowed to run (issue 19: a lost lease dropped the new pair).
        let leaseMs = request.leaseLength(configured: configuration.lease).milliseconds()
        let pid = Int64(getpid())
        while true {
            if Task.isCancelled { return .unavailable("the refresh was cancelled while it waited for its turn") }
            let seen = signal.version
            let remaining = deadline - ContinuousClock.now
            if holder != nil, remaining <= .zero {
                return .failedElsewhere(WaitFailure.reason(holder: holder, timeout: request.timeout))
            }
            enum Step {
                case turn(RefreshTurn)
                case wait(UInt64, Int64)
            }
            let holderNow = holder
            let limit = request.limit.map { (count: $0.count, perMs: $0.per.milliseconds()) }
            let sent = ContinuousClock.now
            let now = Self.monotonicNow
            let (knows, seed) = state.withLock { state in
                (state.memory.knowledge(now: now), state.memory.seed(now: now, leaseMs: leaseMs))
            }
            let step = await transact { shared -> Step in
                let now = Date().millisecondsSince1970
                if let holderNow,
                    let outcome = shared.outcome(
                        for: holderNow, failedGeneration: request.failedGeneration, now: now)
                {
                    return .turn(outcome)
                }
                var answer = shared.begin(
                    failedGeneration: request.failedGeneration, knows: knows, leaseMs: leaseMs, limit: limit,
                    holder: pid,
                    now: now, isAlive: { Self.isAlive(Int32(truncatingIfNeeded: $0)) })
                if case .behind = answer, let seed {
                    // The state file was removed or put back: re-seeded from what this process
                    // knows, under the same lock, then asked again.
                    shared.reseed(seed, now: now)
                    answer = shared.begin(
                        failedGeneration: request.failedGeneration, knows: knows, leaseMs: leaseMs, limit: limit,
                        holder: pid, now: now, isAlive: { Self.isAlive(Int32(truncatingIfNeeded: $0)) })
                }
                switch answer {
                case .newer(let session): return .turn(holderNow == nil ? .newer(session) : .published(session))
                case .granted(let lease): return .turn(.lease(lease))
                case .limited: return .turn(.limited)
                case .embargoed(let until, let reason):
                    return .turn(.retryAfter(until: Date(milliseconds: until), reason: reason))
                case .wait(let fence, let left): return .wait(fence, left)
                case .behind(let stored):
                    return .turn(
                        .unavailable(
                            "the shared session file '\(self.statePath)' holds generation \(stored), older than this process knows, "
                                + "and this process has no pair to re-seed it with"))
                }
            }
            switch step {
            case .failure(let error): return .unavailable(error.reason)
            case .success(.turn(.lease(var lease))):
                state.withLock { $0.memory.holds(fence: lease.fencingToken) }
                lease.term = request.leaseLength(configured: configuration.lease) - (ContinuousClock.now - sent)
                return .lease(lease)
            case .success(.turn(let turn)):
                if case .newer(let session) = turn { state.withLock { $0.memory.saw(session) } }
                if case .published(let session) = turn { state.withLock { $0.memory.saw(session) } }
                return turn
            case .success(.wait(let fence, let leftMs)):
                holder = fence
                // Seen: honoured for its whole term even if the state file is removed.
                if fence > 0 {
                    state.withLock { state in
                        state.memory.heardGrant(
                            fence: fence, generation: request.failedGeneration, value: String(fence), leaseMs: leftMs,
                            now: Self.monotonicNow)
                    }
                }
                let slice = min(remaining, .milliseconds(leftMs + 5), .milliseconds(250))
                await signal.wait(after: seen, timeout: slice)
            }
        }
    }

    package func publish(_ credentials: Credentials, with lease: RefreshLease) async -> PublishResult {
        let result = await transact { shared -> PublishResult in
            shared.publish(credentials, with: lease, now: Date().millisecondsSince1970)
        }
        switch result {
        case .failure(let error): return .unavailable(error.reason)
        case .success(let outcome):
            if case .published(let session) = outcome {
                state.withLock { state in
                    state.seen.generation = max(state.seen.generation, session.generation)
                    state.memory.saw(session)
                }
            }
            return outcome
        }
    }

    package func endRefresh(_ lease: RefreshLease, failure: String?) async {
        await endRefresh(lease, failure: failure, retryAfter: nil)
    }

    /// With `retryAfter`, the record keeps the wait the token endpoint asked for: no process is
    /// granted a lease before it ends, and each hears it from its watcher.
    package func endRefresh(_ lease: RefreshLease, failure: String?, retryAfter: Date?) async {
        _ = await transact { shared in
            shared.end(
                lease, failure: failure, retryAfter: retryAfter?.millisecondsSince1970,
                now: Date().millisecondsSince1970)
        }
    }

    /// A response accepted the token of `generation`: `refresh.limit` does not count it.
    package func noteAccepted(generation: UInt64) async {
        _ = await transact { shared in shared.accept(generation) }
    }

    package func publishLogout(until: Date, reason: String) async {
        // The session epoch it was decided in: the latest this process has read. A logout decided
        // before a sign-in it had not read yet is not stored (``CoordinationRecord/logout(until:epoch:)``).
        await publishLogout(until: until, reason: reason, epoch: state.withLock { $0.seen.epoch })
    }

    package func publishLogout(until: Date, reason: String, epoch: UInt64) async {
        let end = until.millisecondsSince1970
        let stored = await transact { shared in shared.logout(until: end, epoch: epoch) }
        switch stored {
        case .failure:
            // Published when the lock file is usable again (issue 19: a logout during an outage
            // was never heard by the others).
            state.withLock { state in
                if end > (state.pendingLogout?.until ?? 0) { state.pendingLogout = (end, epoch) }
            }
        case .success(false): return
        case .success(true): break
        }
        // This process knows of its own logout: the watcher need not announce it back.
        state.withLock { state in state.seen.loggedOutUntil = max(state.seen.loggedOutUntil ?? 0, end) }
    }

    package func publishSignIn(_ credentials: Credentials) async -> SharedSession? {
        let floor = state.withLock { $0.memory.generation }
        let result = await transact { shared -> SharedSession in shared.signIn(credentials, after: floor) }
        guard case .success(let session) = result else { return nil }
        state.withLock { state in
            state.seen.generation = max(state.seen.generation, session.generation)
            state.memory.saw(session)
        }
        return session
    }

    /// This process's clock for what it remembers (``CoordinationMemory``).
    private static var monotonicNow: Int64 { ContinuousClock.now.coordinationMilliseconds }

    package func stop() {
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
        // O_NONBLOCK: a FIFO planted at the lock's name is refused below, never waited on.
        let descriptor = open(lockPath, O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0o600)
        guard descriptor >= 0 else {
            return .failure(
                CoordinationError("cannot open the lock file '\(lockPath)': \(String(cString: strerror(errno)))"))
        }
        defer { close(descriptor) }
        // Checked before it is locked: another user's lock file (which they could hold locked) or
        // anything but a regular file is refused at once.
        var lockInfo = stat()
        guard fstat(descriptor, &lockInfo) == 0, lockInfo.st_mode & S_IFMT == S_IFREG else {
            return .failure(CoordinationError("the lock file '\(lockPath)' is not a regular file; remove it"))
        }
        if let refusal = Self.privacyProblem(lockPath, lockInfo) { return .failure(refusal) }
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
        switch Self.read(statePath, signer: signer) {
        case .failure(let error): return .failure(error)
        case .success(let value): shared = value ?? Shared()
        }
        if let refusal = replayProblem(shared) { return .failure(refusal) }
        let before = shared
        let pending = state.withLock { $0.pendingLogout }
        if let pending { shared.logout(until: pending.until, epoch: pending.epoch) }
        let result = body(&shared)
        // Read now: the session epoch is known from here on (a logout decided later belongs to it).
        state.withLock { state in
            state.seen.epoch = max(state.seen.epoch, shared.epoch)
            state.memory.sawEpoch(shared.epoch)
            state.memory.sawFence(shared.fence)
            if shared.credentials != nil { state.memory.sawStoreSession() }
        }
        if shared != before {
            // Never below a revision this process has seen: a file removed and recreated goes on
            // from there, so no older copy can pass for newer.
            shared.revision = max(before.revision, state.withLock { $0.revision }) + 1
            if let error = Self.write(shared, to: statePath, signer: signer) { return .failure(error) }
            state.withLock { $0.revision = max($0.revision, shared.revision) }
        }
        if let pending {
            state.withLock { state in if state.pendingLogout?.until == pending.until { state.pendingLogout = nil } }
        }
        return .success(result)
    }

    /// With a key: a sealed record older than one this process has seen is a copy put back (a
    /// replay: it would roll the generation, the lease or the cooldown back), refused as trouble.
    private func replayProblem(_ shared: Shared) -> CoordinationError? {
        guard signer != nil else { return nil }
        return state.withLock { state -> CoordinationError? in
            // No file at all is a fresh start (removing it is the documented fix).
            let fresh = shared.revision == 0 && shared == Shared()
            guard shared.revision < state.revision, !fresh else {
                state.revision = max(state.revision, shared.revision)
                return nil
            }
            return CoordinationError(
                "the shared session file '\(statePath)' was refused: its revision \(shared.revision) is older than "
                    + "\(state.revision), already seen (an older copy put back; replayed); remove it (rm '\(statePath)')"
            )
        }
    }

    /// The most a state file may hold: a few tokens and numbers (a larger one is refused unread).
    static let maxStateBytes = 1 << 20

    /// Reads the state file, refusing one that is not private to this user (another user could
    /// read the tokens in it, or plant a session) and one whose values are out of range.
    static func read(_ path: String, signer: SharedStateSigner? = nil) -> Result<Shared?, CoordinationError> {
        // Never through a link, never waiting on a FIFO (O_NONBLOCK), a regular file checked with
        // fstat before a byte is read: SafeFile's open, without its link-following.
        var linkInfo = stat()
        if lstat(path, &linkInfo) == 0, linkInfo.st_mode & S_IFMT == S_IFLNK {
            return .failure(
                CoordinationError("the shared session file '\(path)' is a symbolic link; remove it (rm '\(path)')"))
        }
        let descriptor: Int32
        var info: stat
        switch SafeFile.open(path, owner: .anyone) {
        case .failure(let failure):
            if failure.missing { return .success(nil) }
            return .failure(
                CoordinationError(
                    "cannot read the shared session file '\(path)': \(failure.reason); remove it (rm '\(path)')"))
        case .success(let opened): (descriptor, info) = (opened.descriptor, opened.status)
        }
        defer { close(descriptor) }
        if let refusal = privacyProblem(path, info) { return .failure(refusal) }
        guard info.st_size <= maxStateBytes else {
            return .failure(CoordinationError("the shared session file '\(path)' is larger than 1 MiB; remove it"))
        }
        var data = Data(count: Int(info.st_size))
        let count = data.withUnsafeMutableBytes { bytes in
            bytes.baseAddress.map { Glibc.read(descriptor, $0, bytes.count) } ?? 0
        }
        guard count >= 0 else { return .failure(CoordinationError("cannot read the shared session file '\(path)'")) }
        data = data.prefix(count)
        if data.isEmpty { return .success(nil) }
        return decode(data, source: path, signer: signer)
    }

    /// Why a state or lock file may not be used: another owner, or access for group or others.
    static func privacyProblem(_ path: String, _ info: stat) -> CoordinationError? {
        if info.st_uid != geteuid() {
            return CoordinationError(
                "the shared session file '\(path)' belongs to another user (uid \(info.st_uid)); remove it, or run as its owner"
            )
        }
        if info.st_mode & 0o077 != 0 {
            let mode = String(info.st_mode & 0o777, radix: 8)
            return CoordinationError(
                "the shared session file '\(path)' is readable or writable by others (mode \(mode)); run: chmod 600 '\(path)'"
            )
        }
        return nil
    }

    /// The record in `data`; every value checked (never trapping), the source named in a refusal.
    static func decode(_ data: Data, source path: String, signer: SharedStateSigner? = nil)
        -> Result<Shared?, CoordinationError>
    {
        guard let object = try? JSONSerialization.jsonObject(with: data) as? [String: Any] else {
            return .failure(CoordinationError("the shared session file '\(path)' is malformed"))
        }
        func refuse(_ field: String) -> Result<Shared?, CoordinationError> {
            .failure(
                CoordinationError("the shared session file '\(path)' has an out-of-range '\(field)'; remove the file"))
        }
        func unsigned(_ value: Any?) -> UInt64?? {
            guard let value else { return .some(nil) }
            guard let number = value as? NSNumber, number.doubleValue.isFinite, number.doubleValue >= 0,
                number.doubleValue < 9e15
            else { return nil }
            return .some(number.uint64Value)
        }
        func milliseconds(_ value: Any?) -> Int64?? {
            guard let value else { return .some(nil) }
            guard let number = value as? NSNumber, number.doubleValue.isFinite, number.doubleValue >= 0,
                number.doubleValue <= Double(SharedCredentialsCodec.maxMilliseconds)
            else { return nil }
            return .some(number.int64Value)
        }
        var shared = Shared()
        guard let generation = unsigned(object["generation"]) else { return refuse("generation") }
        shared.generation = generation ?? 0
        guard let fence = unsigned(object["fence"]) else { return refuse("fence") }
        shared.fence = fence ?? 0
        guard let revision = unsigned(object["revision"]) else { return refuse("revision") }
        shared.revision = revision ?? 0
        guard let epoch = unsigned(object["epoch"]), epoch ?? 0 <= shared.generation else { return refuse("epoch") }
        shared.epoch = epoch ?? 0
        if let credentials = object["credentials"] {
            // Under a key the record's seal covers them (with every other field).
            switch SharedCredentialsCodec.check(object: credentials, signer: nil) {
            case .success(let value): shared.credentials = value
            case .failure(let error):
                return .failure(
                    CoordinationError("the shared session file '\(path)': \(error.reason); remove the file"))
            }
        }
        if let lease = object["lease"] {
            guard let lease = lease as? [String: Any], let fence = unsigned(lease["fence"]) ?? nil,
                let expires = milliseconds(lease["expires"]) ?? nil,
                case let holder = (lease["pid"] as? NSNumber)?.doubleValue ?? 0,
                holder.isFinite, holder >= 0, holder <= Double(Int32.max)
            else { return refuse("lease") }
            guard let asker = unsigned(lease["asker"]) else { return refuse("lease") }
            shared.lease = .init(fence: fence, holder: Int64(holder), expires: expires, asker: asker ?? 0)
        }
        guard let until = milliseconds(object["logged-out-until"]) else { return refuse("logged-out-until") }
        shared.loggedOutUntil = until
        if let failure = object["failure"] {
            guard let failure = failure as? [String: Any], let fence = unsigned(failure["fence"]) ?? nil else {
                return refuse("failure")
            }
            let reason = (failure["reason"] as? String).map { String($0.prefix(300)) }
            shared.failure = .init(fence: fence, reason: reason ?? "the refresh failed in another process")
        }
        if let refreshes = object["refreshes"] {
            guard let list = refreshes as? [Any], list.count <= 10_000 else { return refuse("refreshes") }
            var times: [Int64] = []
            for item in list {
                guard let time = milliseconds(item) ?? nil else { return refuse("refreshes") }
                times.append(time)
            }
            shared.refreshes = times
        }
        if let embargo = object["retry-after"] {
            guard let embargo = embargo as? [String: Any], let until = milliseconds(embargo["until"]) ?? nil else {
                return refuse("retry-after")
            }
            let reason = (embargo["reason"] as? String).map { String($0.prefix(300)) }
            shared.embargo = .init(until: until, reason: reason ?? "the token endpoint asked to wait")
        }
        if let loops = object["loops"] {
            guard let list = loops as? [Any], list.count <= 10_000 else { return refuse("loops") }
            for item in list {
                guard let pair = item as? [Any], pair.count == 2, let generation = unsigned(pair[0]) ?? nil,
                    let at = milliseconds(pair[1]) ?? nil
                else { return refuse("loops") }
                shared.loops.append(.init(generation: generation, at: at))
            }
        }
        guard let accepted = unsigned(object["accepted"]) else { return refuse("accepted") }
        shared.accepted = accepted ?? 0
        if let signer, let refusal = signer.check(object["seal"] as? String, "record", shared.sealFields).refusal {
            return .failure(
                CoordinationError(
                    "the shared session file '\(path)' was refused: \(refusal); remove the file (rm '\(path)')"))
        }
        return .success(shared)
    }

    static func write(_ shared: Shared, to path: String, signer: SharedStateSigner? = nil) -> CoordinationError? {
        var object: [String: Any] = ["generation": shared.generation, "fence": shared.fence]
        if shared.revision > 0 { object["revision"] = shared.revision }
        if shared.epoch > 0 { object["epoch"] = shared.epoch }
        if let credentials = shared.credentials,
            let encoded = try? JSONSerialization.jsonObject(with: Data(SharedCredentialsCodec.encode(credentials).utf8))
        {
            object["credentials"] = encoded
        }
        // One seal over every field: none can be changed, moved or rolled back alone.
        if let signer { object["seal"] = signer.seal("record", shared.sealFields) }
        if let lease = shared.lease {
            var fields: [String: Any] = ["fence": lease.fence, "pid": lease.holder, "expires": lease.expires]
            if lease.asker != 0 { fields["asker"] = lease.asker }
            object["lease"] = fields
        }
        if let until = shared.loggedOutUntil { object["logged-out-until"] = until }
        if let failure = shared.failure { object["failure"] = ["fence": failure.fence, "reason": failure.reason] }
        if !shared.refreshes.isEmpty { object["refreshes"] = shared.refreshes }
        if let embargo = shared.embargo { object["retry-after"] = ["until": embargo.until, "reason": embargo.reason] }
        if !shared.loops.isEmpty { object["loops"] = shared.loops.map { [$0.generation, $0.at] } }
        if shared.accepted > 0 { object["accepted"] = shared.accepted }
        guard let data = try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys]) else {
            return CoordinationError("cannot encode the shared session")
        }
        return replaceFile(path, with: data)
    }

    /// Writes `data` to a new temporary file next to `path` and renames it over `path`.
    ///
    /// The temporary is created exclusively (`O_EXCL`), never through a symbolic link
    /// (`O_NOFOLLOW`), mode 0600 from its first byte, under an unpredictable name in the target's
    /// own folder (issue 23: a predictable name let a planted link redirect the tokens).
    static func replaceFile(_ path: String, with data: Data) -> CoordinationError? {
        var descriptor: Int32 = -1
        var temporary = ""
        for _ in 0..<8 {
            temporary = path + ".tmp-\(getpid())-\(TemporaryNames.suffix())"
            descriptor = open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
            if descriptor >= 0 || errno != EEXIST { break }
        }
        guard descriptor >= 0 else {
            return CoordinationError(
                "cannot write the shared session file '\(path)': \(String(cString: strerror(errno)))")
        }
        _ = fchmod(descriptor, 0o600)  // whatever the umask said
        let written = data.withUnsafeBytes { bytes in Glibc.write(descriptor, bytes.baseAddress, bytes.count) }
        let synced = fsync(descriptor) == 0
        close(descriptor)
        guard written == data.count, synced, rename(temporary, path) == 0 else {
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
        shared.session(now: Date().millisecondsSince1970)
    }

    // MARK: - Watcher

    /// Re-reads the state file when it was replaced, and tells the engine what changed.
    private func watchLoop() {
        // Nothing seen yet: the first look reads the file, so a publication made between `start`
        // and this thread's first run is not missed. From here on every lease written is seen
        // (a grant and its end within one watch interval aside, which need no honouring).
        state.withLock { $0.memory.listening(since: Self.monotonicNow) }
        var identity: [Int] = [-1]
        while !state.withLock({ $0.stopped }) {
            Thread.sleep(forTimeInterval: Double(configuration.watchInterval.milliseconds()) / 1000)
            let current = Self.identity(statePath)
            guard current != identity else { continue }
            identity = current
            guard case .success(let read) = Self.read(statePath, signer: signer), let shared = read else { continue }
            if let replay = replayProblem(shared) {
                // An older copy put back (say, a logout a sign-in already ended): said, never applied.
                send(.problem(replay.reason))
                continue
            }
            var news: [SessionUpdate] = []
            var correct = false
            let pid = Int64(getpid())
            state.withLock { state in
                let seen = state.seen
                // Another process's lease is remembered, and honoured for its term should the file
                // be removed; one the record no longer holds (a publication, an end) is over.
                let now = Self.monotonicNow
                if let lease = shared.lease, lease.holder != pid, lease.fence > 0 {
                    let left = lease.expires - Date().millisecondsSince1970
                    if left > 0, lease.fence != state.memory.lease?.fence {
                        state.memory.heardGrant(
                            fence: lease.fence, generation: shared.generation, value: String(lease.fence),
                            leaseMs: left,
                            now: now)
                    }
                } else if let heard = state.memory.lease, shared.fence >= heard.fence, shared.credentials != nil {
                    state.memory.heardEnd(fence: heard.fence)
                }
                if shared.credentials != nil {
                    if state.memory.isBehind(Self.session(shared)) { correct = true }
                    state.memory.saw(Self.session(shared))
                }
                if shared.generation > seen.generation, shared.credentials != nil {
                    news.append(.credentials(Self.session(shared)))
                }
                if let until = shared.loggedOutUntil, until > (seen.loggedOutUntil ?? 0),
                    until > Date().millisecondsSince1970
                {
                    news.append(
                        .loggedOut(until: Date(milliseconds: until), reason: LogoutReason.elsewhereWithoutReason))
                }
                // A holder's token call was asked to wait (`Retry-After`): no call from here before
                // it ends (at most the longest wait the engine obeys).
                if let embargo = shared.embargo, embargo.until > (seen.embargo?.until ?? 0) {
                    let wallNow = Date().millisecondsSince1970
                    let until = min(embargo.until, wallNow + Shared.longestEmbargoMs)
                    if until > wallNow {
                        news.append(.retryAfter(until: Date(milliseconds: until), reason: embargo.reason))
                    }
                }
                if shared.generation >= seen.generation { state.seen = shared }
            }
            for update in news { send(update) }
            if correct {
                // Re-seeded with an older pair by a process that missed what this one saw: put
                // this process's newer one back (a re-seed never takes a newer session back).
                let leaseMs = configuration.lease.milliseconds()
                let seed = state.withLock { $0.memory.seed(now: Self.monotonicNow, leaseMs: leaseMs) }
                if let seed { _ = transactOnQueueBlocking { $0.reseed(seed, now: Date().millisecondsSince1970) } }
            }
            signal.bump()
        }
    }

    /// ``transactOnQueue(_:)`` from the watcher's own thread, through the queue.
    private func transactOnQueueBlocking<R>(_ body: @escaping (inout Shared) -> R) -> Result<R, CoordinationError> {
        queue.sync { transactOnQueue(body) }
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

extension FileSessionCoordinator: PendingPublications {
    package var unpublished: [String] {
        guard let pending = state.withLock({ $0.pendingLogout }), pending.until > Date().millisecondsSince1970 else {
            return []
        }
        return ["a logout until \(FileCredentialStore.rfc3339(Date(milliseconds: pending.until)))"]
    }

    /// A logout the lock file kept back is stored by the next transaction that gets the lock.
    package func flushPending(timeout: Duration) async -> [String] {
        let giveUp = ContinuousClock.now + timeout
        while !unpublished.isEmpty, ContinuousClock.now < giveUp {
            _ = await transact { _ in () }
            if unpublished.isEmpty { break }
            try? await Task.sleep(for: min(giveUp - ContinuousClock.now, .milliseconds(50)))
        }
        return unpublished
    }
}

extension FileSessionCoordinator: TrustWarning {
    /// A folder other users can write (group or others write bit, sticky or not): they can remove
    /// the lock and state files, or put their own in their place. Theirs are refused (another
    /// owner), so they can stop the fleet's coordination, never forge its session; a key does not
    /// prevent that, a private folder does, so this is said with or without `signing-key-env`.
    package var trustWarning: String? {
        // Absolute: a relative credentials path (`creds.json`) named the folder '' before.
        let folder = URL(fileURLWithPath: statePath).standardizedFileURL.deletingLastPathComponent().path
        var info = stat()
        guard stat(folder, &info) == 0, info.st_mode & 0o022 != 0 else { return nil }
        let mode = String(info.st_mode & 0o7777, radix: 8)
        return "the folder '\(folder)' of the shared session files can be written by other users (mode \(mode)): they "
            + "can remove or replace the lock and state files and stop this fleet's coordination; keep the credentials "
            + "in a folder only this user can write (chmod go-w '\(folder)')"
    }
}
