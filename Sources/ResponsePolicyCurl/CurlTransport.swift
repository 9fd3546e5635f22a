import CCurl
import Foundation
import ResponsePolicy

/// A `Transport` on libcurl's multi interface: kept-alive connections and HTTP/2 multiplexing
/// for every method, bodies included.
///
/// Why beside `URLSessionTransport`: on Linux, FoundationNetworking runs libcurl underneath at
/// many times libcurl's own cost per request, reads the system CA bundle again for each new TLS
/// connection, and cannot rewind a request body when a kept-alive connection is reset as it is
/// reused (`URLSessionTransport` sends such a request again itself, on a new connection). This transport
/// drives libcurl directly: one multi handle on a thread of its own carries every request, the
/// CA store is loaded once (libcurl's CA cache), TLS sessions and DNS answers are shared, a body
/// is rewound through libcurl's seek and read callbacks when libcurl sends a request again on a
/// new connection, and the response's bytes are counted as they are decoded.
///
/// The contract is `URLSessionTransport`'s, checked by one conformance suite run against both:
/// each ``send(_:)`` is one attempt (retries, re-signing and logout are the engine's job); any
/// HTTP status is a response; failures without a response are `TransportError` with the class a
/// policy's `when: { error: [...] }` names; task cancellation and the engine's
/// `AttemptCancellation` end the transfer at once and throw `CancellationError`; messages name
/// the method and the URL without its query, fragment or user info, never a header.
///
/// ```swift
/// let transport = CurlTransport(timeout: .seconds(15))
/// let engine = PolicyEngine(policy: policy, transport: transport)
/// ```
///
/// A request is sent again by the transport itself, once, on a new connection, only when its
/// connection failed before a byte of an answer came back and the server cannot have acted on
/// it: a `GET` or `HEAD`, or a request whose body did not all go out (libcurl's count of the
/// body's bytes sent falls short of it). An HTTP/2 connection that a load balancer closes with
/// `GOAWAY` fails some requests just starting on it that way with Debian 12's libcurl, and a
/// kept-alive connection reset while a request is still being written fails its send. A request
/// whose body went out whole is never sent twice by the transport: a token call presents its
/// refresh token once. libcurl's own resend of a request that met a reset kept-alive connection
/// after it was written and before any answer stays as it is.
///
/// As libcurl does, it honours the proxy variables (`https_proxy`, `http_proxy`, `no_proxy`); it
/// stores no cookies and reads no `.netrc`, and speaks only http and https.
///
/// What it adds or changes on the wire: `Accept-Encoding` for every encoding libcurl decodes
/// (gzip, deflate, br, zstd; bodies are handed back decoded), libcurl's `Accept: */*` when the
/// request has none; no `Expect: 100-continue` and no form `Content-Type` a body did not have.
/// Response headers come back sorted by lowercased name; a field repeated by the server stays
/// repeated. Redirects are followed by the transport itself by the same rules as
/// `URLSessionTransport` (`RedirectRules`): at most 10, 301/302 turn a `POST` into a `GET`,
/// 303 any method but `HEAD`, 307/308 keep method and body; to another origin only headers that
/// cannot carry a credential go along, and no query parameter echoed from the request's own.
///
/// Memory is bounded by settings, not by the server: a body is counted after decoding as it
/// arrives and the transfer is cancelled at `maxBody` (or the request's
/// `HTTPRequest.maxResponseBytes`), a gzip bomb included; a response with more than
/// `maxHeaders` header fields is cancelled at the first one over. Both fail the attempt with
/// `TransportError(.tooLarge)`.
///
/// Concurrency contract: `send` may be called from any number of tasks at once; the transfers
/// run on the transport's own thread (`CurlLoop`), and the calling task waits on a
/// continuation that is resumed outside every lock. Releasing the transport lets its thread end
/// once the transfers in flight have ended.
public final class CurlTransport: CancellableTransport {
    /// What the loop needs from the initializer.
    struct Settings: Sendable {
        var connectionsPerHost: Int
        var streamsPerConnection: Int
        var http2: Bool
        var caFile: String?
    }

    /// The longest one ``send(_:)`` may take, from the call until the last byte of the body
    /// (redirects included). 60 seconds by default.
    package let timeout: Duration
    /// The largest response body accepted after decoding, in bytes (`max-body`); `nil` for no
    /// limit. 64 MiB by default.
    package let maxBody: Int?
    /// The most header fields a response may have: 500 by default. A response with more fails
    /// the attempt with `TransportError(.tooLarge)` as the field over the limit arrives.
    package let maxHeaders: Int
    /// The default of `maxBody`: 64 MiB.
    public static let defaultMaxBody = 64 << 20
    /// The default of `maxHeaders`: 500. Real responses carry a few dozen; a server sending
    /// thousands is broken or hostile, and each field costs memory and time.
    public static let defaultMaxHeaders = 500
    /// How many redirects one ``send(_:)`` follows before it fails with a connection error: 10.
    package static let maxRedirects = RedirectRules.maxRedirects

    private let loop: CurlLoop?
    private let settings: Settings

    /// Creates a transport and its thread.
    ///
    /// ```swift
    /// let transport = CurlTransport()                          // 60 s per attempt, 64 MiB bodies
    /// let small = CurlTransport(timeout: .seconds(10), maxBody: 1 << 20)
    /// ```
    ///
    /// - Parameters:
    ///   - timeout: The longest one attempt may take, redirects included; then ``send(_:)``
    ///     throws `TransportError(.timeout)`. A zero or negative value times out every request
    ///     at once. Defaults to 60 seconds.
    ///   - maxBody: The largest response body accepted after decoding; `nil` for no limit.
    ///     Defaults to 64 MiB.
    ///   - maxHeaders: The most header fields a response may have. Defaults to 500.
    ///   - connectionsPerHost: HTTP/1.1 connections per host that requests may use, which
    ///     `dispatch: auto` lets out at once (two more are kept for the engine's refresh and
    ///     logout calls). Defaults to 6, as URLSession's.
    ///   - http2: Whether to offer HTTP/2 over TLS (ALPN). Defaults to `true`.
    ///   - caFile: A PEM file of the certificate authorities to trust instead of the system's;
    ///     `nil` (the default) for the system's bundle.
    public init(
        timeout: Duration = .seconds(60), maxBody: Int? = CurlTransport.defaultMaxBody,
        maxHeaders: Int = CurlTransport.defaultMaxHeaders, connectionsPerHost: Int = 6, http2: Bool = true,
        caFile: String? = nil
    ) {
        self.timeout = timeout
        self.maxBody = maxBody
        self.maxHeaders = max(1, maxHeaders)
        settings = Settings(
            connectionsPerHost: max(1, connectionsPerHost), streamsPerConnection: 100, http2: http2, caFile: caFile)
        loop = CurlLoop(settings: settings)
    }

    deinit {
        loop?.shutdown()
    }

    /// The transport's own thread as a task executor, for services that want the fewest thread
    /// hops per request: code run under `withTaskExecutorPreference(transport.executor)` runs
    /// on the thread that drives libcurl, so a request is handed to libcurl and its answer
    /// handed back without waking another thread (each wake-up is a context switch, the larger
    /// part of a loopback request's cost). Only for code that never blocks: while a job runs,
    /// no transfer of this transport makes progress. `nil` when libcurl could not be set up.
    ///
    /// ```swift
    /// let response = try await withTaskExecutorPreference(transport.executor) {
    ///     try await engine.send(request)
    /// }
    /// ```
    public var executor: (any TaskExecutor)? { loop }

    /// HTTP/1.1 connections per host (6 by default): `dispatch: auto`'s limit before an origin
    /// is known to speak HTTP/2.
    public var connectionsPerHost: Int? { settings.connectionsPerHost }

    /// `dispatch: auto`'s limit for `url`'s origin: the streams one HTTP/2 connection carries
    /// (100) once the origin answered in HTTP/2, else ``connectionsPerHost``.
    public func inFlightLimit(for url: URL) -> Int? {
        loop?.speaksHTTP2(url) == true ? settings.streamsPerConnection : settings.connectionsPerHost
    }

    /// New connections opened so far (TCP, and TLS on top where the URL says https): what the
    /// benchmarks report beside the request counts.
    package var connectionsOpened: Int { loop?.connectionsOpened ?? 0 }

    /// Sends one request and returns the response, whatever its status.
    ///
    /// - Parameter request: The request; its method, headers and body are sent as they are (a
    ///   body with any method, `GET` included).
    /// - Returns: The status, headers and decoded body of the response (the last one, after the
    ///   redirects followed).
    /// - Throws: `CancellationError` when the calling task is cancelled; `TransportError` when no
    ///   complete response arrived: `.timeout` after `timeout`, `.tooLarge` for a body or a
    ///   head over the limits, `.dns`, `.tls` or `.connection` as `CurlErrors` classifies
    ///   libcurl's code, `.connection` for more than `maxRedirects` redirects.
    public func send(_ request: HTTPRequest) async throws -> HTTPResponse {
        try await perform(request, cancellation: nil)
    }

    /// ``send(_:)``, also ended by `cancellation`: the engine calls this inline in the caller's
    /// task and cancels the attempt through it (logout, attempt timeout).
    public func send(_ request: HTTPRequest, cancellation: AttemptCancellation) async throws -> HTTPResponse {
        try await perform(request, cancellation: cancellation)
    }

    private func perform(_ request: HTTPRequest, cancellation: AttemptCancellation?) async throws -> HTTPResponse {
        try Task.checkCancellation()
        // Made only for a message: parsing the URL again costs microseconds per request.
        var label: String { "\(request.method) \(RedirectRules.redacted(request.url))" }
        guard let loop else {
            throw TransportError(.connection, "\(label): libcurl could not be initialized")
        }
        let limit = request.method == "HEAD" ? nil : request.maxResponseBytes.map { min($0, maxBody ?? $0) } ?? maxBody
        let deadline = ContinuousClock.now + timeout
        var arriving: (@Sendable () -> Void)?
        if let cancellation { arriving = { cancellation.responseArriving() } }
        var current = request
        for hop in 0...Self.maxRedirects {
            let left = deadline - ContinuousClock.now
            guard left > .zero else {
                throw TransportError(.timeout, "\(label): no complete response within \(timeout)")
            }
            let transfer = CurlTransfer(
                request: current, limit: limit, maxHeaders: maxHeaders, deadline: deadline, arriving: arriving)
            let response: HTTPResponse
            do {
                response = try await run(transfer, on: loop, cancellation: cancellation)
            } catch let error as TransportError where error.errorClass == .timeout {
                throw TransportError(.timeout, "\(label): no complete response within \(timeout)")
            }
            guard let next = RedirectRules.redirect(from: current, response: response, original: request) else {
                return response
            }
            guard hop < Self.maxRedirects else { break }
            current = next
        }
        throw TransportError(.connection, "\(label): more than \(Self.maxRedirects) redirects")
    }

    private func run(
        _ transfer: CurlTransfer, on loop: CurlLoop, cancellation: AttemptCancellation?
    ) async throws -> HTTPResponse {
        // Registered first: an attempt the engine cancelled since it began (a logout, its
        // timeout) stops the transfer here, and `start` then resumes at once without sending.
        cancellation?.onCancel { if transfer.stop(throwing: CancellationError()) { loop.remove(transfer) } }
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { continuation in
                if transfer.start(continuation) { loop.add(transfer) }
            }
        } onCancel: {
            if transfer.stop(throwing: CancellationError()) { loop.remove(transfer) }
        }
    }
}

extension Duration {
    fileprivate var milliseconds: Double {
        Double(components.seconds) * 1_000 + Double(components.attoseconds) * 1e-15
    }
}
