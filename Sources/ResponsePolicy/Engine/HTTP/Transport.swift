import Foundation

/// The class of a failed attempt that got no response, as `when: { error: [...] }` names it.
public enum TransportErrorClass: String, Sendable, Hashable, CaseIterable {
    /// The attempt took longer than `retry.attempt-timeout` or the transport's own limit.
    case timeout
    /// The connection was refused, reset or closed before a whole response arrived.
    case connection
    /// The host name did not resolve.
    case dns
    /// The TLS handshake or certificate check failed.
    case tls
    /// The response body was larger than the transport's limit (`max-body`), so it was not read to the end.
    case tooLarge = "too-large"
}

/// Why a transport could not produce a response.
///
/// Transports map their own errors onto these classes so that policies stay transport-neutral.
/// The message is for people; it must not contain credentials.
public struct TransportError: Error, Sendable, Hashable, CustomStringConvertible {
    /// The class a policy's `when: { error: [...] }` matches.
    public var errorClass: TransportErrorClass
    /// What happened, for people; never a credential.
    public var message: String

    /// An error of `errorClass`, saying `message`.
    public init(_ errorClass: TransportErrorClass, _ message: String = "") {
        self.errorClass = errorClass
        self.message = message
    }

    /// `CLASS error: MESSAGE` (`CLASS error` without a message).
    public var description: String {
        message.isEmpty ? "\(errorClass.rawValue) error" : "\(errorClass.rawValue) error: \(message)"
    }
}

/// Sends one request and returns one response.
///
/// The engine runs over any HTTP client through this protocol: `URLSessionTransport` in
/// production, a scripted transport in `policy simulate`, in-memory ones in tests and benchmarks.
///
/// Concurrency contract: `send` is called from many tasks at once and must be safe for that.
/// It must honour task cancellation promptly (throw `CancellationError`), since a forced logout
/// cancels requests on the wire. Any error other than `TransportError` or `CancellationError` is
/// treated as a `connection` error.
public protocol Transport: Sendable {
    /// Sends `request` and returns the response, whatever its status; throws ``TransportError``
    /// when there is none.
    func send(_ request: HTTPRequest) async throws -> HTTPResponse

    /// The transport for the engine's own calls: the refresh and logout plugins'. A transport
    /// that pools connections returns one with a pool of its own, so a token refresh never
    /// queues behind a storm of requests waiting for a connection (`URLSessionTransport` does).
    /// `self` by default.
    var sessionCallTransport: any Transport { get }

    /// How many connections this transport opens to one host at most, when it limits them:
    /// requests beyond that wait inside it, where the engine can no longer hold, re-sign or
    /// cancel them. `dispatch.max-in-flight-per-host: auto` (the default) lets exactly this many
    /// requests per host out of the engine and keeps the rest in its own queue.
    /// `URLSessionTransport` reports its configuration's `httpMaximumConnectionsPerHost`.
    /// `nil` by default: the transport does not say, and `auto` sets no limit.
    var connectionsPerHost: Int? { get }

    /// `dispatch.max-in-flight-per-host: auto`'s limit for a request to `url`, asked once per
    /// request: how many requests to that origin the transport carries at once without queueing
    /// them inside. Over HTTP/1.1 that is its connections per host; over HTTP/2, where one
    /// connection carries many requests as streams, the streams a connection carries (or `nil`,
    /// no limit). A transport that knows which protocol an origin speaks answers per origin
    /// (`CurlTransport` does, once the origin has answered). ``connectionsPerHost`` by default.
    func inFlightLimit(for url: URL) -> Int?
}

extension Transport {
    /// `self`: the same transport for the engine's own calls.
    public var sessionCallTransport: any Transport { self }
    /// `nil`: the transport does not say.
    public var connectionsPerHost: Int? { nil }
    /// ``connectionsPerHost``, whatever the origin.
    public func inFlightLimit(for url: URL) -> Int? { connectionsPerHost }
}

/// A one-shot cancellation signal for one attempt, which the engine raises on a forced logout,
/// an attempt timeout or the caller's cancellation.
///
/// A value with reference semantics: copies share one signal. (A struct around one shared
/// lock-guarded block, so that the engine's one allocation per attempt is that block.)
///
/// Concurrency contract: any thread may call ``onCancel(_:)``; the engine calls `cancel()` at
/// most once that matters (later calls do nothing). A handler registered after cancellation
/// runs at once, on the registering thread. Handlers must be quick and must not block.
///
/// Handlers are released when the attempt ends (its `send` returned or threw), whether or not
/// it was cancelled: a handler may capture the transport's per-request state, which in turn
/// holds the cancellation (to call ``responseArriving()``), and that cycle must not outlive the
/// attempt. (Before, it did: every request through a `CancellableTransport` kept its transfer,
/// about 1.7 KB, for the life of the process.)
public struct AttemptCancellation: Sendable {
    private struct State {
        var cancelled = false
        var arriving = false
        /// The attempt ended: handlers are neither kept nor run any more.
        var ended = false
        var handlers: [@Sendable () -> Void] = []
    }

    private let state = Locked(State())

    package init() {}

    /// Whether the attempt has been cancelled.
    public var isCancelled: Bool { state.withLock { $0.cancelled } }

    /// Says that the response has begun to arrive (its status and headers are in, and the
    /// transport will not follow it as a redirect). From then on a logout does not cancel the
    /// attempt: the server answered before it knew of the logout, so the response is read to its
    /// end and handled by its rule (see `logout.cancel-in-flight`). The attempt timeout and the
    /// caller's cancellation still end it. Optional for a transport: one that never calls it
    /// has every attempt on the wire cancelled by a logout, as before.
    public func responseArriving() {
        state.withLock { $0.arriving = true }
    }

    /// Whether ``responseArriving()`` was called.
    package var isArriving: Bool { state.withLock { $0.arriving } }

    /// Runs `handler` when the attempt is cancelled (at once if it already is).
    /// (After the attempt ended, `handler` is dropped: there is nothing left to cancel.)
    public func onCancel(_ handler: @escaping @Sendable () -> Void) {
        let runNow = state.withLock { state -> Bool in
            if state.ended { return false }
            if state.cancelled { return true }
            state.handlers.append(handler)
            return false
        }
        if runNow { handler() }
    }

    /// The attempt's `send` returned or threw: its handlers are released (see the type's
    /// contract), and a later ``cancel()`` runs none.
    package func attemptEnded() {
        let handlers = state.withLock { state -> [@Sendable () -> Void] in
            state.ended = true
            defer { state.handlers = [] }
            return state.handlers
        }
        // Released here, outside the lock: a handler's captures may run deinitializers.
        _ = handlers
    }

    /// Handlers registered and not yet run or released (for tests).
    package var handlerCount: Int { state.withLock { $0.handlers.count } }

    package func cancel() {
        let handlers = state.withLock { state -> [@Sendable () -> Void] in
            guard !state.cancelled else { return [] }
            state.cancelled = true
            defer { state.handlers = [] }
            return state.handlers
        }
        for handler in handlers { handler() }
    }
}

/// A transport that can be cancelled through an ``AttemptCancellation`` as well as through
/// task cancellation.
///
/// Why: the engine must be able to end an attempt from outside (a logout cancels requests on the
/// wire; an attempt timeout ends one attempt but not the request). With a plain ``Transport``
/// that takes a task per attempt, whose hand-off between threads is most of the engine's cost.
/// A transport adopting this protocol is called inline in the caller's task, and the engine
/// cancels the attempt through `cancellation`.
///
/// Why it stays public, beside task cancellation: a logout or an attempt timeout must end an
/// attempt that runs inline in its *caller's* task, which the engine cannot cancel without
/// cancelling the caller. Task cancellation remains the one path for callers; this protocol is
/// for transport authors only.
///
/// Contract: when `cancellation` is cancelled, or the calling task is (as for any
/// ``Transport``), stop promptly and throw `CancellationError`. The engine signals its own
/// cancellations (a logout, the attempt timeout) through `cancellation`; its caller's
/// cancellation reaches the transport as task cancellation only.
public protocol CancellableTransport: Transport {
    /// Sends `request` as ``Transport/send(_:)`` does, ending it promptly when `cancellation` is cancelled.
    func send(_ request: HTTPRequest, cancellation: AttemptCancellation) async throws -> HTTPResponse
}

/// The engine's own calls (refresh, logout) with a `User-Agent` of the engine's when they set
/// none, so an identity provider's logs name the client instead of libcurl.
struct UserAgentTransport: Transport {
    let base: any Transport
    let userAgent: String

    init(_ base: any Transport, userAgent: String) {
        self.base = base
        self.userAgent = userAgent
    }

    func send(_ request: HTTPRequest) async throws -> HTTPResponse {
        guard request.headers["User-Agent"] == nil, !userAgent.isEmpty else { return try await base.send(request) }
        var request = request
        request.headers.set("User-Agent", userAgent)
        return try await base.send(request)
    }
}
