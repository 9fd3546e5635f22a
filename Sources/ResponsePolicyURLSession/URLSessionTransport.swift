import Foundation
import ResponsePolicy

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// A ``Transport`` that sends requests with `URLSession`.
///
/// This is the production transport: it lives in its own module so that the `ResponsePolicy` core never links
/// FoundationNetworking (and with it libcurl on Linux). Each call to ``send(_:)`` is one attempt; retries,
/// re-signing and logout are the engine's job, so the transport never retries and keeps nothing between requests
/// but pooled connections: its own session is ephemeral, without cookie storage or URL cache, because the policy
/// owns all credentials and a stored cookie would be a second, unmanaged one.
///
/// Failures that produced no response are thrown as `TransportError` with the class a policy's
/// `when: { error: [...] }` names (see ``classify(_:)``); task cancellation is thrown as `CancellationError`,
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
/// What `URLSession` does on its own stays as it is: it follows redirects, decodes compressed bodies, adds
/// `User-Agent`, `Accept-Encoding` and `Accept-Language` where the request has none (and on Linux
/// `Content-Type: application/x-www-form-urlencoded` to a body without one), and picks the order of header
/// fields on the wire. It joins repeated fields of one name with commas (equivalent by RFC 9110 §5.3), and hands
/// response headers back as a dictionary, so ``send(_:)`` returns them sorted by lowercased name, for determinism.
public final class URLSessionTransport: CancellableTransport {
    /// The longest one ``send(_:)`` may take, from the call until the last byte of the body.
    public let timeout: Duration

    private let session: URLSession
    private let ownsSession: Bool
    /// The transport for the engine's refresh and logout calls, made on first use: a session of
    /// its own (the same configuration), so those calls never wait for a connection behind the
    /// requests already queued in this one.
    private let control = Locked<URLSessionTransport?>(nil)
    private let isControl: Bool

    /// Creates a transport.
    ///
    /// The timeout is enforced by the transport itself rather than left to `URLSession`, because FoundationNetworking
    /// only honours whole seconds (0.5 s times out at once, 1.5 s after one second) and only as an idle timeout.
    ///
    /// ```swift
    /// let transport = URLSessionTransport()                        // own ephemeral session, 60 s per attempt
    /// let shared = URLSessionTransport(timeout: .seconds(10), session: .shared)
    /// ```
    ///
    /// - Parameters:
    ///   - timeout: The longest one attempt may take, from the call until the whole body has arrived. When it passes,
    ///     the data task is cancelled and ``send(_:)`` throws `TransportError(.timeout)`. A zero or negative value
    ///     times out every request at once. Defaults to 60 seconds.
    ///   - session: The session to send with; the transport then uses its configuration (cookies, cache, proxies)
    ///     as it is and never invalidates it. Defaults to `nil`: the transport creates an ephemeral session with no
    ///     cookie storage and no URL cache, and invalidates it when the transport is released.
    public convenience init(timeout: Duration = .seconds(60), session: URLSession? = nil) {
        self.init(timeout: timeout, session: session, controlConfiguration: nil)
    }

    /// With `controlConfiguration`: the transport for session calls, on a session of its own.
    private init(timeout: Duration, session: URLSession?, controlConfiguration: URLSessionConfiguration?) {
        isControl = controlConfiguration != nil
        self.timeout = timeout
        if let controlConfiguration {
            self.session = URLSession(configuration: controlConfiguration)
            ownsSession = true
        } else if let session {
            self.session = session
            ownsSession = false
        } else {
            let configuration = URLSessionConfiguration.ephemeral
            configuration.httpCookieStorage = nil
            configuration.httpShouldSetCookies = false
            configuration.httpCookieAcceptPolicy = .never
            configuration.urlCache = nil
            configuration.requestCachePolicy = .reloadIgnoringLocalCacheData
            // Only a backstop: `send` enforces `timeout` itself, and URLSession must never fire first.
            configuration.timeoutIntervalForRequest = Self.backstopInterval(for: timeout)
            configuration.timeoutIntervalForResource = Self.backstopInterval(for: timeout)
            self.session = URLSession(configuration: configuration)
            ownsSession = true
        }
    }

    deinit {
        if ownsSession { session.finishTasksAndInvalidate() }
    }

    /// A transport with a session of its own (the same configuration and timeout) for the
    /// engine's refresh and logout calls.
    public var sessionCallTransport: any Transport {
        if isControl { return self }
        let configuration = session.configuration
        let timeout = timeout
        return control.withLock { control in
            if let control { return control }
            let made = URLSessionTransport(timeout: timeout, session: nil, controlConfiguration: configuration)
            control = made
            return made
        }
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
    /// - Returns: The status, headers and body of the response.
    /// - Throws: `CancellationError` when the calling task is cancelled (the data task is cancelled too);
    ///   `TransportError` when no complete response arrived: `.timeout` after ``timeout``, otherwise the class
    ///   ``classify(_:)`` gives the `URLError`, or `.connection` for errors it leaves unclassified and for a `GET`
    ///   request with a body.
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
        let call = DataTaskCall(label: label, url: request.url)
        cancellation?.onCancel { call.stop(throwing: CancellationError()) }
        let timeout = timeout
        let timer = Task {
            do {
                try await Task.sleep(for: timeout)
            } catch {
                return  // the call finished first
            }
            call.stop(throwing: TransportError(.timeout, "\(label): no complete response within \(timeout)"))
        }
        defer { timer.cancel() }
        let urlRequest = makeURLRequest(request)
        let session = session
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { continuation in
                let task = session.dataTask(with: urlRequest) { data, response, error in
                    call.complete(data: data, response: response, error: error)
                }
                call.start(task, continuation)
            }
        } onCancel: {
            call.stop(throwing: CancellationError())
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
        if let body = request.body, !(body.isEmpty && request.method == "GET") {
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
    static func redacted(_ url: URL) -> String {
        guard var components = URLComponents(url: url, resolvingAgainstBaseURL: true) else { return "<url>" }
        components.query = nil
        components.fragment = nil
        components.user = nil
        components.password = nil
        return components.string ?? "<url>"
    }
}

/// One data task's way from `start` to exactly one resumption of its continuation.
///
/// Three things race to finish a call: the data task's completion handler, task cancellation and the timeout
/// timer. Whichever comes first takes the continuation out of the state under the lock and resumes it; the others
/// then find nothing to do. Cancellation and timeout resume at once rather than waiting for URLSession to report
/// the cancelled data task, so they are prompt even when the session is busy.
private final class DataTaskCall: Sendable {
    private enum State {
        /// `start` has not run yet.
        case idle
        /// Stopped before `start`: `start` must not resume the data task and throws this instead.
        case stopped(any Error)
        case running(URLSessionDataTask, CheckedContinuation<HTTPResponse, any Error>)
        case finished
    }

    private let state = Locked<State>(.idle)
    /// `METHOD url` with the URL redacted, for messages.
    private let label: String
    private let url: URL

    init(label: String, url: URL) {
        self.label = label
        self.url = url
    }

    func start(_ task: URLSessionDataTask, _ continuation: CheckedContinuation<HTTPResponse, any Error>) {
        let early: (any Error)? = state.withLock { state in
            switch state {
            case .idle:
                state = .running(task, continuation)
                return nil
            case .stopped(let error):
                state = .finished
                return error
            case .running, .finished:
                preconditionFailure("DataTaskCall started twice")
            }
        }
        if let early {
            task.cancel()  // never resumed; cancelling lets the session forget it
            continuation.resume(throwing: early)
        } else {
            // If `stop` ran since the lock was released, the task is already cancelled and `resume` does nothing.
            task.resume()
        }
    }

    /// Ends the call with `error` (cancellation or timeout) and cancels the data task, unless it already ended.
    func stop(throwing error: any Error) {
        let running: (URLSessionDataTask, CheckedContinuation<HTTPResponse, any Error>)? = state.withLock { state in
            switch state {
            case .idle:
                state = .stopped(error)
                return nil
            case .running(let task, let continuation):
                state = .finished
                return (task, continuation)
            case .stopped, .finished:
                return nil
            }
        }
        guard let (task, continuation) = running else { return }
        task.cancel()
        continuation.resume(throwing: error)
    }

    /// The data task's completion handler: resumes with its outcome unless `stop` got there first.
    func complete(data: Data?, response: URLResponse?, error: (any Error)?) {
        let continuation: CheckedContinuation<HTTPResponse, any Error>? = state.withLock { state in
            guard case .running(_, let continuation) = state else { return nil }
            state = .finished
            return continuation
        }
        guard let continuation else { return }
        continuation.resume(with: outcome(data: data, response: response, error: error))
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
        headers.sort { ($0.0.lowercased(), $0.0) < ($1.0.lowercased(), $1.0) }
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
