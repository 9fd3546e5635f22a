import Foundation

/// The `oauth2` refresh plugin: the token endpoint of RFC 6749 with one of three grants.
///
/// Why built in: most token endpoints speak exactly this, so a policy can get tokens without any
/// host code. It POSTs a form-encoded body to the token endpoint through the engine's transport,
/// which bypasses the policy's rules, so the token call is never refreshed or retried by them (the
/// engine's `refresh.timeout` bounds it instead).
///
/// Grants (`grant:`):
/// - `refresh_token` (the default, RFC 6749 §6): `grant_type=refresh_token&refresh_token=<token>`.
///   Needs stored credentials with a refresh token; a rotated refresh token replaces the old one,
///   and when the answer has none the old one is kept (§6: the server "MAY issue a new refresh token").
/// - `client_credentials` (§4.4): a service's own token. Needs no stored credentials: the first
///   request fetches a token before it goes out (one call however many requests start together),
///   and a refresh trigger or a token expiring within `refresh.ahead` fetches a new one.
/// - `password` (§4.3): `username` and `password` from the environment (`username-env`,
///   `password-env`). Like `client_credentials` it signs in when there are no credentials, and a
///   refresh trigger signs in again (the "on 401, log in again" client). The OAuth 2.0 Security
///   BCP discourages this grant; it is here for servers that still require it.
///
/// Every grant sends `scope`, `audience` (RFC 8693 / Auth0 style) and `resource` (RFC 8707) when
/// given. The client authenticates as the server asks (`client-auth:`):
/// - `client_secret_basic` (the default; RFC 6749 §2.3.1 says the server "MUST support" it):
///   `Authorization: Basic base64(form(client-id) ":" form(secret))`, with `client_id` in the body
///   too, so public clients (no secret, §2.3 / §3.2.1) work with the same plugin.
/// - `client_secret_post`: `client_id` and `client_secret` in the form body.
///
/// `client-auth-encoding: raw` sends the Basic id and secret without form-encoding them first,
/// for servers that do not decode them (see ``BasicEncoding``); `form` is the default.
///
/// The secret comes from `client-secret-env` (an environment variable) or `client-secret-file`
/// (a file such as a mounted Kubernetes secret: read when the plugin is made, one trailing newline
/// trimmed, refused when group- or world-readable). It is never written in the policy.
///
/// The request:
///
/// ```
/// POST <token-url>
/// Content-Type: application/x-www-form-urlencoded
/// Accept: application/json
/// Authorization: Basic …                                       (client_secret_basic with a secret)
///
/// grant_type=<grant>&<grant's fields>&client_id=<id>[&client_secret=…][&scope=…][&audience=…][&resource=…]
/// ```
///
/// The answer (§5.1): `access_token` (required), `token_type`, `expires_in` (seconds, becomes
/// ``Credentials/expiresAt`` on the engine clock's wall date) and `refresh_token`.
///
/// Failures throw ``RefreshFailure``: any non-2xx answer (400 `invalid_grant` is the usual "the
/// refresh token is dead", 401 `invalid_client` a wrong secret) and a 2xx answer without a usable
/// `access_token` carry the endpoint's response, so the engine can classify it with the policy's
/// rules; an unreachable endpoint carries none. Reasons name statuses and OAuth error codes, never
/// a token or the secret.
///
/// In a policy:
///
/// ```yaml
/// refresh:
///   use: oauth2
///   with:
///     token-url: https://auth.example.com/oauth/token
///     grant: client_credentials
///     client-id: billing-service
///     client-secret-file: /var/run/secrets/billing/client-secret
///     client-auth: client_secret_post      # client_secret_basic by default
///     audience: https://api.example.com
/// ```
///
/// In Swift:
///
/// ```swift
/// let plugin = OAuth2Refresh(tokenURL: tokenURL, clientID: "mobile")
/// ```
///
/// Concurrency contract: immutable and `Sendable`; the engine calls ``refresh(_:)`` at most once at
/// a time, but concurrent calls are safe. Cancelling the calling task cancels the token request
/// and ``refresh(_:)`` throws `CancellationError`.
package struct OAuth2Refresh: RefreshPlugin, CustomStringConvertible, CustomDebugStringConvertible, CustomReflectable {
    /// The grant the plugin performs.
    package enum Grant: String, Sendable, Hashable, CaseIterable {
        case refreshToken = "refresh_token"
        case clientCredentials = "client_credentials"
        case password
    }

    /// How the client authenticates to the token endpoint (RFC 7591 `token_endpoint_auth_method`).
    package enum ClientAuthentication: String, Sendable, Hashable, CaseIterable {
        case basic = "client_secret_basic"
        case post = "client_secret_post"
    }

    /// How `client_secret_basic` encodes the client id and secret before Base64
    /// (`client-auth-encoding:`).
    ///
    /// RFC 6749 §2.3.1 says to form-encode both first (`form`, the default), and servers that
    /// follow it decode them. Real servers differ: Authlib decodes with `unquote` (a space sent as
    /// `+` stays a `+`), glewlwyd does not decode at all (any reserved character fails, while
    /// `curl -u` works). `raw` sends them as they are, as `curl -u` does.
    package enum BasicEncoding: String, Sendable, Hashable, CaseIterable {
        case form
        case raw
    }

    /// The token endpoint (RFC 6749 §3.2).
    package let tokenURL: URL
    /// Sent as `client_id`.
    package let clientID: String
    /// Sent as the client's authentication when present; `nil` for a public client.
    let clientSecret: String?
    /// Sent as `scope` when present; `nil` (the scope granted before, or the server's default) by default.
    package let scope: String?
    /// `refresh_token` by default.
    package let grant: Grant
    /// `client_secret_basic` by default.
    package let clientAuthentication: ClientAuthentication
    /// `form` (RFC 6749 §2.3.1) by default.
    package var basicEncoding: BasicEncoding = .form
    /// Sent as `audience` when present.
    package let audience: String?
    /// Sent as `resource` (RFC 8707) when present.
    package let resource: String?
    /// The resource owner's credentials for the `password` grant.
    let username: String?
    let password: String?
    /// Which redirects of the token endpoint are followed: ``RedirectPolicy/none`` by default
    /// (`follow-redirects:` in the policy; `same-origin` follows those within the endpoint's origin).
    package var followRedirects: RedirectPolicy = .none

    /// Creates the plugin.
    ///
    /// ```swift
    /// let plugin = OAuth2Refresh(
    ///     tokenURL: tokenURL, clientID: "billing", grant: .clientCredentials,
    ///     clientSecret: ProcessInfo.processInfo.environment["BILLING_CLIENT_SECRET"])
    /// ```
    ///
    /// - Parameters:
    ///   - tokenURL: The token endpoint.
    ///   - clientID: The client identifier, sent as `client_id` in the body.
    ///   - grant: The grant; `.refreshToken` by default.
    ///   - clientSecret: The client secret; `nil` (a public client) by default.
    ///   - clientAuthentication: How the secret is sent; `.basic` by default.
    ///   - scope: The scope to ask for; `nil` by default.
    ///   - audience: The audience to ask for; `nil` by default.
    ///   - resource: The resource indicator to send; `nil` by default.
    ///   - username: The `password` grant's user name; `nil` by default.
    ///   - password: The `password` grant's password; `nil` by default.
    package init(
        tokenURL: URL, clientID: String, grant: Grant = .refreshToken, clientSecret: String? = nil,
        clientAuthentication: ClientAuthentication = .basic, scope: String? = nil, audience: String? = nil,
        resource: String? = nil, username: String? = nil, password: String? = nil
    ) {
        self.tokenURL = tokenURL
        self.clientID = clientID
        self.grant = grant
        self.clientSecret = clientSecret
        self.clientAuthentication = clientAuthentication
        self.scope = scope
        self.audience = audience
        self.resource = resource
        self.username = username
        self.password = password
    }

    /// Makes the plugin from a policy's `with:` options.
    ///
    /// - Throws: ``PluginError`` when `token-url` is not an http(s) URL, `client-id` is missing,
    ///   `grant` or `client-auth` is not one of theirs, a grant lacks what it needs (a client
    ///   secret for `client_credentials`, `username-env` and `password-env` for `password`), or a
    ///   named variable is not set or a named file cannot be read (the name is shown, never a value).
    init(configuration: PluginConfiguration) throws(PluginError) {
        func failure(_ reason: String) -> PluginError {
            PluginError(kind: .refresh, name: configuration.name, reason: reason)
        }
        let tokenURL = try TokenEndpoint.url(configuration, "token-url", kind: .refresh)
        guard let clientID = configuration.string("client-id"), !clientID.isEmpty else {
            throw failure("the option 'client-id' is missing")
        }
        var grant = Grant.refreshToken
        if let text = configuration.string("grant") {
            guard let value = Grant(rawValue: text) else {
                throw failure("the option 'grant' must be refresh_token, client_credentials or password")
            }
            grant = value
        }
        var authentication = ClientAuthentication.basic
        if let text = configuration.string("client-auth") {
            guard let value = ClientAuthentication(rawValue: text) else {
                throw failure("the option 'client-auth' must be client_secret_basic or client_secret_post")
            }
            authentication = value
        }
        var basicEncoding = BasicEncoding.form
        if let text = configuration.string("client-auth-encoding") {
            guard let value = BasicEncoding(rawValue: text) else {
                throw failure("the option 'client-auth-encoding' must be form or raw")
            }
            basicEncoding = value
        }
        let secret = try SecretSource.option("client-secret", configuration, kind: .refresh)
        var username: String?
        var password: String?
        switch grant {
        case .refreshToken:
            break
        case .clientCredentials:
            guard secret != nil else {
                throw failure(
                    "the client_credentials grant needs the client secret: give 'client-secret-env' or 'client-secret-file'"
                )
            }
        case .password:
            guard let userVariable = configuration.string("username-env"),
                let passwordVariable = configuration.string("password-env")
            else {
                throw failure("the password grant needs 'username-env' and 'password-env'")
            }
            username = try SecretSource.environment(
                userVariable, configuration, kind: .refresh, namedBy: "'username-env'")
            password = try SecretSource.environment(
                passwordVariable, configuration, kind: .refresh, namedBy: "'password-env'")
        }
        self.init(
            tokenURL: tokenURL, clientID: clientID, grant: grant, clientSecret: secret,
            clientAuthentication: authentication, scope: configuration.string("scope"),
            audience: configuration.string("audience"), resource: configuration.string("resource"),
            username: username, password: password)
        followRedirects = try TokenEndpoint.redirects(configuration, kind: .refresh)
        self.basicEncoding = basicEncoding
    }

    /// `client_credentials` and `password` get a token with nothing stored.
    package var canSignIn: Bool { grant != .refreshToken }

    /// Names the endpoint, client and grant; says whether secrets are set without showing them.
    package var description: String {
        "OAuth2Refresh(\(TokenEndpoint.redacted(tokenURL)), client '\(clientID)'"
            + (grant == .refreshToken ? "" : ", grant \(grant.rawValue)")
            + (clientSecret == nil ? "" : ", client secret <redacted>")
            + (password == nil ? ")" : ", password <redacted>)")
    }

    package var debugDescription: String { description }

    /// The public parts only, so `dump(plugin)` cannot show a secret.
    package var customMirror: Mirror {
        Mirror(
            self,
            children: [
                "tokenURL": tokenURL, "clientID": clientID, "grant": grant, "scope": scope as Any,
                "audience": audience as Any, "resource": resource as Any,
            ])
    }

    /// Performs the grant; for `refresh_token`, with the refresh token of `context.credentials`.
    ///
    /// - Parameter context: The credentials being replaced, the transport and the clock.
    /// - Returns: The new credentials: the new access token, its expiry when the server gave
    ///   `expires_in`, and the rotated refresh token or else the old one.
    /// - Throws: ``RefreshFailure`` as described on the type; `CancellationError` when cancelled.
    package func refresh(_ context: RefreshContext) async throws -> Credentials {
        var refreshToken: String?
        if grant == .refreshToken {
            guard let token = context.credentials?.refreshToken, !token.isEmpty else {
                throw RefreshFailure("there is no refresh token to use")
            }
            refreshToken = token
        }
        let response = try await TokenEndpoint.post(
            request(refreshToken: refreshToken), via: context.transport, redirects: followRedirects)
        guard (200..<300).contains(response.status) else {
            throw RefreshFailure(
                "the token endpoint answered \(response.status)\(TokenEndpoint.oauthError(in: response))"
                    + encodingHint(response), response: response)
        }
        return try Self.pair(from: response, context, presented: refreshToken)
    }

    /// The pair in a 2xx token answer (RFC 6749 §5.1), read as the server meant it: an answer with an
    /// `access_token` is a pair the server issued (and, with rotation, spent the old refresh token
    /// for), so whatever else is odd in it the pair is returned; an unusable `expires_in` is reported
    /// (``RefreshContext/report``) and leaves the lifetime unknown, a `refresh_token` that is not a
    /// text leaves the one presented (`presented`, else the held one); a `token_type` the
    /// authorizer does not send fails with the pair kept (``RefreshFailure/keeping``).
    ///
    /// - Throws: ``RefreshFailure`` with the response: not a JSON object, no `access_token`, or a
    ///   token type the authorizer does not send.
    package static func pair(
        from response: HTTPResponse, _ context: RefreshContext, presented refreshToken: String?
    ) throws(RefreshFailure) -> Credentials {
        guard let object = TokenEndpoint.jsonObject(response.body) else {
            throw RefreshFailure("the token endpoint's answer is not a JSON object", response: response)
        }
        guard let accessToken = object["access_token"] as? String, !accessToken.isEmpty else {
            throw RefreshFailure("the token endpoint's answer has no 'access_token'", response: response)
        }
        // From here the answer is a token: the server has issued (and, with rotation, spent the
        // old refresh token for) this pair, so whatever else is odd in it, the pair is kept.
        var rotated: String?
        if let value = object["refresh_token"] as? String, !value.isEmpty { rotated = value }
        // What a reason quoting the answer's other fields must not show (worked out only for one).
        func secrets() -> [String?] { TokenAnswer.secrets(of: response, context, accessToken, refreshToken) }
        var expiresAt: Date?
        if let lifetime = object["expires_in"], !(lifetime is NSNull) {
            if let seconds = TokenEndpoint.seconds(lifetime) {
                expiresAt = context.clock.date.addingTimeInterval(seconds)
            } else {
                context.report(
                    "the token endpoint's 'expires_in' (\(TokenAnswer.quoted(lifetime, hiding: secrets()))) is not a usable number of"
                        + " seconds; the new token's lifetime is unknown, so it is used until the server refuses it")
            }
        }
        let credentials = Credentials(
            accessToken: accessToken, refreshToken: rotated ?? refreshToken ?? context.credentials?.refreshToken,
            expiresAt: expiresAt)
        if let value = object["refresh_token"], !(value is NSNull), !(value is String) {
            context.report("the token endpoint's 'refresh_token' is not a text; the refresh token held is kept")
        }
        if let type = object["token_type"] {
            guard let text = type as? String, TokenAnswer.acceptable(tokenType: text, sending: context.tokenType) else {
                throw RefreshFailure(
                    "the token endpoint issued a token of type \(TokenAnswer.quotedType(type, hiding: secrets())), and the policy's"
                        + " authorizer sends '\(context.tokenType)' tokens (RFC 6749 §7.1: a token of a type the client"
                        + " does not understand is not used); its refresh token is kept",
                    response: response, kind: .transient, keeping: credentials)
            }
        }
        return credentials
    }

    /// A hint for an answer refusing Basic credentials that the encoding changes (a reserved
    /// character in the id or secret): the usual cause is a server that decodes them differently.
    /// A refusal is `invalid_client`, a 401, or a 400 or 403 that names no error at all (glewlwyd
    /// answers a wrong secret with an empty 400, or 403 for client credentials). Names the
    /// option, never the secret or its characters.
    func encodingHint(_ response: HTTPResponse) -> String {
        let code = TokenEndpoint.errorCode(in: response)
        let refused =
            code == "invalid_client" || response.status == 401 || (code == nil && [400, 403].contains(response.status))
        guard clientAuthentication == .basic, let clientSecret, refused,
            FormEncoding.encode(clientSecret) != clientSecret || FormEncoding.encode(clientID) != clientID
        else { return "" }
        let other = basicEncoding == .form ? "raw" : "form"
        return "; the client id or secret holds characters that Basic encoding changes: if the server decodes"
            + " them differently, try 'client-auth-encoding: \(other)' or 'client-auth: client_secret_post'"
    }

    /// The token request; `refreshToken` is used by the `refresh_token` grant only.
    func request(refreshToken: String?) -> HTTPRequest {
        var fields = [("grant_type", grant.rawValue)]
        switch grant {
        case .refreshToken: fields.append(("refresh_token", refreshToken ?? ""))
        case .clientCredentials: break
        case .password:
            fields.append(("username", username ?? ""))
            fields.append(("password", password ?? ""))
        }
        fields.append(("client_id", clientID))
        var headers: HTTPHeaders = [
            "Content-Type": "application/x-www-form-urlencoded",
            "Accept": "application/json",
        ]
        if let clientSecret {
            switch clientAuthentication {
            case .basic:
                let pair =
                    basicEncoding == .form
                    ? FormEncoding.encode(clientID) + ":" + FormEncoding.encode(clientSecret)
                    : clientID + ":" + clientSecret
                headers.set("Authorization", "Basic " + Data(pair.utf8).base64EncodedString())
            case .post:
                fields.append(("client_secret", clientSecret))
            }
        }
        if let scope { fields.append(("scope", scope)) }
        if let audience { fields.append(("audience", audience)) }
        if let resource { fields.append(("resource", resource)) }
        return HTTPRequest(
            method: "POST", url: tokenURL, headers: headers, body: Data(FormEncoding.encode(fields).utf8),
            id: "oauth2-refresh")
    }
}

// MARK: - Form encoding

/// `application/x-www-form-urlencoded` as the WHATWG URL standard serializes it (RFC 6749
/// Appendix B): ASCII letters, digits and `*-._` stay, a space becomes `+`, every other byte of
/// the UTF-8 encoding becomes `%XX` (upper-case hex).
///
/// `URLComponents.percentEncodedQuery` is not used because it leaves `+`, `&`-free sub-delims and
/// `/` alone, and a `+` left in a token would arrive as a space.
enum FormEncoding {
    /// `name=value&…` in the given order.
    static func encode(_ fields: [(String, String)]) -> String {
        fields.map { encode($0.0) + "=" + encode($0.1) }.joined(separator: "&")
    }

    /// One name or value.
    static func encode(_ text: String) -> String {
        let hex = Array("0123456789ABCDEF".utf8)
        var out: [UInt8] = []
        out.reserveCapacity(text.utf8.count)
        for byte in text.utf8 {
            switch byte {
            case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
                UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "*"), UInt8(ascii: "-"), UInt8(ascii: "."),
                UInt8(ascii: "_"):
                out.append(byte)
            case UInt8(ascii: " "):
                out.append(UInt8(ascii: "+"))
            default:
                out.append(UInt8(ascii: "%"))
                out.append(hex[Int(byte >> 4)])
                out.append(hex[Int(byte & 0x0F)])
            }
        }
        return String(decoding: out, as: UTF8.self)
    }
}

// MARK: - Shared with the http plugins

/// What the network plugins share: option parsing, calling an endpoint, reading its answer.
package enum TokenEndpoint {
    /// An `http://` or `https://` URL option.
    static func url(_ configuration: PluginConfiguration, _ key: String, kind: PluginKind) throws(PluginError) -> URL {
        guard let text = configuration.string(key) else {
            throw PluginError(kind: kind, name: configuration.name, reason: "the option '\(key)' is missing")
        }
        guard let url = endpointURL(text) else {
            throw PluginError(kind: kind, name: configuration.name, reason: "the option '\(key)' is not an http(s) URL")
        }
        return url
    }

    /// `text` as an endpoint URL: http or https, with a host. (Lint applies the same rule.)
    static func endpointURL(_ text: String) -> URL? {
        guard let url = URL(string: text), let scheme = url.scheme?.lowercased(), scheme == "http" || scheme == "https",
            let host = url.host, !host.isEmpty
        else { return nil }
        return url
    }

    /// Sends `request` and returns whatever the endpoint answered.
    ///
    /// - Throws: `CancellationError` when the task is cancelled; ``RefreshFailure`` without a
    ///   response when the transport got none (the transport's message names the URL without
    ///   its query and never a header or body).
    static func post(
        _ request: HTTPRequest, via transport: any Transport, redirects: RedirectPolicy
    ) async throws -> HTTPResponse {
        var request = request
        request.redirects = redirects
        request.maxResponseBytes = maxAnswerBytes
        let response: HTTPResponse
        do {
            response = try await transport.send(request)
        } catch is CancellationError {
            throw CancellationError()
        } catch let error as TransportError where error.errorClass == .tooLarge {
            // Not trouble that passes: another call gets the same answer (a bomb, a wrong endpoint).
            var failure = RefreshFailure("the token endpoint's answer was refused (\(error))", kind: .transient)
            failure.endsRefresh = true
            throw failure
        } catch let error as TransportError {
            throw RefreshFailure("the token endpoint could not be reached (\(error))", kind: .transient)
        } catch {
            if Task.isCancelled { throw CancellationError() }
            throw RefreshFailure("the token endpoint could not be reached (\(type(of: error)))", kind: .transient)
        }
        // Not the identity provider ending the session: a proxy or a moved endpoint.
        if let reason = unfollowedRedirect(response, redirects: redirects) {
            throw RefreshFailure(reason, kind: .transient)
        }
        return response
    }

    /// The largest answer a token or logout endpoint may give: 1 MiB. A token answer is a few
    /// hundred bytes; anything near this is not one, and must not fill the memory.
    static let maxAnswerBytes = 1 << 20

    /// Why a redirect answer was not followed, `nil` when `response` is not a redirect. The target
    /// is never named: a `Location` may carry anything, a code or a token included.
    static func unfollowedRedirect(_ response: HTTPResponse, redirects: RedirectPolicy) -> String? {
        guard (300..<400).contains(response.status), response.headers["Location"] != nil else { return nil }
        switch redirects {
        case .none, .follow:
            return "the token endpoint answered a redirect (\(response.status)), which is not followed;"
                + " set 'follow-redirects: same-origin' to follow redirects within its origin"
        case .sameOrigin:
            return
                "the token endpoint answered a redirect (\(response.status)) to another origin, which is never followed"
        }
    }

    /// The `follow-redirects` option: `same-origin` or `none` (the default).
    static func redirects(_ configuration: PluginConfiguration, kind: PluginKind) throws(PluginError) -> RedirectPolicy
    {
        guard let text = configuration.string("follow-redirects") else { return .none }
        guard let policy = RedirectPolicy(rawValue: text), policy != .follow else {
            throw PluginError(
                kind: kind, name: configuration.name,
                reason: "the option 'follow-redirects' must be same-origin or none")
        }
        return policy
    }

    /// The body as a JSON object, `nil` when it is not one.
    static func jsonObject(_ body: Data) -> [String: Any]? {
        (try? JSONSerialization.jsonObject(with: body)) as? [String: Any]
    }

    /// The error codes of RFC 6749 §5.2 (and RFC 6750 §3.1's `invalid_token`, RFC 8628 §3.5's
    /// `slow_down`).
    package static let knownErrorCodes: Set<String> = [
        "invalid_request", "invalid_client", "invalid_grant", "unauthorized_client", "unsupported_grant_type",
        "invalid_scope", "invalid_token", "temporarily_unavailable", "server_error", "slow_down",
    ]

    /// The body's RFC 6749 §5.2 `error` code when it is one of the known codes; `nil` otherwise.
    static func errorCode(in response: HTTPResponse) -> String? {
        guard response.body.count <= maxAnswerBytes, response.body.first(where: { $0 > 32 }) == UInt8(ascii: "{"),
            let code = jsonObject(response.body)?["error"] as? String, knownErrorCodes.contains(code)
        else { return nil }
        return code
    }

    /// ` (invalid_grant)` when the body is an RFC 6749 §5.2 error answer with one of the standard
    /// codes; empty otherwise. Only known codes are repeated: any other text is the server's and
    /// may hold anything, a token included. `error_description` is left out for the same reason.
    package static func oauthError(in response: HTTPResponse) -> String {
        errorCode(in: response).map { " (\($0))" } ?? ""
    }

    /// Seconds from a JSON number or a numeric text (some servers quote `expires_in`); `nil` for
    /// anything else, negative values and values beyond a century.
    static func seconds(_ value: Any) -> TimeInterval? {
        let seconds: Double?
        if let text = value as? String {
            seconds = Double(text.trimmingCharacters(in: .whitespaces))
        } else if let number = value as? NSNumber {
            seconds = number.doubleValue
        } else {
            seconds = nil
        }
        guard let seconds, seconds.isFinite, seconds >= 0, seconds <= 3_153_600_000 else { return nil }
        return seconds
    }

    /// `url` without query, fragment, user or password, for descriptions.
    static func redacted(_ url: URL) -> String {
        guard var components = URLComponents(url: url, resolvingAgainstBaseURL: false) else { return "<url>" }
        components.query = nil
        components.fragment = nil
        components.user = nil
        components.password = nil
        return components.string ?? "<url>"
    }
}
