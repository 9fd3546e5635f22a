import Foundation

/// A coordination store in memory, shared by several engines of one program: the fleet of a test
/// or of `policy simulate`, on the clock they run on (a ``VirtualClock`` there), with the faults a
/// real store has, switched on and off by the driver: an outage (every call unavailable), and
/// lost publications.
///
/// It runs the same ``CoordinationRecord`` the file store runs, so what a test shows of a fleet
/// here is what the protocol does; only the transport is missing.
///
/// ```swift
/// let store = InMemoryCoordinationStore(clock: clock)
/// options.coordinator = store.coordinator(lease: .seconds(15))   // one per engine ("process")
/// store.isAvailable = false                                      // an outage
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
        /// The session epoch each engine has heard of, by holder: what its logouts are decided in.
        var epochs: [Int64: UInt64] = [:]

        /// `holder` has read the record: it knows its session epoch from now on.
        mutating func heard(_ record: CoordinationRecord, by holder: Int64) {
            epochs[holder] = max(epochs[holder] ?? 0, record.epoch)
        }
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
            let update: SessionUpdate = newValue ? .recovered : .problem("the in-memory store is down")
            for subscriber in subscribers { subscriber(update) }
            bump()
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
    private struct Handle: SessionCoordinator {
        let store: InMemoryCoordinationStore
        let holder: Int64
        let lease: Duration

        private var unavailable: String { "the in-memory store is down" }

        func start(local: Credentials?, updates: @escaping @Sendable (SessionUpdate) -> Void) async
            -> SharedSession?
        {
            let now = store.nowMs
            store.withState { $0.subscribers[UInt64(holder)] = updates }
            return store.transact { record, state in
                defer { state.heard(record, by: holder) }
                return record.join(local: local, now: now)
            } ?? nil
        }

        func beginRefresh(_ request: RefreshTurnRequest) async -> RefreshTurn {
            let deadline = store.clock.now + request.timeout
            let leaseMs = request.leaseLength(configured: lease).milliseconds()
            let limit = request.limit.map { (count: $0.count, perMs: $0.per.milliseconds()) }
            var awaited: UInt64?
            while true {
                let seen = store.version
                let now = store.nowMs
                let answer = store.transact { record, state -> RefreshTurn? in
                    defer { state.heard(record, by: holder) }
                    if let awaited, let outcome = record.outcome(
                        for: awaited, failedGeneration: request.failedGeneration, now: now)
                    {
                        return outcome
                    }
                    switch record.begin(
                        failedGeneration: request.failedGeneration, leaseMs: leaseMs, limit: limit, holder: holder,
                        now: now)
                    {
                    case .newer(let session): return awaited == nil ? .newer(session) : .published(session)
                    case .granted(let lease):
                        state.granted += 1
                        return .lease(lease)
                    case .limited: return .limited
                    case .wait(let fence, _):
                        awaited = fence
                        return nil
                    }
                }
                guard let answer else { return .unavailable(unavailable) }
                if let answer { return answer }
                if store.clock.now >= deadline {
                    return .failedElsewhere(
                        "another process's refresh did not finish within \(request.timeout.policyText)")
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
                    if case .published = result { state.published += 1 }
                    return result
                })
            else { return .unavailable(unavailable) }
            if case .published(let session) = result { store.broadcast(.credentials(session), except: UInt64(holder)) }
            return result
        }

        func endRefresh(_ lease: RefreshLease, failure: String?) async {
            _ = store.transact { record, _ in record.end(lease, failure: failure) }
            store.bump()
        }

        func publishLogout(until: Date, reason: String) async {
            let end = until.millisecondsSince1970
            // Decided in the epoch this engine has heard of: one decided before a sign-in it had
            // not heard of is not stored (``CoordinationRecord/logout(until:epoch:)``).
            let stored = store.transact { record, state -> Bool in
                defer { state.heard(record, by: holder) }
                return record.logout(until: end, epoch: state.epochs[holder] ?? 0)
            }
            guard stored == true else { return }
            store.broadcast(.loggedOut(until: until, reason: reason), except: UInt64(holder))
        }

        func publishSignIn(_ credentials: Credentials) async -> SharedSession? {
            guard
                let session = store.transact({ record, state -> SharedSession in
                    let session = record.signIn(credentials)
                    // Told to every engine listening, in this call (``broadcast(_:except:)``).
                    state.heard(record, by: holder)
                    for listening in state.subscribers.keys { state.heard(record, by: Int64(listening)) }
                    return session
                })
            else { return nil }
            store.broadcast(.credentials(session), except: UInt64(holder))
            return session
        }

        func stop() { store.withState { _ = $0.subscribers.removeValue(forKey: UInt64(holder)) } }
    }
}
