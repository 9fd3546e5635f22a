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
}

/// Why a transport could not produce a response.
///
/// Transports map their own errors onto these classes so that policies stay transport-neutral.
/// The message is for people; it must not contain credentials.
public struct TransportError: Error, Sendable, Hashable, CustomStringConvertible {
    public var errorClass: TransportErrorClass
    public var message: String

    public init(_ errorClass: TransportErrorClass, _ message: String = "") {
        self.errorClass = errorClass
        self.message = message
    }

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
    func send(_ request: HTTPRequest) async throws -> HTTPResponse
}
