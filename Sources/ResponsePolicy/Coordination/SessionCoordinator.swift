import Foundation

/// Shares one session — its credentials, its refresh and its logout — between every engine that
/// uses the same session key: engines in one process, processes on one host (a lock file), or
/// processes on many machines (Redis).
///
/// Why a seam: the engine's single flight (one refresh however many requests hit an expired
/// token) stops at the process boundary. With rotating single-use refresh tokens (RFC 9700), two
/// processes refreshing at once is fatal: the second presents a refresh token the first already
/// spent, and the server revokes the family. The engine asks its coordinator before it calls the
/// refresh plugin, publishes through it what the plugin returned, and hears from it what other
/// processes did. Everything the coordinator decides reaches the engine's state machine as an
/// event; the state machine never awaits the coordinator.
///
/// The flow of one refresh:
/// ```swift
/// switch await coordinator.beginRefresh(RefreshTurnRequest(failedGeneration: g, timeout: t, limit: l)) {
/// case .newer(let session):      // someone refreshed already: retry with session.credentials
/// case .lease(let lease):        // ours to do: call the plugin, then
///     _ = await coordinator.publish(newCredentials, with: lease)   // or endRefresh(lease, failure:)
/// case .published(let session):  // another process held the lease and published while we waited
/// case .failedElsewhere(let why): // the holder's refresh failed: this one fails too, once
/// case .limited:                 // refresh.limit reached fleet-wide: a failed refresh
/// case .retryAfter(let until, let why): // the token endpoint asked a holder to wait: no call before `until`
/// case .unavailable(let why):    // the coordinator cannot help now: refresh locally, report a problem
/// }
/// ```
///
/// ## Contract
/// - **Atomic.** Granting a lease: at most one holder per key at a time, fleet-wide; each lease
///   carries a fencing token larger than every earlier one. Publishing: the credentials and a new,
///   larger generation are stored together, and only while the lease still holds (a holder whose
///   lease expired publishes nothing and gets `.leaseLost`). A logout: the cooldown's end is stored
///   before it is announced; one decided in a session epoch older than the stored one (the
///   generation of the last sign-in, which its process had not heard of) is neither stored nor
///   announced, as that sign-in already ended the session it ended.
/// - **Late or twice.** Updates may arrive late, twice, or out of order, and a process may hear of
///   its own publication. The engine ignores credentials whose generation is not newer than the
///   one it holds, and a logout whose end is not later than the cooldown it already keeps.
/// - **Unreachable.** No call waits longer than the coordinator's connect timeout for the
///   coordinator itself (waiting for another holder's publication is bounded by the request's
///   `timeout` instead). When it cannot be reached, calls answer `.unavailable` or return
///   quietly, the coordinator sends a `.problem` update, and the engine goes on locally: one
///   refresh per process, logouts local. It reconnects on its own and says so with another update.
/// - **A holder that dies** delays the others by at most the lease's length: the lease expires and
///   the next `beginRefresh` is granted one.
/// - **Hot path.** Nothing here is called for a request that triggers no refresh and no logout.
///   News from elsewhere arrives by `updates`, pushed, never polled per request.
///
/// Concurrency contract: every method may be called from any task, concurrently. `updates` is
/// called from the coordinator's own thread or task; it must be quick and must not block.
public protocol SessionCoordinator: Sendable {
    /// Starts coordinating. `local` is what this process's credential store holds. Returns the
    /// session the coordinator already shares (nil when it shares none yet: it then seeds itself
    /// from `local`, and the store becomes a cache of what it publishes). After a nil the engine
    /// does not know the generation the seed was given: a `.newer` answer to its first
    /// `beginRefresh` that holds the very credentials that failed only numbers them, and the
    /// engine asks again from that generation.
    func start(local: Credentials?, updates: @escaping @Sendable (SessionUpdate) -> Void) async -> SharedSession?

    /// Starts coordinating from what this process saved: its credentials with the generation and
    /// session epoch the fleet gave them (a credentials file keeps both, see
    /// ``FileCredentialStore``), so a restarted process never adopts, and never takes a lease
    /// for, a generation older than one it saved, and re-seeds a store that forgot (or holds an
    /// old copy put back) from its newer pair. The default calls ``start(local:updates:)`` with
    /// the credentials alone (generation 0: nothing known).
    func start(saved: SharedSession?, updates: @escaping @Sendable (SessionUpdate) -> Void) async -> SharedSession?

    /// Asks for the right to refresh, because a request signed with `failedGeneration` met a
    /// refresh trigger. Waits (bounded by `request.timeout`) while another process holds the lease.
    func beginRefresh(_ request: RefreshTurnRequest) async -> RefreshTurn

    /// Publishes what the lease's refresh produced, atomically, while the lease holds.
    func publish(_ credentials: Credentials, with lease: RefreshLease) async -> PublishResult

    /// Ends a refresh that produced nothing, releasing the lease. `failure`, when given, tells the
    /// processes waiting on this lease that the refresh failed (without any secret in it).
    func endRefresh(_ lease: RefreshLease, failure: String?) async

    /// Ends a refresh whose token call was asked to wait (`Retry-After`) until `retryAfter`: the
    /// store grants no lease before then and tells every process (``SessionUpdate/retryAfter(until:reason:)``),
    /// so no process of the fleet calls the token endpoint before the wait ends. The default calls
    /// ``endRefresh(_:failure:)`` (the wait stays in this process).
    func endRefresh(_ lease: RefreshLease, failure: String?, retryAfter: Date?) async

    /// A response accepted the token of shared `generation`: `refresh.limit` never counts that
    /// generation fleet-wide (a process that saw it refused, found out before or after, counted a
    /// loop that was none). Called once per generation, only under a policy with `refresh.limit`.
    /// The default does nothing.
    func noteAccepted(generation: UInt64) async

    /// Logs the session out everywhere until `until`.
    func publishLogout(until: Date, reason: String) async

    /// Logs the session out everywhere until `until`, decided in session `epoch`: the epoch of the
    /// credentials the refused request was signed with (``SharedSession/epoch``), whether this
    /// process signed in itself or adopted the sign-in from the fleet. A store holding a later
    /// epoch (a sign-in since) neither stores nor announces it. The default calls
    /// ``publishLogout(until:reason:)``, where the coordinator uses the latest epoch it knows.
    func publishLogout(until: Date, reason: String, epoch: UInt64) async

    /// A new sign-in replaces the session everywhere (and ends a cooldown). Returns the session as
    /// stored, with its generation.
    func publishSignIn(_ credentials: Credentials) async -> SharedSession?

    /// Stops listening; later calls answer `.unavailable`.
    func stop()
}

extension SessionCoordinator {
    /// Starts from the credentials alone (``start(local:updates:)``), for a coordinator that keeps no stamps.
    public func start(saved: SharedSession?, updates: @escaping @Sendable (SessionUpdate) -> Void) async
        -> SharedSession?
    {
        await start(local: saved?.credentials, updates: updates)
    }

    /// Publishes the logout without its epoch (``publishLogout(until:reason:)``), for a coordinator that keeps none.
    public func publishLogout(until: Date, reason: String, epoch: UInt64) async {
        await publishLogout(until: until, reason: reason)
    }

    /// Ends the turn without keeping the token endpoint's `Retry-After`
    /// (``endRefresh(_:failure:)``), for a coordinator that cannot share it: the wait then holds
    /// this process only.
    public func endRefresh(_ lease: RefreshLease, failure: String?, retryAfter: Date?) async {
        await endRefresh(lease, failure: failure)
    }

    /// Records nothing, for a coordinator that does not count `refresh.limit` across processes.
    public func noteAccepted(generation: UInt64) async {}
}

/// What a coordinator still has to publish (a pair it could not store, a logout it could not
/// announce) and the wait for it: what a process that is about to exit asks, so it leaves
/// nothing only it knows (issue 30, case 4). The built-in stores answer it; the engine adds the
/// pair it keeps itself.
package protocol PendingPublications: Sendable {
    /// What is still unpublished, each in words without a secret (`a logout until …`); empty when
    /// nothing is.
    var unpublished: [String] { get }

    /// Tries to publish what is pending, for at most `timeout`; returns what is still unpublished.
    func flushPending(timeout: Duration) async -> [String]
}

/// The askers of refresh turns whose answers were lost: a question whose client gave up after the
/// store ran it may have been granted a lease nobody knows of. Its asker id is kept, and the next
/// question of the coordinator (exactly one) asks under it, so the store hands that lease to it
/// rather than making the fleet wait out a lease nobody uses (``CoordinationRecord/begin``).
///
/// Concurrency contract: a value behind its coordinator's lock; ``take()`` hands an id out once.
package struct AbandonedAskers: Sendable {
    private var ids: [UInt64] = []

    package init() {}

    /// The id a question asks under: one abandoned, or a fresh random one.
    package mutating func take() -> UInt64 {
        ids.popLast() ?? UInt64.random(in: 1...(UInt64(1) << 53))
    }

    /// A question under `id` got no answer (its client gave up): its lease may be waiting for it.
    package mutating func abandon(_ id: UInt64) {
        ids.append(id)
        if ids.count > 4 { ids.removeFirst() }
    }
}

/// A coordinator that takes the asker of a turn (the simulator's clients, which give up on answers
/// the store ran, as a real client does, and ask again under the same id).
package protocol AskingCoordinator: SessionCoordinator {
    func beginRefresh(_ request: RefreshTurnRequest, asker: UInt64) async -> RefreshTurn
}

/// A coordinator whose store others could tamper with says so once, at start: the engine reports
/// it as a `problem` event and keeps it in `engine.problems` (issue 23: a missing signing key on a
/// remote store was only a lint warning, which a deploy never sees).
package protocol TrustWarning {
    /// Why whoever else can reach the store could forge or disturb the session, with the fix; nil
    /// when nothing is to be said.
    var trustWarning: String? { get }
}

/// A session as a coordinator shares it.
public struct SharedSession: Sendable, Equatable {
    /// The session's credentials; `nil` when it has none (never signed in, or logged out).
    public var credentials: Credentials?
    /// Grows with every publication; compares sessions across processes. Never goes backwards:
    /// a coordinator re-seeds a store that forgot from the newest generation its process knows.
    public var generation: UInt64
    /// The end of a fleet-wide logout cooldown, when one is on.
    public var loggedOutUntil: Date?
    /// The session epoch of these credentials: the generation of the sign-in they descend from
    /// (refreshes keep it; 0 before any sign-in). A logout answers the epoch of the token its
    /// request was signed with (``SessionCoordinator/publishLogout(until:reason:epoch:)``), so a
    /// refusal of the old session's token never ends the session a later sign-in started.
    public var epoch: UInt64

    /// A session as a coordinator stores it.
    public init(credentials: Credentials?, generation: UInt64, loggedOutUntil: Date? = nil, epoch: UInt64 = 0) {
        self.credentials = credentials
        self.generation = generation
        self.loggedOutUntil = loggedOutUntil
        self.epoch = epoch
    }
}

/// What a coordinator tells the engine of other processes.
public enum SessionUpdate: Sendable, Equatable {
    /// Another process published new credentials (or a sign-in).
    case credentials(SharedSession)
    /// The session was logged out somewhere: fail new requests until `until`; with
    /// `cancel-in-flight`, cancel this process's requests too.
    case loggedOut(until: Date, reason: String)
    /// Something the coordinator could not do (unreachable, a reply it did not understand); the
    /// engine reports it as a `problem` event and goes on locally.
    case problem(String)
    /// The coordinator is back after a problem.
    case recovered
    /// The token endpoint asked another process to wait (`Retry-After`) until `until`: no token
    /// call from this process before then either; requests whose `refresh.timeout` ends sooner
    /// fail with `reason` (never a logout).
    case retryAfter(until: Date, reason: String)
}

/// Why and how long a process asks to refresh.
public struct RefreshTurnRequest: Sendable, Equatable {
    /// The generation of the credentials that signed the request that was refused.
    public var failedGeneration: UInt64
    /// The most a wait for another holder may take (`refresh.timeout`).
    public var timeout: Duration
    /// `refresh.limit`, counted across every process that shares the key.
    public var limit: (count: Int, per: Duration)?

    /// A request to refresh from `failedGeneration`.
    public init(failedGeneration: UInt64, timeout: Duration, limit: (count: Int, per: Duration)?) {
        self.failedGeneration = failedGeneration
        self.timeout = timeout
        self.limit = limit
    }

    /// The lease a store grants for this request: the configured one, but never shorter than the
    /// refresh it covers (`timeout` and a tenth of it, at most a second more): a live holder must
    /// not lose its lease while its refresh is still allowed to run (issue 19: a holder that
    /// outlived its lease dropped the new pair, and the next holder presented the spent token).
    package func leaseLength(configured: Duration) -> Duration {
        max(configured, timeout + min(timeout / 10, .seconds(1)))
    }

    /// Requests are equal when their generation, timeout and limit are.
    public static func == (a: Self, b: Self) -> Bool {
        a.failedGeneration == b.failedGeneration && a.timeout == b.timeout && a.limit?.count == b.limit?.count
            && a.limit?.per == b.limit?.per
    }
}

/// The right to refresh, held by one process at a time.
///
/// A lease entitles its holder to *present* the refresh token of `generation` while its term
/// runs, and to nothing after: a holder whose grant reached it late (a pause, a freeze) or whose
/// term is too short for the token call presents nothing, and asks again. Whose pair is kept is
/// not the lease's to decide: the first publication from `generation` is stored, lapsed or not.
public struct RefreshLease: Sendable, Equatable {
    /// Larger than every earlier lease's (and than every token the granting process had seen).
    public var fencingToken: UInt64
    /// The generation the refresh starts from.
    public var generation: UInt64
    /// What was left of the lease's term when the coordinator handed it over, measured on the
    /// coordinator's own clock from the moment it *asked* (so never longer than the term the store
    /// holds); nil when the coordinator does not know (a host plugin, the local coordinator).
    /// The engine presents the refresh token only within it (issue 30).
    public var term: Duration?

    /// A lease on `generation`, fenced by `fencingToken`.
    public init(fencingToken: UInt64, generation: UInt64, term: Duration? = nil) {
        self.fencingToken = fencingToken
        self.generation = generation
        self.term = term
    }

    /// Leases are the same lease when their fencing token and generation are (the term is what
    /// was left of it when it was handed over, not part of its identity).
    public static func == (a: Self, b: Self) -> Bool {
        a.fencingToken == b.fencingToken && a.generation == b.generation
    }
}

/// The coordinator's answer to ``SessionCoordinator/beginRefresh(_:)``.
public enum RefreshTurn: Sendable, Equatable {
    /// Credentials newer than the failed ones exist: retry with them, do not refresh.
    case newer(SharedSession)
    /// This process refreshes; publish or end with the lease.
    case lease(RefreshLease)
    /// Another process refreshed while this one waited: use its credentials.
    case published(SharedSession)
    /// Another process's refresh failed while this one waited.
    case failedElsewhere(String)
    /// `refresh.limit` is used up across the fleet: treat as a failed refresh.
    case limited
    /// The token endpoint asked a holder to wait (`Retry-After`) until `until`: no lease (and no
    /// token call) before then. The engine waits for it within `refresh.timeout`, else fails the
    /// requests with `reason`; never a logout.
    case retryAfter(until: Date, reason: String)
    /// The coordinator cannot help now: refresh locally.
    case unavailable(String)
}

/// The coordinator's answer to ``SessionCoordinator/publish(_:with:)``.
public enum PublishResult: Sendable, Equatable {
    /// The credentials are stored, as this session (with its new generation).
    case published(SharedSession)
    /// The lease expired or was taken over: nothing was stored. `current` is what is stored now.
    case leaseLost(current: SharedSession?)
    /// The store could not be reached; the reason, for a `problem` event.
    case unavailable(String)
}

/// The default: coordination within one engine only, which the engine's own single flight already
/// gives. Grants every refresh at once and shares nothing.
package struct LocalSessionCoordinator: SessionCoordinator {
    private let fencing = Locked<UInt64>(0)

    package init() {}

    package func start(local: Credentials?, updates: @escaping @Sendable (SessionUpdate) -> Void) async
        -> SharedSession?
    { nil }

    package func beginRefresh(_ request: RefreshTurnRequest) async -> RefreshTurn {
        let token = fencing.withLock { value -> UInt64 in
            value += 1
            return value
        }
        return .lease(RefreshLease(fencingToken: token, generation: request.failedGeneration))
    }

    package func publish(_ credentials: Credentials, with lease: RefreshLease) async -> PublishResult {
        .published(SharedSession(credentials: credentials, generation: lease.generation + 1))
    }

    package func endRefresh(_ lease: RefreshLease, failure: String?) async {}

    package func publishLogout(until: Date, reason: String) async {}

    package func publishSignIn(_ credentials: Credentials) async -> SharedSession? { nil }

    package func stop() {}
}

/// Stands in for a coordinator the policy names but that could not be made (an unset
/// `password-env`, a URL this build cannot use) when `on-unavailable` is `wait`: every refresh
/// turn is refused with the reason, so no process of a misconfigured fleet refreshes alone with a
/// refresh token the others hold too. Requests that need a refresh fail with the reason; nobody is
/// logged out.
struct UnavailableSessionCoordinator: SessionCoordinator {
    let reason: String

    func start(local: Credentials?, updates: @escaping @Sendable (SessionUpdate) -> Void) async -> SharedSession? {
        nil
    }
    func beginRefresh(_ request: RefreshTurnRequest) async -> RefreshTurn { .unavailable(reason) }
    func publish(_ credentials: Credentials, with lease: RefreshLease) async -> PublishResult { .unavailable(reason) }
    func endRefresh(_ lease: RefreshLease, failure: String?) async {}
    func publishLogout(until: Date, reason: String) async {}
    func publishSignIn(_ credentials: Credentials) async -> SharedSession? { nil }
    func stop() {}
}

/// A coordinator whose store can be set up to forget what the fleet shares (Redis with an
/// eviction policy) says so: at start as a `problem` update, and to `policy lint --check-env`,
/// which asks ``storeSettingsWarnings()`` before a deploy (issue 30: `allkeys-lru`, a common
/// setting, dropped the session under memory pressure).
package protocol StoreSettingsCheck {
    /// Why the store's settings let it forget the coordination keys, with the fix; empty when
    /// nothing is to be said, or the store cannot be asked (unreachable, the command refused).
    /// Blocks for at most the coordinator's connect timeout, twice.
    func storeSettingsWarnings() -> [String]
}
