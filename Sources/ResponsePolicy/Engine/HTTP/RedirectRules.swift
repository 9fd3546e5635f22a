import Foundation

/// How a transport follows redirects, shared by every transport so they follow them by one set of
/// rules (`URLSessionTransport` and `CurlTransport` both call these; neither lets its HTTP
/// library follow a redirect by itself).
///
/// 301, 302 and 303 turn a `POST` into a `GET` without body (303 any method but `HEAD`), 307 and
/// 308 keep the method and body. When a redirect leads to another origin (scheme, host or port;
/// an https → http downgrade included) every header except those in ``headersKeptAcrossOrigins``
/// is dropped, and so is every query parameter the `Location` repeats from the request's own
/// query, so no `Authorization`, authorizer header or query token, cookie or API key reaches
/// another server.
package enum RedirectRules {
    /// How many redirects one send follows before it fails with a connection error: 10.
    package static let maxRedirects = 10

    /// The statuses that are followed as redirects.
    package static let statuses: Set<Int> = [301, 302, 303, 307, 308]

    /// The request to send next when `response` is a redirect the request's policy follows; `nil` otherwise.
    package static func redirect(from request: HTTPRequest, response: HTTPResponse, original: HTTPRequest)
        -> HTTPRequest?
    {
        guard statuses.contains(response.status), original.redirects != .none,
            let location = response.headers["Location"], !location.isEmpty,
            var target = URL(string: location, relativeTo: request.url)?.absoluteURL,
            let scheme = target.scheme?.lowercased(), scheme == "http" || scheme == "https", target.host != nil
        else { return nil }
        if !sameOrigin(target, request.url), target.user != nil || target.password != nil {
            // Credentials a server wrote into a `Location` are not sent anywhere.
            guard var components = URLComponents(url: target, resolvingAgainstBaseURL: false) else { return nil }
            components.user = nil
            components.password = nil
            guard let stripped = components.url else { return nil }
            target = stripped
        }
        if original.redirects == .sameOrigin, !sameOrigin(target, original.url) { return nil }
        if !sameOrigin(target, request.url) { target = withoutEchoedQuery(target, sent: request.url) }
        var next = request
        next.url = target
        let toGET =
            (response.status == 303 && request.method != "HEAD")
            || ((response.status == 301 || response.status == 302) && request.method == "POST")
        if toGET {
            next.method = "GET"
            next.body = nil
            next.headers.remove("Content-Type")
            next.headers.remove("Content-Length")
        }
        if !sameOrigin(target, request.url) { next.headers = headersSafeAcrossOrigins(next.headers) }
        return next
    }

    /// `target` without the query parameters the request just sent had in its own query (the same name and value,
    /// or a value of 8 characters or more under any name): a query-preserving redirect to another origin
    /// (`Location: https://elsewhere/?<our query>`) would otherwise carry a `query` authorizer's token (or an API
    /// key in the URL) there. Parameters the server added itself stay.
    package static func withoutEchoedQuery(_ target: URL, sent: URL) -> URL {
        let sentItems = (URLComponents(url: sent, resolvingAgainstBaseURL: false)?.queryItems ?? [])
            .filter { !($0.value ?? "").isEmpty }
        // A parameter repeated as it was, or a long value (a token) repeated under another name.
        let sentPairs = Set(sentItems.map { $0.name + "=" + ($0.value ?? "") })
        let sentLongValues = Set(sentItems.compactMap(\.value).filter { $0.count >= 8 })
        guard !sentItems.isEmpty, var components = URLComponents(url: target, resolvingAgainstBaseURL: false),
            let items = components.queryItems
        else { return target }
        let kept = items.filter { item in
            guard let value = item.value, !value.isEmpty else { return true }
            return !sentPairs.contains(item.name + "=" + value) && !sentLongValues.contains(value)
        }
        guard kept.count != items.count else { return target }
        components.queryItems = kept.isEmpty ? nil : kept
        return components.url ?? target
    }

    /// Whether two URLs have one origin: scheme, host and port (the scheme's default when none is written).
    package static func sameOrigin(_ a: URL, _ b: URL) -> Bool {
        origin(a) == origin(b)
    }

    /// Scheme, lowercased host and port (the scheme's default when none is written).
    package static func origin(_ url: URL) -> Origin {
        let scheme = url.scheme?.lowercased() ?? ""
        return Origin(
            scheme: scheme, host: url.host?.lowercased() ?? "", port: url.port ?? (scheme == "https" ? 443 : 80))
    }

    /// An origin as RFC 6454 defines it.
    package struct Origin: Hashable, Sendable {
        package var scheme: String
        package var host: String
        package var port: Int
    }

    /// The headers that may follow a request to another origin: none that can carry a credential.
    package static let headersKeptAcrossOrigins: Set<String> = [
        "accept", "accept-language", "content-language", "content-type", "user-agent",
    ]

    package static func headersSafeAcrossOrigins(_ headers: HTTPHeaders) -> HTTPHeaders {
        var kept = HTTPHeaders()
        for field in headers where headersKeptAcrossOrigins.contains(field.name.lowercased()) {
            kept.add(field.name, field.value)
        }
        return kept
    }

    /// `url` without query, fragment, user or password: safe to put into messages and logs.
    package static func redacted(_ url: URL) -> String {
        guard var components = URLComponents(url: url, resolvingAgainstBaseURL: true) else { return "<url>" }
        components.query = nil
        components.fragment = nil
        components.user = nil
        components.password = nil
        return components.string ?? "<url>"
    }
}
