import Foundation

/// A coordination store in memory, shared by several engines of one program: the fleet of a test
/// or of `policy simulate`, on the clock they run on (a ``VirtualClock`` there), with the faults a
/// real store has, switched on and off by the driver: an outage (every call unavailable), a store
/// that forgets (``forget(_:)``: a flush, an eviction, a restart with no persistence) and the
/// subscriptions a restart drops.
///
/// It runs the same ``CoordinationRecord`` the file store runs, and each engine's handle keeps
/// the same ``CoordinationMemory`` the Redis coordinator keeps (the announcements it hears: grants,
/// ends, publications), so what a test shows of a fleet here is what the protocol does; only the
/// transport is missing (the simulator adds its pauses and client timeouts around the handles).
///
/// ```swift
/// let store = InMemoryCoordinationStore(clock: clock)
/// options.coordinator = store.coordinator(lease: .seconds(15))   // one per engine ("process")
/// store.isAvailable = false                                      // an outage
/// store.forget(.everything)                                      // FLUSHALL
/// ```
///
/// Concurrency contract: every method may be called from any task; the record lives behind one
/// lock, never held while an engine's update callback runs or a waiter resumes.
package final class InMemoryCoordinationStore: Sendable {
    fileprivate struct State {
        var record = CoordinationRecord()
        var available = true
        var subscribers: [UInt64: @Sendable (SessionUpdate) -> Void] = [:]
        var nextHolder: Int64 = 0
        var version: UInt64 = 0
        var waiters: [UInt64: CheckedContinuation<Void, Never>] = [:]
        /// Waits whose deadline passed before they registered (they must not register, or no one
        /// would ever resume them).
        var expired: Set<UInt64> = []
        var nextWaiter: UInt64 = 0
        /// Refresh turns granted, publications stored, logouts stored: what a fleet summary counts.
        var granted = 0
        var published = 0
        /// What each engine remembers of the shared session (by holder), as its own process would.
        var memories: [Int64: CoordinationMemory] = [:]

        /// `holder` has read the record: it knows its session (with its epoch) and fence from now on.
        mutating func heard(_ record: CoordinationRecord, by holder: Int64) {
            memories[holder, default: CoordinationMemory()].sawEpoch(record.epoch)
            memories[holder, default: CoordinationMemory()].sawFence(record.fence)
            if record.credentials != nil {
                memories[holder, default: CoordinationMemory()].saw(record.session(now: 0))
                memories[holder, default: CoordinationMemory()].sawStoreSession()
            }
        }

        /// A re-seed is announced: an engine listening that knows a newer pair (the re-seeding one
        /// missed it) puts it back at once, as a real process does on hearing it
        /// (``CoordinationMemory/isBehind(_:)``).
        mutating func correct(_ record: inout CoordinationRecord, leaseMs: Int64, now: Int64) {
            for key in subscribers.keys.sorted() {
                let holder = Int64(key)
                guard let memory = memories[holder], memory.listeningSince != nil,
                    memory.isBehind(record.session(now: now)), let seed = memory.seed(now: now, leaseMs: leaseMs)
                else { continue }
                record.reseed(seed, now: now)
            }
        }

        /// Every engine listening hears `change` (the store's announcements on its channel).
        mutating func announce(_ change: (inout CoordinationMemory) -> Void, except holder: Int64? = nil) {
            for listener in subscribers.keys where Int64(listener) != holder {
                let key = Int64(listener)
                guard memories[key]?.listeningSince != nil else { continue }
                change(&memories[key, default: CoordinationMemory()])
            }
        }
    }

    /// What a store forgets (``forget(_:)``).
    package enum Loss: Sendable, Equatable {
        /// Every key: FLUSHALL, `allkeys-*` eviction, a restart with no persistence.
        case everything
        /// The keys with a time to live (the cooldown, the `refresh.limit` grants): what
        /// `volatile-*` eviction takes. (The lease has a copy in the session hash, which has none,
        /// so it survives, as in Redis.)
        case volatile
    }

    private let state = Locked(State())
    let clock: any PolicyClock
    let executor: (any TaskExecutor)?

    /// - Parameters:
    ///   - clock: the clock leases expire on and waits are bounded by (the fleet's virtual clock).
    ///   - executor: where its timers run (the simulation's scheduler); the global pool by default.
    package init(clock: any PolicyClock, executor: (any TaskExecutor)? = nil) {
        self.clock = clock
        self.executor = executor
    }

    /// The record as stored now.
    var record: CoordinationRecord { state.withLock { $0.record } }
    /// Leases granted so far (each one is one call to a token endpoint).
    package var leasesGranted: Int { state.withLock { $0.granted } }

    /// Whether calls reach the store; `false` is an outage (every call answers `.unavailable`).
    package var isAvailable: Bool {
        get { state.withLock { $0.available } }
        set {
            let subscribers = state.withLock { state -> [@Sendable (SessionUpdate) -> Void] in
                guard state.available != newValue else { return [] }
                state.available = newValue
                // In the order the engines subscribed: a simulation's output must not depend on
                // a dictionary's hash seed.
                return state.subscribers.sorted { $0.key < $1.key }.map(\.value)
            }
            // An outage drops every subscription; the engines listen again when it is back.
            let now = nowMs
            state.withLock { state in
                for key in state.memories.keys {
                    state.memories[key]?.stoppedListening()
                    if newValue, state.subscribers[UInt64(key)] != nil { state.memories[key]?.listening(since: now) }
                }
            }
            let update: SessionUpdate = newValue ? .recovered : .problem("the in-memory store is down")
            for subscriber in subscribers { subscriber(update) }
            bump()
        }
    }

    /// Forgets what `loss` says, as a real store does; the engines are not told (no store tells),
    /// they find out from what they remember.
    package func forget(_ loss: Loss) {
        state.withLock { state in
            switch loss {
            case .everything: state.record = CoordinationRecord()
            case .volatile:
                state.record.loggedOutUntil = nil
                state.record.refreshes = []
                state.record.loops = []
            }
        }
        bump()
    }

    /// Every engine's subscription drops and is made again at once (a restart): what each heard
    /// before stays, but none can vouch for the last lease length any more.
    package func reconnectAll() {
        let now = nowMs
        state.withLock { state in
            for key in state.memories.keys {
                state.memories[key]?.stoppedListening()
                if state.subscribers[UInt64(key)] != nil { state.memories[key]?.listening(since: now) }
            }
        }
    }

    /// A coordinator for one engine (one "process" of the fleet).
    package func coordinator(lease: Duration = .seconds(15)) -> any SessionCoordinator {
        let holder = state.withLock { state -> Int64 in
            state.nextHolder += 1
            return state.nextHolder
        }
        return Handle(store: self, holder: holder, lease: lease)
    }

    var nowMs: Int64 { clock.date.millisecondsSince1970 }

    /// Runs `body` on the record when the store is available.
    fileprivate func transact<R>(_ body: (inout CoordinationRecord, inout State) -> R) -> R? {
        state.withLock { state -> R? in
            guard state.available else { return nil }
            var record = state.record
            defer { state.record = record }
            return body(&record, &state)
        }
    }

    fileprivate func withState<R>(_ body: (inout State) -> R) -> R { state.withLock(body) }

    func broadcast(_ update: SessionUpdate, except holder: UInt64?) {
        let subscribers = state.withLock { state in
            state.subscribers.filter { $0.key != holder }.sorted { $0.key < $1.key }.map(\.value)
        }
        for subscriber in subscribers { subscriber(update) }
        bump()
    }

    func bump() {
        let waiting = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            state.version += 1
            defer { state.waiters = [:] }
            return state.waiters.sorted { $0.key < $1.key }.map(\.value)
        }
        for waiter in waiting { waiter.resume() }
    }

    var version: UInt64 { state.withLock { $0.version } }

    /// Returns when something changed after `seen`, or at `deadline` on the store's clock.
    func wait(after seen: UInt64, until deadline: Duration) async {
        let id = state.withLock { state -> UInt64 in
            state.nextWaiter += 1
            return state.nextWaiter
        }
        let sleeper = Task(executorPreference: executor) { [clock] in
            try? await clock.sleep(until: deadline)
            let waiter = self.state.withLock { state -> CheckedContinuation<Void, Never>? in
                guard let waiter = state.waiters.removeValue(forKey: id) else {
                    // Fired before the wait registered (a deadline a moment away, a busy pool).
                    if !Task.isCancelled { state.expired.insert(id) }
                    return nil
                }
                return waiter
            }
            waiter?.resume()
        }
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let registered = state.withLock { state -> Bool in
                guard state.version == seen, !state.expired.contains(id) else { return false }
                state.waiters[id] = continuation
                return true
            }
            if !registered { continuation.resume() }
        }
        sleeper.cancel()
        state.withLock { _ = $0.expired.remove(id) }
    }

    /// One engine's view of the store.
    private struct Handle: AskingCoordinator {
        let store: InMemoryCoordinationStore
        let holder: Int64
        let lease: Duration

        private var unavailable: String { "the in-memory store is down" }

        func start(local: Credentials?, updates: @escaping @Sendable (SessionUpdate) -> Void) async
            -> SharedSession?
        {
            await start(saved: local.map { SharedSession(credentials: $0, generation: 0) }, updates: updates)
        }

        func start(saved: SharedSession?, updates: @escaping @Sendable (SessionUpdate) -> Void) async
            -> SharedSession?
        {
            let now = store.nowMs
            let leaseMs = lease.milliseconds()
            store.withState { state in
                state.subscribers[UInt64(holder)] = updates
                if let saved { state.memories[holder, default: CoordinationMemory()].saw(saved) }
                // It listens from now on (when the store is up): nothing before was heard.
                if state.available { state.memories[holder, default: CoordinationMemory()].listening(since: now) }
            }
            let (joined, announced) =
                store.transact { record, state -> (SharedSession?, SharedSession?) in
                    let seed = state.memories[holder]?.seed(now: now, leaseMs: leaseMs)
                    let before = record.generation
                    let joined = record.join(seed: seed, now: now)
                    state.correct(&record, leaseMs: leaseMs, now: now)
                    state.heard(record, by: holder)
                    // A re-seed of a store that was behind is news to the others.
                    let reseeded = joined == nil && record.credentials != nil && record.generation > before
                    if reseeded { state.announce({ $0.saw(record.session(now: now)) }, except: holder) }
                    return (joined, reseeded ? record.session(now: now) : nil)
                } ?? (nil, nil)
            if let announced { store.broadcast(.credentials(announced), except: UInt64(holder)) }
            return joined
        }

        func beginRefresh(_ request: RefreshTurnRequest) async -> RefreshTurn {
            await beginRefresh(request, asker: 0)
        }

        func beginRefresh(_ request: RefreshTurnRequest, asker: UInt64) async -> RefreshTurn {
            let deadline = store.clock.now + request.timeout
            let leaseLength = request.leaseLength(configured: lease)
            let leaseMs = leaseLength.milliseconds()
            let limit = request.limit.map { (count: $0.count, perMs: $0.per.milliseconds()) }
            var awaited: UInt64?
            var reseeds = 0
            while true {
                let seen = store.version
                let sent = store.clock.now
                let now = store.nowMs
                enum Step {
                    case turn(RefreshTurn)
                    case wait
                    case reseeded(SharedSession?)
                }
                let step = store.transact { record, state -> Step in
                    defer { state.heard(record, by: holder) }
                    if let awaited,
                        let outcome = record.outcome(
                            for: awaited, failedGeneration: request.failedGeneration, now: now)
                    {
                        return .turn(outcome)
                    }
                    let memory = state.memories[holder] ?? CoordinationMemory()
                    let held = record.lease.flatMap { $0.expires > now ? $0.fence : nil }
                    switch record.begin(
                        failedGeneration: request.failedGeneration, knows: memory.knowledge(now: now), leaseMs: leaseMs,
                        limit: limit, holder: holder, asker: asker, now: now)
                    {
                    case .newer(let session): return .turn(awaited == nil ? .newer(session) : .published(session))
                    case .granted(let granted) where granted.fencingToken == held:
                        // Its own lease again (a question it gave up on was granted).
                        var lease = granted
                        lease.term = .milliseconds(max(0, (record.lease?.expires ?? now) - now))
                        return .turn(.lease(lease))
                    case .granted(let granted):
                        state.granted += 1
                        state.memories[holder, default: CoordinationMemory()].holds(fence: granted.fencingToken)
                        state.announce(
                            {
                                $0.heardGrant(
                                    fence: granted.fencingToken, generation: granted.generation,
                                    value: String(granted.fencingToken), leaseMs: leaseMs, now: now)
                            }, except: holder)
                        var lease = granted
                        lease.term = leaseLength - (store.clock.now - sent)
                        return .turn(.lease(lease))
                    case .limited: return .turn(.limited)
                    case .embargoed(let until, let reason):
                        return .turn(.retryAfter(until: Date(milliseconds: until), reason: reason))
                    case .wait(let fence, let left):
                        awaited = fence
                        // Seen: honoured for its whole term even if the store forgets it.
                        if fence > 0 {
                            state.memories[holder, default: CoordinationMemory()].heardGrant(
                                fence: fence, generation: request.failedGeneration, value: String(fence), leaseMs: left,
                                now: now)
                        }
                        return .wait
                    case .behind:
                        // The store forgot (or holds an older session): re-seeded from what this
                        // engine knows, then asked again.
                        guard let seed = memory.seed(now: now, leaseMs: leaseMs), record.reseed(seed, now: now)
                        else { return .reseeded(nil) }
                        state.correct(&record, leaseMs: leaseMs, now: now)
                        let session = record.session(now: now)
                        state.announce({ $0.saw(session) }, except: holder)
                        return .reseeded(session)
                    }
                }
                guard let step else { return .unavailable(unavailable) }
                switch step {
                case .turn(let turn): return turn
                case .reseeded(let session):
                    reseeds += 1
                    if let session { store.broadcast(.credentials(session), except: UInt64(holder)) }
                    if reseeds > 4 { return .unavailable("the in-memory store keeps losing the session") }
                    continue
                case .wait: break
                }
                if store.clock.now >= deadline {
                    return .failedElsewhere(WaitFailure.reason(holder: awaited, timeout: request.timeout))
                }
                let leaseEnd = store.record.lease.map { Duration.milliseconds(max(0, $0.expires - now)) } ?? .zero
                await store.wait(after: seen, until: min(deadline, store.clock.now + leaseEnd + .milliseconds(1)))
                if Task.isCancelled { return .unavailable("the refresh was cancelled while it waited for its turn") }
            }
        }

        func publish(_ credentials: Credentials, with lease: RefreshLease) async -> PublishResult {
            let now = store.nowMs
            guard
                let result = store.transact({ record, state -> PublishResult in
                    defer { state.heard(record, by: holder) }
                    let result = record.publish(credentials, with: lease, now: now)
                    if case .published(let session) = result {
                        state.published += 1
                        state.memories[holder, default: CoordinationMemory()].saw(session)
                        state.announce(
                            { memory in
                                memory.saw(session)
                                memory.heardEnd(fence: lease.fencingToken)
                            }, except: holder)
                    }
                    return result
                })
            else { return .unavailable(unavailable) }
            if case .published(let session) = result { store.broadcast(.credentials(session), except: UInt64(holder)) }
            return result
        }

        func endRefresh(_ lease: RefreshLease, failure: String?) async {
            await endRefresh(lease, failure: failure, retryAfter: nil)
        }

        func endRefresh(_ lease: RefreshLease, failure: String?, retryAfter: Date?) async {
            let now = store.nowMs
            let embargo = store.transact { record, state -> CoordinationRecord.Embargo? in
                record.end(lease, failure: failure, retryAfter: retryAfter?.millisecondsSince1970, now: now)
                state.announce({ $0.heardEnd(fence: lease.fencingToken) }, except: holder)
                return retryAfter == nil ? nil : record.embargo
            }
            // The token endpoint's wait is announced: no engine calls it before it ends.
            if let embargo = embargo ?? nil, embargo.until > now {
                store.broadcast(
                    .retryAfter(until: Date(milliseconds: embargo.until), reason: embargo.reason),
                    except: UInt64(holder))
            }
            store.bump()
        }

        func noteAccepted(generation: UInt64) async {
            _ = store.transact { record, _ in record.accept(generation) }
        }

        func publishLogout(until: Date, reason: String) async {
            let epoch = store.withState { $0.memories[holder]?.epoch ?? 0 }
            await publishLogout(until: until, reason: reason, epoch: epoch)
        }

        func publishLogout(until: Date, reason: String, epoch: UInt64) async {
            let end = until.millisecondsSince1970
            // Decided in `epoch`: one decided before a sign-in (on the old session's token, or by
            // an engine that had not heard of it) is not stored (``CoordinationRecord/logout(until:epoch:)``).
            let stored = store.transact { record, state -> Bool in
                defer { state.heard(record, by: holder) }
                return record.logout(until: end, epoch: epoch)
            }
            guard stored == true else { return }
            store.broadcast(.loggedOut(until: until, reason: reason), except: UInt64(holder))
        }

        func publishSignIn(_ credentials: Credentials) async -> SharedSession? {
            guard
                let session = store.transact({ record, state -> SharedSession in
                    let floor = state.memories[holder]?.generation ?? 0
                    let session = record.signIn(credentials, after: floor)
                    // Told to every engine listening, in this call (``broadcast(_:except:)``).
                    state.heard(record, by: holder)
                    for listening in state.subscribers.keys { state.heard(record, by: Int64(listening)) }
                    return session
                })
            else { return nil }
            store.broadcast(.credentials(session), except: UInt64(holder))
            return session
        }

        func stop() {
            store.withState { state in
                _ = state.subscribers.removeValue(forKey: UInt64(holder))
                state.memories[holder]?.stoppedListening()
            }
        }
    }
}
