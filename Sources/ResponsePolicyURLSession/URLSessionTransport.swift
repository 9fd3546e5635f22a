import Foundation
import ResponsePolicy
import Synchronization

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// A `Transport` that sends requests with `URLSession`.
///
/// This is the production transport: it lives in its own module so that the `ResponsePolicy` core never links
/// FoundationNetworking (and with it libcurl on Linux). Each call to ``send(_:)`` is one attempt; retries,
/// re-signing and logout are the engine's job, so the transport never retries and keeps nothing between requests
/// but pooled connections: its own session is ephemeral, without cookie storage or URL cache, because the policy
/// owns all credentials and a stored cookie would be a second, unmanaged one.
///
/// Failures that produced no response are thrown as `TransportError` with the class a policy's
/// `when: { error: [...] }` names (see `classify(_:)`); task cancellation is thrown as `CancellationError`,
/// promptly, with the request cancelled on the wire. Error messages name the method and the URL without its query,
/// fragment or user info, and never the headers, because those carry tokens.
///
/// ```swift
/// let transport = URLSessionTransport(timeout: .seconds(15))
/// guard let url = URL(string: "https://api.example.com/profile") else { return }
/// let response = try await transport.send(HTTPRequest(url: url, headers: ["Accept": "application/json"]))
/// print(response.status)
/// ```
///
/// What `URLSession` does on its own stays as it is, except redirects and body size: it decodes compressed
/// bodies, adds `User-Agent`, `Accept-Encoding` and `Accept-Language` where the request has none (and on Linux
/// `Content-Type: application/x-www-form-urlencoded` to a body without one), and picks the order of header
/// fields on the wire. It joins repeated fields of one name with commas (equivalent by RFC 9110 §5.3), and hands
/// response headers back as a dictionary, so ``send(_:)`` returns them sorted by lowercased name, for determinism.
///
/// Redirects are followed by the transport itself, as the request's `HTTPRequest/redirects` says (at most
/// `maxRedirects`): 301, 302 and 303 turn a `POST` into a `GET` without body (303 any method but `HEAD`), 307
/// and 308 keep the method and body. When a redirect leads to another origin (scheme, host or port; an https →
/// http downgrade included) every header except `Accept`, `Accept-Language`, `Content-Language`, `Content-Type`
/// and `User-Agent` is dropped, and so is every query parameter the `Location` repeats from the request's own
/// query, so no `Authorization`, authorizer header or query token, cookie or API key reaches another
/// server. Bodies are read as they arrive and capped at `maxBody` (and the request's
/// `HTTPRequest.maxResponseBytes`): a larger one fails the attempt with `TransportError(.tooLarge)`, which a
/// policy matches as `when: { error: [too-large] }`.
public final class URLSessionTransport: CancellableTransport {
    /// The longest one ``send(_:)`` may take, from the call until the last byte of the body.
    ///
    /// Under a ``PolicyEngine`` this is only an outer bound: the policy's `retry.attempt-timeout`
    /// governs each attempt. Set it above the longest `attempt-timeout` of the policies you run
    /// (`policy fetch` does), or attempts are cut short of what `policy explain` promises.
    package let timeout: Duration
    /// The largest response body accepted, in bytes (`max-body`); `nil` for no limit. 64 MiB by default.
    package let maxBody: Int?
    /// How many redirects one ``send(_:)`` follows before it fails with a connection error: 10.
    package static let maxRedirects = RedirectRules.maxRedirects
    /// The default of `maxBody`: 64 MiB.
    public static let defaultMaxBody = 64 << 20
    /// The most header fields a response may have (distinct names); more fail the attempt with
    /// `TransportError(.tooLarge)`. 500 by default.
    package let maxHeaders: Int
    /// The default of `maxHeaders`: 500. Real responses carry a few dozen.
    public static let defaultMaxHeaders = 500

    private let session: URLSession
    /// The calls' timeouts: one Dispatch timer and a heap of deadlines (see `TimerService`).
    private let timers = TimerService(clock: SystemPolicyClock(), executor: nil)
    private let delegate: SessionDelegate

    /// The transport for the engine's refresh and logout calls, made on first use: a session of
    /// its own (the same configuration), so those calls never wait for a connection behind the
    /// requests already queued in this one.
    private let control = Locked<URLSessionTransport?>(nil)
    private let isControl: Bool
    /// How a request with a body goes out (see `BodyMode`). The others are kept for the
    /// measurement in `KeepAliveResetTests`.
    let bodyMode: BodyMode

    /// How a request with a body goes out.
    ///
    /// Why not simply `httpBody` on a kept-alive connection on Linux: when libcurl sends a request
    /// on an idle connection that the server resets at that moment (gunicorn's keep-alive
    /// timeout), it sends the request again on a new connection. FoundationNetworking cannot
    /// rewind an `httpBody` and says it did, so the second try carries the headers, the
    /// Content-Length and none of the body, and stalls until the timeout (issue 20: a token POST
    /// lost its body and logged the session out). A stream body it can rewind, but it sends a
    /// stream chunked, with the Content-Length beside `Transfer-Encoding: chunked`, which RFC 9112
    /// §6.3 forbids. Until issue 33 a request with a body therefore went on a connection nobody
    /// used before, which cost a connection (over TLS a handshake) per request with a body.
    ///
    /// What the transport does instead on Linux (`keptAlive`): the body goes as `httpBody` on the
    /// shared, kept-alive connections, and the one moment FoundationNetworking loses it is
    /// watched. libcurl rewinds a body only to send it again, and FoundationNetworking asks the
    /// task's delegate for a new body stream when it does (for an `httpBody` too, though it then
    /// cannot use one). That question is the signal: the transport answers it with no stream,
    /// stops that try (its short request is cut off with its connection when FoundationNetworking
    /// cancels the task; a server waits for the body its Content-Length promised until then, and
    /// never takes it for whole) and sends the request again itself, whole, on a connection of
    /// its own. Sending it again is as safe as what libcurl was doing: libcurl re-sends only a
    /// request that went out on a reused connection and got not one byte back. A reused connection that fails while
    /// the request is still being written (the server's reset arrived first) fails without a
    /// libcurl retry and without a rewind; the transport sends those again the same way, because
    /// the body did not reach the server whole (see `DataTaskCall.resendable`). Apple's URLSession
    /// rewinds bodies correctly: there, bodies simply use the kept-alive connections (`data`).
    /// `ResponsePolicyCurl`'s `CurlTransport` rewinds bodies itself.
    enum BodyMode: Sendable {
        /// `httpBody` on the shared, kept-alive connections; a try whose body FoundationNetworking
        /// lost is sent again on a connection of its own. The default on Linux.
        case keptAlive
        /// A session of its own, `Connection: close`: a new connection per request with a body.
        /// What the transport did on Linux before issue 33; kept for the measurement.
        case freshConnection
        /// `httpBody` on the shared, kept-alive connections. The default on Apple platforms.
        case data
        /// A rewindable `httpBodyStream` on the shared connections (chunked on the wire).
        case stream

        /// The platform's default.
        static var platformDefault: BodyMode {
            #if canImport(FoundationNetworking)
                .keptAlive
            #else
                .data
            #endif
        }
    }

    /// Creates a transport.
    ///
    /// The timeout is enforced by the transport itself rather than left to `URLSession`, because FoundationNetworking
    /// only honours whole seconds (0.5 s times out at once, 1.5 s after one second) and only as an idle timeout.
    ///
    /// ```swift
    /// let transport = URLSessionTransport()                        // ephemeral session, 60 s per attempt
    /// let small = URLSessionTransport(timeout: .seconds(10), maxBody: 1 << 20)
    /// ```
    ///
    /// - Parameters:
    ///   - timeout: The longest one attempt may take, from the call until the whole body has arrived (redirects
    ///     included). When it passes, the data task is cancelled and ``send(_:)`` throws `TransportError(.timeout)`.
    ///     A zero or negative value times out every request at once. Defaults to 60 seconds.
    ///   - maxBody: The largest response body accepted, in bytes; `nil` for no limit. A larger body is not read
    ///     to its end: ``send(_:)`` throws `TransportError(.tooLarge)`. Defaults to 64 MiB.
    ///   - maxHeaders: The most header fields (distinct names: FoundationNetworking joins repeated
    ///     ones) a response may have; with more, ``send(_:)`` throws `TransportError(.tooLarge)`.
    ///     Defaults to 500.
    ///   - session: A session whose configuration (proxies, TLS settings, headers) to use. The transport always
    ///     sends through a session of its own made from that configuration, because it must be the session's
    ///     delegate to keep redirects and body sizes in hand; cookies and the URL cache stay off in the default
    ///     configuration. Defaults to `nil`: an ephemeral configuration with no cookie storage and no URL cache.
    public convenience init(
        timeout: Duration = .seconds(60), maxBody: Int? = URLSessionTransport.defaultMaxBody,
        maxHeaders: Int = URLSessionTransport.defaultMaxHeaders, session: URLSession? = nil
    ) {
        let configuration: URLSessionConfiguration
        if let session {
            configuration = session.configuration
        } else {
            configuration = URLSessionConfiguration.ephemeral
            configuration.httpCookieStorage = nil
            configuration.httpShouldSetCookies = false
            configuration.httpCookieAcceptPolicy = .never
            configuration.urlCache = nil
            configuration.requestCachePolicy = .reloadIgnoringLocalCacheData
        }
        self.init(
            timeout: timeout, maxBody: maxBody, maxHeaders: maxHeaders, configuration: configuration, isControl: false)
    }

    /// A transport that sends bodies as `bodyMode` says (for tests that measure the difference).
    convenience init(timeout: Duration, bodyMode: BodyMode) {
        let configuration = URLSessionConfiguration.ephemeral
        configuration.urlCache = nil
        self.init(
            timeout: timeout, maxBody: Self.defaultMaxBody, maxHeaders: Self.defaultMaxHeaders,
            configuration: configuration, isControl: false, bodyMode: bodyMode)
    }

    /// With `isControl`: the transport for session calls, on a session of its own.
    private init(
        timeout: Duration, maxBody: Int?, maxHeaders: Int, configuration: URLSessionConfiguration, isControl: Bool,
        bodyMode: BodyMode = .platformDefault
    ) {
        self.bodyMode = bodyMode
        self.maxHeaders = max(1, maxHeaders)
        self.timeout = timeout
        self.maxBody = maxBody
        self.isControl = isControl
        // Only a backstop: `send` enforces `timeout` itself, and URLSession must never fire first.
        configuration.timeoutIntervalForRequest = Self.backstopInterval(for: timeout)
        configuration.timeoutIntervalForResource = Self.backstopInterval(for: timeout)
        delegate = SessionDelegate()
        self.session = URLSession(configuration: configuration, delegate: delegate, delegateQueue: nil)

    }

    deinit {
        session.finishTasksAndInvalidate()
    }

    /// A transport with a session of its own (the same configuration and timeout) for the
    /// engine's refresh and logout calls.
    public var sessionCallTransport: any Transport {
        if isControl { return self }
        let (configuration, timeout, maxBody, maxHeaders) = (session.configuration, timeout, maxBody, maxHeaders)
        return control.withLock { control in
            if let control { return control }
            let made = URLSessionTransport(
                timeout: timeout, maxBody: maxBody, maxHeaders: maxHeaders, configuration: configuration,
                isControl: true)
            control = made
            return made
        }
    }

    /// Calls whose timeout is armed: the calls in flight (for tests; an ended call leaves none).
    package var armedTimeouts: Int { timers.count }

    /// The session configuration's `httpMaximumConnectionsPerHost` (6 by default): requests
    /// beyond it would queue inside URLSession, so `dispatch.max-in-flight-per-host: auto` keeps
    /// them in the engine instead. The refresh and logout calls go through a session of their
    /// own (``sessionCallTransport``), so they never wait for one of these connections.
    public var connectionsPerHost: Int? {
        let count = session.configuration.httpMaximumConnectionsPerHost
        return count > 0 ? count : nil
    }

    /// `dispatch: auto`'s limit for `url`'s origin: 100 (the streams one HTTP/2 connection
    /// carries, as `CurlTransport` counts them) once the origin answered over HTTP/2 or HTTP/3,
    /// which multiplex requests on one connection; else ``connectionsPerHost``.
    ///
    /// The protocol comes from each task's metrics (`networkProtocolName`), which Apple's
    /// URLSession reports. FoundationNetworking on Linux never does (it does not call
    /// `urlSession(_:task:didFinishCollecting:)`), so there the limit stays
    /// ``connectionsPerHost``: set `dispatch.max-in-flight-per-host` for an HTTP/2 origin, or use
    /// `CurlTransport`.
    public func inFlightLimit(for url: URL) -> Int? {
        delegate.multiplexes(url) ? Self.streamsPerConnection : connectionsPerHost
    }

    /// What ``inFlightLimit(for:)`` lets out to an origin that multiplexes.
    static let streamsPerConnection = 100

    /// Notes the protocol `url`'s origin answered in, as a task's metrics name it (`h2`,
    /// `http/1.1`); what the delegate does with each task's metrics.
    func noteProtocol(_ name: String, for url: URL) {
        delegate.noteProtocol(name, for: url)
    }

    /// Sends one request and returns the response, whatever its status.
    ///
    /// Any HTTP status, 4xx and 5xx included, is a response, not an error: judging it is the policy's job.
    ///
    /// ```swift
    /// guard let url = URL(string: "https://api.example.com/items") else { return }
    /// var request = HTTPRequest(method: "POST", url: url)
    /// request.headers.set("Content-Type", "application/json")
    /// request.body = Data(#"{"name":"x"}"#.utf8)
    /// let response = try await transport.send(request)
    /// ```
    ///
    /// - Parameter request: The request; its method, headers and body are sent as they are. A `GET` request must
    ///   not have a non-empty body, which `URLSession` refuses to send.
    /// - Returns: The status, headers and body of the response (the last one, after the redirects followed).
    /// - Throws: `CancellationError` when the calling task is cancelled (the data task is cancelled too);
    ///   `TransportError` when no complete response arrived: `.timeout` after `timeout`, `.tooLarge` for a body
    ///   over the limit, otherwise the class `classify(_:)` gives the `URLError`, or `.connection` for errors it
    ///   leaves unclassified, for more than `maxRedirects` redirects and for a `GET` request with a body.
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
        let label = "\(request.method) \(Self.redacted(request.url))"
        if request.method == "GET", let body = request.body, !body.isEmpty {
            // FoundationNetworking (like Darwin's URLSession) refuses this with a misleading
            // `dataLengthExceedsMaximum` and a log line; say what is wrong instead.
            throw TransportError(.connection, "\(label): URLSession cannot send a GET request with a body")
        }
        // A HEAD answer has no body, whatever its Content-Length announces.
        let limit = request.method == "HEAD" ? nil : request.maxResponseBytes.map { min($0, maxBody ?? $0) } ?? maxBody
        var arriving: (@Sendable () -> Void)?
        if let cancellation { arriving = { cancellation.responseArriving() } }
        let slot = CallSlot(arriving: arriving)
        cancellation?.onCancel { slot.stop(throwing: CancellationError()) }
        let timeout = timeout
        // A node in one heap for every transport's calls, removed when the call ends. (Before, a
        // task sleeping out the timeout: a task and a Dispatch timer per call, and the timer with
        // its task's memory lived on for the whole timeout after the call had ended, about 1 KB
        // per request for a minute.)
        let timer = timers.schedule(at: timers.now + timeout) {
            slot.stop(throwing: TransportError(.timeout, "\(label): no complete response within \(timeout)"))
        }
        defer { timers.cancel(timer) }
        var current = request
        for hop in 0...Self.maxRedirects {
            let response = try await once(current, limit: limit, slot: slot)
            guard let next = RedirectRules.redirect(from: current, response: response, original: request) else {
                return response
            }
            guard hop < Self.maxRedirects else { break }
            current = next
        }
        throw TransportError(.connection, "\(label): more than \(Self.maxRedirects) redirects")
    }

    /// One exchange on the wire, without following redirects: on the shared connections, and
    /// again on a connection of its own when FoundationNetworking lost the body on the way (see
    /// `BodyMode.keptAlive`).
    private func once(_ request: HTTPRequest, limit: Int?, slot: CallSlot) async throws -> HTTPResponse {
        let hasBody = !(request.body?.isEmpty ?? true)
        switch bodyMode {
        case .freshConnection where hasBody:
            return try await exchange(request, limit: limit, slot: slot, fresh: true)
        case .keptAlive where hasBody:
            do {
                return try await exchange(request, limit: limit, slot: slot, fresh: false)
            } catch is BodyNotDelivered {
                resentBodies.add(1, ordering: .relaxed)
                return try await exchange(request, limit: limit, slot: slot, fresh: true)
            }
        case .keptAlive, .freshConnection, .data, .stream:
            return try await exchange(request, limit: limit, slot: slot, fresh: false)
        }
    }

    /// How many requests with a body this transport sent again on a connection of their own
    /// because FoundationNetworking lost the body on a reused connection (for tests and the bench).
    let resentBodies = Atomic<Int>(0)

    /// One try on the wire: on the shared session, or with `fresh` on a session made for it alone
    /// (libcurl keeps its connections per session), asking the server to close after.
    private func exchange(_ request: HTTPRequest, limit: Int?, slot: CallSlot, fresh: Bool) async throws -> HTTPResponse
    {
        var urlRequest = makeURLRequest(request)
        let call = DataTaskCall(
            label: "\(request.method) \(Self.redacted(request.url))", url: request.url, limit: limit,
            maxHeaders: maxHeaders, arriving: slot.arriving,
            body: urlRequest.httpBodyStream == nil ? nil : request.body,
            resendable: !fresh && bodyMode == .keptAlive && !(urlRequest.httpBody?.isEmpty ?? true))
        let session: URLSession
        let delegate: SessionDelegate
        if fresh {
            delegate = SessionDelegate()
            session = URLSession(configuration: self.session.configuration, delegate: delegate, delegateQueue: nil)
            urlRequest.setValue("close", forHTTPHeaderField: "Connection")
        } else {
            (session, delegate) = (self.session, self.delegate)
        }
        // The one-off session ends with its call (it lets its task finish first).
        defer { if fresh { URLSessionCalls.queue.async { session.finishTasksAndInvalidate() } } }
        let request = urlRequest
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { continuation in
                // Off the cooperative pool: see `URLSessionCalls`.
                URLSessionCalls.queue.async {
                    let task = session.dataTask(with: request)
                    // The task's own delegate too: FoundationNetworking asks the task's delegate for a
                    // new body stream when libcurl rewinds the body (see `makeURLRequest`).
                    task.delegate = delegate
                    delegate.register(call, for: task)
                    // Attached first: an attempt the engine cancelled since it began (a logout, its
                    // timeout) stops the call here, and `start` then never resumes the task, so the
                    // request does not reach the server at all.
                    slot.attach(call)
                    call.start(task, continuation)
                }
            }
        } onCancel: {
            slot.stop(throwing: CancellationError())
        }
    }

    /// The transport error class of a `URLError`, or `nil` when the code is not a network failure of any class.
    ///
    /// The classes are those a policy names in `when: { error: [...] }`:
    ///
    /// - `.timeout`: `timedOut`, because the server or network did not answer in time; the same request may well
    ///   succeed later.
    /// - `.dns`: `cannotFindHost` and `dnsLookupFailed`, because the name did not resolve; nothing was sent.
    /// - `.tls`: `secureConnectionFailed`, every `serverCertificate…` code and every `clientCertificate…` code,
    ///   because the TLS handshake or a certificate check failed; retrying rarely helps and the cause is often
    ///   an interception proxy or a clock, which policies may want to report differently.
    /// - `.connection`: the connection could not be made or broke before a whole, parseable response arrived:
    ///   `cannotConnectToHost` (refused), `networkConnectionLost` (reset or closed mid-response),
    ///   `notConnectedToInternet`, `badServerResponse`, `cannotParseResponse`, `zeroByteResource`,
    ///   `resourceUnavailable`, `cannotDecodeRawData` and `cannotDecodeContentData` (body garbled in transit),
    ///   `dataLengthExceedsMaximum`, `httpTooManyRedirects`, `redirectToNonExistentLocation`, `cannotLoadFromNetwork`,
    ///   `internationalRoamingOff`, `callIsActive`, `dataNotAllowed` (the device refused to use the network),
    ///   `backgroundSessionWasDisconnected`, and `unknown`, because FoundationNetworking reports the libcurl failures
    ///   it has no code for that way; a response cut short ("transfer closed with N bytes remaining") is one.
    /// - `.tls` for `unknown` too when its description (libcurl's message) speaks of SSL, TLS or a certificate:
    ///   on Linux, libcurl's TLS failures, bad certificates included, arrive as `unknown`, not as the codes above.
    /// - `nil`: `cancelled`, which is cancellation rather than a failure; and codes that mean the request itself
    ///   cannot be sent or needs the app (`badURL`, `unsupportedURL`, `userAuthenticationRequired`,
    ///   `userCancelledAuthentication`, file errors, …), which no network retry fixes. ``send(_:)`` reports these
    ///   as `.connection`, the `Transport` catch-all, except `cancelled` caused by task cancellation, which it
    ///   throws as `CancellationError`.
    ///
    /// - Parameter error: The error a data task completed with.
    /// - Returns: The class, or `nil` as described above.
    static func classify(_ error: URLError) -> TransportErrorClass? {
        switch error.code {
        case .timedOut:
            return .timeout
        case .cannotFindHost, .dnsLookupFailed:
            return .dns
        case .secureConnectionFailed,
            .serverCertificateHasBadDate, .serverCertificateUntrusted, .serverCertificateHasUnknownRoot,
            .serverCertificateNotYetValid,
            .clientCertificateRejected, .clientCertificateRequired:
            return .tls
        case .cannotConnectToHost, .networkConnectionLost, .notConnectedToInternet,
            .badServerResponse, .cannotParseResponse, .zeroByteResource, .resourceUnavailable,
            .cannotDecodeRawData, .cannotDecodeContentData, .dataLengthExceedsMaximum,
            .httpTooManyRedirects, .redirectToNonExistentLocation, .cannotLoadFromNetwork,
            .internationalRoamingOff, .callIsActive, .dataNotAllowed,
            .backgroundSessionWasDisconnected:
            return .connection
        case .unknown:
            let description = (error.userInfo[NSLocalizedDescriptionKey] as? String ?? "").lowercased()
            let aboutTLS = ["ssl", "tls", "certificate"].contains { description.contains($0) }
            return aboutTLS ? .tls : .connection
        default:
            return nil
        }
    }

    // MARK: - Helpers

    private func makeURLRequest(_ request: HTTPRequest) -> URLRequest {
        var urlRequest = URLRequest(
            url: request.url,
            cachePolicy: .reloadIgnoringLocalCacheData,
            timeoutInterval: Self.backstopInterval(for: timeout)
        )
        urlRequest.httpMethod = request.method
        urlRequest.httpShouldHandleCookies = false
        for field in request.headers {
            urlRequest.addValue(field.value, forHTTPHeaderField: field.name)
        }
        if let body = request.body, !body.isEmpty, bodyMode == .stream {
            // Measured only (see `BodyMode.stream`).
            urlRequest.httpBodyStream = InputStream(data: body)
            if request.headers["Content-Length"] == nil {
                urlRequest.setValue(String(body.count), forHTTPHeaderField: "Content-Length")
            }
        } else if let body = request.body, !(body.isEmpty && request.method == "GET") {
            urlRequest.httpBody = body
        }
        return urlRequest
    }

    /// Whole seconds, at least one more than `timeout`: FoundationNetworking truncates its timeouts to seconds.
    static func backstopInterval(for timeout: Duration) -> TimeInterval {
        let seconds = Double(timeout.components.seconds) + Double(timeout.components.attoseconds) * 1e-18
        return max(1, seconds.rounded(.up)) + 1
    }

    /// `url` without query, fragment, user or password: safe to put into messages and logs.
    static func redacted(_ url: URL) -> String { RedirectRules.redacted(url) }
}

/// The data task a ``URLSessionTransport`` send is on now (one per redirect hop), so that cancellation and the
/// timeout stop whichever hop is running, and a hop that starts after them never runs.
private final class CallSlot: Sendable {
    private struct State {
        var current: DataTaskCall?
        var stopped: (any Error)?
    }

    private let state = Locked(State())
    /// Tells the engine the response has begun to arrive (``AttemptCancellation/responseArriving()``).
    let arriving: (@Sendable () -> Void)?

    init(arriving: (@Sendable () -> Void)?) {
        self.arriving = arriving
    }

    func attach(_ call: DataTaskCall) {
        let stopped: (any Error)? = state.withLock { state in
            state.current = call
            return state.stopped
        }
        if let stopped { call.stop(throwing: stopped) }
    }

    func stop(throwing error: any Error) {
        let call: DataTaskCall? = state.withLock { state in
            guard state.stopped == nil else { return nil }
            state.stopped = error
            return state.current
        }
        call?.stop(throwing: error)
    }
}

/// The session's delegate: hands each data task's events to its ``DataTaskCall`` and refuses every redirect, so
/// that the transport follows them itself, by its own rules.
///
/// Concurrency contract: URLSession calls it on the session's serial delegate queue; ``register(_:for:)`` runs on
/// any thread. The table of calls is behind a lock; that is why the `@unchecked Sendable` is safe (the class has
/// no other stored state).
private final class SessionDelegate: NSObject, URLSessionDataDelegate, @unchecked Sendable {
    private let calls = Locked<[Int: DataTaskCall]>([:])
    /// Whether each origin last answered over a protocol that multiplexes (HTTP/2, HTTP/3).
    private let protocols = OriginProtocols()

    func multiplexes(_ url: URL) -> Bool {
        protocols.multiplexes(RedirectRules.origin(url)) ?? false
    }

    func noteProtocol(_ name: String, for url: URL) {
        protocols.note(RedirectRules.origin(url), multiplexes: name == "h2" || name == "h3")
    }

    /// The task's metrics name the protocol its response came in (Apple platforms only:
    /// FoundationNetworking never calls this). Each task is one hop: the transport follows
    /// redirects itself.
    func urlSession(_ session: URLSession, task: URLSessionTask, didFinishCollecting metrics: URLSessionTaskMetrics) {
        guard let name = metrics.transactionMetrics.last?.networkProtocolName, !name.isEmpty,
            let url = task.originalRequest?.url
        else { return }
        noteProtocol(name, for: url)
    }

    func register(_ call: DataTaskCall, for task: URLSessionTask) {
        calls.withLock { $0[task.taskIdentifier] = call }
    }

    private func call(for task: URLSessionTask) -> DataTaskCall? {
        calls.withLock { $0[task.taskIdentifier] }
    }

    func urlSession(
        _ session: URLSession, task: URLSessionTask, willPerformHTTPRedirection response: HTTPURLResponse,
        newRequest request: URLRequest, completionHandler: @escaping @Sendable (URLRequest?) -> Void
    ) {
        completionHandler(nil)  // the 3xx is the response; `URLSessionTransport.perform` decides what follows
    }

    func urlSession(
        _ session: URLSession, dataTask: URLSessionDataTask, didReceive response: URLResponse,
        completionHandler: @escaping @Sendable (URLSession.ResponseDisposition) -> Void
    ) {
        let call = call(for: dataTask)
        let tooLarge =
            (call?.tooManyHeaders(response) ?? false) || (call?.announced(response.expectedContentLength) ?? false)
        if !tooLarge, let status = (response as? HTTPURLResponse)?.statusCode { call?.received(status: status) }
        completionHandler(tooLarge ? .cancel : .allow)
    }

    /// libcurl rewinds the body to send the request again (a kept-alive connection reset when it
    /// was reused). A stream body gets a fresh stream: the same bytes from the start. An
    /// `httpBody` FoundationNetworking cannot rewind (it must not be handed a stream either: it
    /// stops the process for a stream under an `httpBody`), so it gets none, and the call learns
    /// that this try's body is lost (see `BodyMode.keptAlive`). Called on FoundationNetworking's
    /// work queue, which waits for the answer: it never blocks.
    func urlSession(
        _ session: URLSession, task: URLSessionTask,
        needNewBodyStream completionHandler: @escaping @Sendable (InputStream?) -> Void
    ) {
        let call = call(for: task)
        completionHandler(call?.body.map { InputStream(data: $0) })
        if let call, call.body == nil { call.bodyRewound() }
    }

    func urlSession(_ session: URLSession, dataTask: URLSessionDataTask, didReceive data: Data) {
        call(for: dataTask)?.append(data)
    }

    func urlSession(_ session: URLSession, task: URLSessionTask, didCompleteWithError error: (any Error)?) {
        let call = calls.withLock { $0.removeValue(forKey: task.taskIdentifier) }
        call?.complete(response: task.response, error: error)
    }
}

/// One data task's way from `start` to exactly one resumption of its continuation.
///
/// Four things race to finish a call: the data task's completion, task cancellation, the timeout timer and a
/// body over the limit. Whichever comes first takes the continuation out of the state under the lock and resumes
/// it; the others then find nothing to do. Cancellation and timeout resume at once rather than waiting for
/// URLSession to report the cancelled data task, so they are prompt even when the session is busy. The body is
/// gathered here as it arrives, so a body over the limit is stopped after at most one chunk past it.
/// Where the transport calls into URLSession for a data task (make it, resume it, cancel it),
/// never on the cooperative pool nor on a session's delegate queue.
///
/// FoundationNetworking on Linux runs every session of the process on one serial work queue,
/// and `dataTask(with:)` and `cancel()` wait for it (`sync`). A response body that never stops
/// coming at loopback speed (a hostile or broken server) keeps that queue busy in libcurl's read
/// loop for as long as it flows: found in CI, where a 60 s endless body held the queue, a
/// delegate's `cancel()` at `max-body` waited behind it, and the two threads of the cooperative
/// pool waited in `dataTask(with:)`, which stopped every task of the process (the engine's
/// timers, other transports) for the whole 60 s. Here only this queue waits: the caller has its
/// answer (too large, timed out, cancelled) at once, and the rest of the process runs on.
enum URLSessionCalls {
    static let queue = DispatchQueue(label: "ResponsePolicyURLSession.calls")
}

private final class DataTaskCall: Sendable {
    private enum State {
        /// `start` has not run yet.
        case idle
        /// Stopped before `start`: `start` must not resume the data task and throws this instead.
        case stopped(any Error)
        case running(URLSessionDataTask, CheckedContinuation<HTTPResponse, any Error>, Data)
        case finished
    }

    private let state = Locked<State>(.idle)
    /// `METHOD url` with the URL redacted, for messages.
    private let label: String
    private let url: URL
    private let limit: Int?
    private let arriving: (@Sendable () -> Void)?
    /// The request body sent as a stream, for a rewind (see `SessionDelegate`).
    let body: Data?
    private let maxHeaders: Int
    /// Whether a try whose `httpBody` did not reach the server whole ends with
    /// `BodyNotDelivered`, for the transport to send the request again (`BodyMode.keptAlive`).
    /// Only a non-empty body: an empty one cannot be lost.
    private let resendable: Bool

    init(
        label: String, url: URL, limit: Int?, maxHeaders: Int, arriving: (@Sendable () -> Void)?, body: Data?,
        resendable: Bool
    ) {
        self.label = label
        self.url = url
        self.limit = limit
        self.maxHeaders = maxHeaders
        self.arriving = arriving
        self.body = body
        self.resendable = resendable
    }

    /// libcurl is sending the request again on a new connection, and FoundationNetworking could
    /// not rewind the `httpBody`: that try goes out without its body. A resendable call ends here,
    /// its data task is cancelled (the short request is cut off with its connection), and the
    /// transport sends the request again.
    func bodyRewound() {
        if resendable { stop(throwing: BodyNotDelivered()) }
    }

    /// Whether the response's head has more fields than the limit (FoundationNetworking hands
    /// them over joined by name).
    func tooManyHeaders(_ response: URLResponse) -> Bool {
        guard let fields = (response as? HTTPURLResponse)?.allHeaderFields, fields.count > maxHeaders else {
            return false
        }
        let message = "\(label): the response has more than \(maxHeaders) header fields (max-headers)"
        stop(throwing: TransportError(.tooLarge, message))
        return true
    }

    /// The status and headers are in: unless the transport will follow it as a redirect, the
    /// response is arriving, and a logout leaves it to finish.
    func received(status: Int) {
        if ![301, 302, 303, 307, 308].contains(status) { arriving?() }
    }

    func start(_ task: URLSessionDataTask, _ continuation: CheckedContinuation<HTTPResponse, any Error>) {
        let early: (any Error)? = state.withLock { state in
            switch state {
            case .idle:
                state = .running(task, continuation, Data())
                return nil
            case .stopped(let error):
                state = .finished
                return error
            case .running, .finished:
                preconditionFailure("DataTaskCall started twice")
            }
        }
        if let early {
            continuation.resume(throwing: early)
            task.cancel()  // never resumed; cancelling lets the session forget it (already on `URLSessionCalls.queue`)
        } else {
            // If `stop` ran since the lock was released, the task is already cancelled and `resume` does nothing.
            task.resume()
        }
    }

    /// Ends the call with `error` (cancellation, timeout, too large) and cancels the data task, unless it already
    /// ended.
    func stop(throwing error: any Error) {
        let running: (URLSessionDataTask, CheckedContinuation<HTTPResponse, any Error>)? = state.withLock { state in
            switch state {
            case .idle:
                state = .stopped(error)
                return nil
            case .running(let task, let continuation, _):
                state = .finished
                return (task, continuation)
            case .stopped, .finished:
                return nil
            }
        }
        guard let (task, continuation) = running else { return }
        // The caller first: the cancel may wait long for FoundationNetworking (`URLSessionCalls`).
        continuation.resume(throwing: error)
        URLSessionCalls.queue.async { task.cancel() }
    }

    private var tooLarge: TransportError {
        TransportError(
            .tooLarge, "\(label): the response body is larger than \(limit.map(byteCount) ?? "the limit") (max-body)")
    }

    /// The response's announced length; a length over the limit ends the call. Returns whether it did.
    func announced(_ length: Int64) -> Bool {
        guard let limit, length > Int64(limit) else { return false }
        stop(throwing: tooLarge)
        return true
    }

    /// A chunk of the body; a body past the limit ends the call.
    func append(_ chunk: Data) {
        let over: Bool = state.withLock { state in
            guard case .running(let task, let continuation, var body) = state else { return false }
            if let limit, body.count + chunk.count > limit { return true }
            state = .finished  // released while appending, so `body` is not copied
            body.append(chunk)
            state = .running(task, continuation, body)
            return false
        }
        if over { stop(throwing: tooLarge) }
    }

    /// The data task completed: resumes with its outcome unless `stop` got there first.
    func complete(response: URLResponse?, error: (any Error)?) {
        let finished: (CheckedContinuation<HTTPResponse, any Error>, Data)? = state.withLock { state in
            guard case .running(_, let continuation, let body) = state else { return nil }
            state = .finished
            return (continuation, body)
        }
        guard let (continuation, body) = finished else { return }
        if resendable, response == nil, let error = error as? URLError, Self.failedWhileSending(error) {
            continuation.resume(throwing: BodyNotDelivered())
            return
        }
        continuation.resume(with: outcome(data: body, response: response, error: error))
    }

    /// Whether the try failed while the request was still being written (libcurl's
    /// `CURLE_SEND_ERROR`: the server's reset arrived first), which FoundationNetworking reports
    /// only in libcurl's message: "Send failure: …" on a plain connection, "… SSL_write: …" over
    /// TLS. Such a request did not reach the server whole, and libcurl does not send it again
    /// (it does when the reset comes while it waits for the answer, rewinding the body).
    static func failedWhileSending(_ error: URLError) -> Bool {
        guard error.code == .networkConnectionLost || error.code == .unknown else { return false }
        let message = error.userInfo[NSLocalizedDescriptionKey] as? String ?? ""
        return message.hasPrefix("Send failure:") || message.contains("SSL_write")
    }

    private func outcome(data: Data?, response: URLResponse?, error: (any Error)?) -> Result<HTTPResponse, any Error> {
        if let error {
            return .failure(transportError(for: error))
        }
        guard let response = response as? HTTPURLResponse else {
            return .failure(TransportError(.connection, "\(label): the response is not an HTTP response"))
        }
        var headers: [(String, String)] = []
        for (name, value) in response.allHeaderFields {
            headers.append(((name.base as? String) ?? String(describing: name), String(describing: value)))
        }
        headers.sort { $0.0.precedesIgnoringASCIICase($1.0) }
        return .success(HTTPResponse(status: response.statusCode, headers: HTTPHeaders(headers), body: data ?? Data()))
    }

    private func transportError(for error: any Error) -> TransportError {
        guard let urlError = error as? URLError else {
            // URLSession reports everything as URLError; anything else still means no response arrived.
            let nsError = error as NSError
            return TransportError(.connection, "\(label): \(nsError.domain) error \(nsError.code)")
        }
        if urlError.code == .cancelled {
            // Our own cancellations finish the call before the data task reports them, so this one came from
            // elsewhere, such as the session being invalidated.
            return TransportError(.connection, "\(label): the data task was cancelled outside the transport")
        }
        let errorClass = URLSessionTransport.classify(urlError) ?? .connection
        return TransportError(errorClass, "\(label): URLError \(urlError.code.rawValue)\(detail(of: urlError))")
    }

    /// FoundationNetworking's description (usually libcurl's message), unless it might contain the query.
    private func detail(of error: URLError) -> String {
        guard var text = error.userInfo[NSLocalizedDescriptionKey] as? String, !text.isEmpty else { return "" }
        text = text.replacingOccurrences(of: url.absoluteString, with: URLSessionTransport.redacted(url))
        for secret in [url.query(percentEncoded: true), url.query(percentEncoded: false), url.user, url.password] {
            if let secret, !secret.isEmpty, text.contains(secret) { return "" }
        }
        return ": " + text
    }
}

/// A try whose request body did not reach the server whole, on a reused connection, with
/// nothing back: the transport sends the request again (see `URLSessionTransport.BodyMode`).
private struct BodyNotDelivered: Error {}

/// `bytes` for people: `64 MiB`, `1 MiB`, `1500 bytes`.
func byteCount(_ bytes: Int) -> String {
    if bytes >= 1 << 20, bytes % (1 << 20) == 0 { return "\(bytes >> 20) MiB" }
    if bytes >= 1 << 10, bytes % (1 << 10) == 0 { return "\(bytes >> 10) KiB" }
    return "\(bytes) bytes"
}
