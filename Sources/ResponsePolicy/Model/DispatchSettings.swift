/// The `dispatch:` section: how many requests the engine lets out at once to one host.
///
/// Requests beyond the limit wait in the engine, in arrival order, and are signed when they
/// leave, so they carry the token that is current then (as OkHttp's `Dispatcher` holds calls per
/// host). Why the engine and not the transport: a request queued inside the transport (URLSession
/// queues every request beyond its connections per host) can no longer be held for a refresh,
/// re-signed or cancelled, and a storm queued there delays the first refresh trigger by the
/// whole queue. So the default, `auto`, lets out as many requests per host as the transport
/// carries at once (``Transport/inFlightLimit(for:)``), and no more: over HTTP/1.1 its
/// connections per host, over HTTP/2 the streams a connection carries.
///
/// ```yaml
/// dispatch:
///   max-in-flight-per-host: auto     # the default; or a number, or unlimited
/// ```
package struct DispatchSettings: Sendable, Hashable {
    /// How many requests per host may be on the wire at once.
    package enum Limit: Sendable, Hashable, ExpressibleByIntegerLiteral, CustomStringConvertible {
        /// What the transport carries at once to the request's origin
        /// (``Transport/inFlightLimit(for:)``): over HTTP/1.1 its connections per host
        /// (`URLSessionTransport` reads its configuration's `httpMaximumConnectionsPerHost`, 6 by
        /// default; `CurlTransport` 6), over HTTP/2 the streams one connection carries
        /// (`CurlTransport`: 100, once the origin has answered in HTTP/2). A transport that does
        /// not report one is not limited: nothing queues below the engine that it could know of
        /// (the scripted server of `policy simulate`, in-memory transports in tests).
        case auto
        /// Every request goes out as soon as it is made (what the engine did before `dispatch:`).
        case unlimited
        /// At most this many per host (1 to 1,000,000).
        case perHost(Int)

        package init(integerLiteral value: Int) { self = .perHost(value) }

        /// As the policy file writes it: `auto`, `unlimited` or the number.
        package var description: String {
            switch self {
            case .auto: return "auto"
            case .unlimited: return "unlimited"
            case .perHost(let count): return String(count)
            }
        }

        /// The limit in force over a transport that reports `connectionsPerHost` (`nil`: it
        /// does not say); `nil` means no limit.
        package func resolved(connectionsPerHost: Int?) -> Int? {
            switch self {
            case .auto: return connectionsPerHost.flatMap { $0 > 0 ? $0 : nil }
            case .unlimited: return nil
            case .perHost(let count): return count
            }
        }
    }

    /// `auto` by default: the transport's own connections per host.
    package var maxInFlightPerHost: Limit

    package init(maxInFlightPerHost: Limit = .auto) {
        self.maxInFlightPerHost = maxInFlightPerHost
    }
}
