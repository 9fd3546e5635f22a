import Foundation

/// One HTTP request as the engine sends it.
///
/// A plain value: the engine copies it for every attempt and lets the `authorize` plugin re-sign
/// the copy, so the caller's request is never changed.
///
/// ```swift
/// let request = HTTPRequest(method: "GET", url: URL(string: "https://api.example.com/profile")!)
/// ```
public struct HTTPRequest: Sendable, Hashable {
    /// The method, upper-cased (`GET`).
    public var method: String
    /// The URL the request goes to.
    public var url: URL
    /// The header fields; the engine sets the authorization header itself.
    public var headers: HTTPHeaders
    /// The body, if any.
    public var body: Data?
    /// An identifier for events and logs; the engine assigns `r1`, `r2`, … when it is `nil`.
    public var id: String?
    /// Which redirects the transport follows for this request; ``RedirectPolicy/follow`` by default.
    /// Whatever this says, a transport never sends credentials to another origin.
    public var redirects: RedirectPolicy = .follow
    /// The largest response body this request accepts, in bytes, below the transport's own limit;
    /// `nil` (the transport's limit alone) by default. Token endpoints' answers are capped at 1 MiB.
    public var maxResponseBytes: Int?

    /// A request; `method` is upper-cased.
    public init(method: String = "GET", url: URL, headers: HTTPHeaders = [:], body: Data? = nil, id: String? = nil) {
        self.method = method.uppercased()
        self.url = url
        self.headers = headers
        self.body = body
        self.id = id
    }

    /// The URL's path, percent-decoded and without a trailing slash (as `URL.path`), `/` when it
    /// has none; what route and rule `path` globs match against.
    public var path: String {
        // `URL.path` decodes and trims on every call (about 150-200 ns, a tenth of the engine's
        // whole per-request cost). The still-encoded path is the same string when it has no `%`
        // to decode and no trailing slash to drop, and costs a quarter of that.
        let encoded = url.path(percentEncoded: true)
        let bytes = encoded.utf8
        if !bytes.contains(UInt8(ascii: "%")), bytes.count <= 1 || bytes.last != UInt8(ascii: "/") {
            return encoded.isEmpty ? "/" : encoded
        }
        let path = url.path
        return path.isEmpty ? "/" : path
    }
}

/// Which HTTP redirects (3xx with a `Location`) a transport follows for one request.
///
/// Why a choice per request: an API request may follow a redirect like any HTTP client, but a token
/// or logout endpoint that redirects is usually misconfigured or compromised, and the request
/// carries a client secret or a refresh token. So the network plugins send with ``none`` unless the
/// policy says `follow-redirects: same-origin`.
///
/// Whatever the choice, credentials never cross origins: when a redirect leads to another scheme,
/// host or port (an https → http downgrade included), every header but a few harmless ones
/// (`Accept`, `Accept-Language`, `Content-Language`, `Content-Type`, `User-Agent`) is dropped, as
/// curl without `--location-trusted`, Go's net/http and Python requests do.
public enum RedirectPolicy: String, Sendable, Hashable, CaseIterable {
    /// Follow redirects to any origin, dropping credentials when the origin changes.
    case follow
    /// Follow redirects within the request's origin only; a redirect elsewhere is returned as the response.
    case sameOrigin = "same-origin"
    /// Follow none: the 3xx response is returned as it is.
    case none
}
