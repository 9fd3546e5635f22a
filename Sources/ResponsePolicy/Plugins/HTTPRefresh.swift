import Foundation

/// The `http` refresh plugin: POSTs a JSON body to a URL and reads the new token from the answer.
///
/// Why: many in-house APIs refresh with their own JSON endpoint rather than OAuth 2.0 (`POST
/// /auth/refresh {"refreshToken": "…"}` answered by `{"data": {"token": "…"}}`). This plugin
/// describes such an endpoint in the policy, so no host code is needed. Like every refresh it goes
/// through the engine's transport, bypassing the policy's rules.
///
/// The request is `POST <url>` with `Content-Type: application/json`, `Accept: application/json`,
/// the `headers:` given, and a JSON object built from `body:` (keys sorted, so the bytes are the
/// same every time). In the texts of `body:` and `headers:`, `{refresh_token}` is replaced by the
/// current refresh token and `{access_token}` by the access token being replaced. In `headers:`,
/// `{env:NAME}` is replaced by the environment variable `NAME` when the plugin is made (a static
/// API key for the token endpoint stays out of the policy file; lint refuses a literal one). A `body:` value
/// written as a plain YAML number or `true`/`false` is sent as a JSON number or boolean; quote it
/// to send a text. Without `body:` the body is `{"refresh_token":"{refresh_token}"}`.
///
/// The answer must be 2xx. The new access token is read at `token:` (`body.<dot.path>`, arrays by
/// index, or `header.<Name>`); a rotated refresh token at `refresh-token:` (the old one is kept
/// when the option or the value is absent); the token's lifetime in seconds at `expires-in:`.
///
/// ```yaml
/// refresh:
///   use: http
///   with:
///     url: https://api.example.com/auth/refresh
///     body: { refreshToken: "{refresh_token}", device: ios }
///     headers: { X-Client: mobile }
///     token: body.data.token
///     refresh-token: body.data.refreshToken
///     expires-in: body.data.expiresIn
/// ```
///
/// Failures throw ``RefreshFailure``: a non-2xx answer, or a 2xx answer without a token at
/// `token:`, carries the response (the engine classifies it with the policy's rules, so an
/// endpoint answering a logout code ends the session); an unreachable endpoint carries none.
/// Reasons name statuses and the policy's paths, never a token.
///
/// Concurrency contract: immutable and `Sendable`; safe to call from any task. Cancelling the
/// calling task cancels the request and ``refresh(_:)`` throws `CancellationError`.
package struct HTTPRefresh: RefreshPlugin {
    /// Where the refresh request is POSTed.
    package let url: URL
    /// The JSON body's fields, as written (placeholders unresolved).
    package let body: [String: PluginOption]
    /// Extra request headers, as written (placeholders unresolved).
    package let headers: [String: String]
    let bodyTemplate: [String: BodyValue]
    let headerTemplates: [(name: String, value: TemplateText)]
    let token: ValuePath
    let tokenText: String
    var refreshTokenPath: (path: ValuePath, text: String)?
    var expiresInPath: (path: ValuePath, text: String)?
    /// Which redirects of the refresh endpoint are followed: ``RedirectPolicy/none`` by default
    /// (`follow-redirects:` in the policy; `same-origin` follows those within the endpoint's origin).
    package var followRedirects: RedirectPolicy = .none

    /// A `body:` value with its texts resolved as far as they can be at creation.
    indirect enum BodyValue: Sendable {
        case text(TemplateText)
        case number(String)
        case bool(Bool)
        case list([BodyValue])
        case map([String: BodyValue])
    }

    /// Whether the request can be made with no stored credentials (a login with `{env:…}` or
    /// `{file:…}` values, no `{refresh_token}`): then the engine gets the first token with it
    /// before the first request goes out.
    package var canSignIn: Bool {
        func uses(_ value: BodyValue) -> Bool {
            switch value {
            case .text(let text): return text.usesCredentials
            case .number, .bool: return false
            case .list(let items): return items.contains(where: uses)
            case .map(let fields): return fields.values.contains(where: uses)
            }
        }
        return !bodyTemplate.values.contains(where: uses) && !headerTemplates.contains { $0.value.usesCredentials }
    }

    /// Creates the plugin. `{env:NAME}` and `{file:PATH}` in `body` and `headers` are read now,
    /// from the process environment and the file system.
    ///
    /// ```swift
    /// let plugin = try HTTPRefresh(
    ///     url: refreshURL, body: ["refreshToken": .string("{refresh_token}")],
    ///     token: "body.data.token", refreshToken: "body.data.refreshToken")
    /// ```
    ///
    /// - Parameters:
    ///   - url: Where the refresh request is POSTed.
    ///   - body: The JSON body's fields; `{"refresh_token": "{refresh_token}"}` by default.
    ///   - headers: Extra request headers; none by default.
    ///   - token: Where the new access token is: `body.<dot.path>` or `header.<Name>`.
    ///   - refreshToken: Where a rotated refresh token is; `nil` (keep the old one) by default.
    ///   - expiresIn: Where the token's lifetime in seconds is; `nil` (no known expiry) by default.
    /// - Throws: ``PluginError`` when a path is not `body.<path>` or `header.<Name>`, or an
    ///   `{env:…}` or `{file:…}` cannot be read.
    package init(
        url: URL, body: [String: PluginOption] = ["refresh_token": .string("{refresh_token}")],
        headers: [String: String] = [:], token: String, refreshToken: String? = nil, expiresIn: String? = nil
    ) throws(PluginError) {
        try self.init(
            url: url, body: body, headers: headers, token: token, refreshToken: refreshToken, expiresIn: expiresIn,
            configuration: PluginConfiguration(
                name: "http", options: [:], transport: NoTransport(),
                environment: ProcessInfo.processInfo.environment))
    }

    init(
        url: URL, body: [String: PluginOption], headers: [String: String], token: String, refreshToken: String?,
        expiresIn: String?, configuration: PluginConfiguration
    ) throws(PluginError) {
        func path(_ text: String, _ key: String) throws(PluginError) -> (ValuePath, String) {
            guard let path = ValuePath(text) else {
                throw PluginError(
                    kind: .refresh, name: configuration.name,
                    reason: "the option '\(key)' must be body.<path> or header.<Name>")
            }
            return (path, text)
        }
        func template(_ option: PluginOption, _ key: String) throws(PluginError) -> BodyValue {
            switch option {
            case .string(let text):
                return .text(try TemplateText(text, configuration, kind: .refresh, in: "the body field '\(key)'"))
            case .number(let text): return .number(text)
            case .bool(let flag): return .bool(flag)
            case .list(let items):
                var values: [BodyValue] = []
                for item in items { values.append(try template(item, key)) }
                return .list(values)
            case .map(let fields):
                var values: [String: BodyValue] = [:]
                for (name, value) in fields { values[name] = try template(value, key + "." + name) }
                return .map(values)
            }
        }
        self.url = url
        self.body = body
        self.headers = headers
        var bodyTemplate: [String: BodyValue] = [:]
        for key in body.keys.sorted() { bodyTemplate[key] = try template(body[key] ?? .string(""), key) }
        self.bodyTemplate = bodyTemplate
        var headerTemplates: [(name: String, value: TemplateText)] = []
        for name in headers.keys.sorted() {
            headerTemplates.append(
                (name, try TemplateText(headers[name] ?? "", configuration, kind: .refresh, in: "the header '\(name)'"))
            )
        }
        self.headerTemplates = headerTemplates
        (self.token, tokenText) = try path(token, "token")
        if let refreshToken { refreshTokenPath = try path(refreshToken, "refresh-token") }
        if let expiresIn { expiresInPath = try path(expiresIn, "expires-in") }
    }

    /// Makes the plugin from a policy's `with:` options.
    ///
    /// - Throws: ``PluginError`` when `url` is not an http(s) URL, `token` is missing, a path
    ///   is not `body.<path>` / `header.<Name>`, or an `{env:…}` / `{file:…}` cannot be read.
    init(configuration: PluginConfiguration) throws(PluginError) {
        func failure(_ reason: String) -> PluginError {
            PluginError(kind: .refresh, name: configuration.name, reason: reason)
        }
        let url = try TokenEndpoint.url(configuration, "url", kind: .refresh)
        guard let token = configuration.string("token") else { throw failure("the option 'token' is missing") }
        var body: [String: PluginOption] = ["refresh_token": .string("{refresh_token}")]
        switch configuration.options["body"] {
        case nil: break
        case .map(let fields)?: body = fields
        case .some: throw failure("the option 'body' must be a mapping")
        }
        var headers: [String: String] = [:]
        switch configuration.options["headers"] {
        case nil: break
        case .map(let fields)?:
            for (name, value) in fields {
                guard let text = value.string else { throw failure("the header '\(name)' must be a text") }
                headers[name] = text
            }
        case .some: throw failure("the option 'headers' must be a mapping")
        }
        try self.init(
            url: url, body: body, headers: headers, token: token, refreshToken: configuration.string("refresh-token"),
            expiresIn: configuration.string("expires-in"), configuration: configuration)
        followRedirects = try TokenEndpoint.redirects(configuration, kind: .refresh)
    }

    /// Posts the refresh request and reads the new credentials from the answer.
    ///
    /// - Parameter context: The credentials being replaced, the transport and the clock.
    /// - Returns: The new access token, the rotated refresh token or else the old one, and the
    ///   expiry when `expires-in:` found one.
    /// - Throws: ``RefreshFailure`` as described on the type; `CancellationError` when cancelled.
    package func refresh(_ context: RefreshContext) async throws -> Credentials {
        let request = try request(for: context.credentials)
        let response = try await TokenEndpoint.post(request, via: context.transport, redirects: followRedirects)
        guard (200..<300).contains(response.status) else {
            throw RefreshFailure("the refresh endpoint answered \(response.status)", response: response)
        }
        guard let accessToken = Self.value(at: token, in: response), !accessToken.isEmpty else {
            throw RefreshFailure("the refresh endpoint's answer has no token at '\(tokenText)'", response: response)
        }
        var refreshToken = context.credentials?.refreshToken
        if let (path, _) = refreshTokenPath, let rotated = Self.value(at: path, in: response), !rotated.isEmpty {
            refreshToken = rotated
        }
        var expiresAt: Date?
        if let (path, text) = expiresInPath, let value = Self.value(at: path, in: response) {
            // The answer is a token: the pair is kept whatever else is odd in it.
            if let seconds = TokenEndpoint.seconds(value) {
                expiresAt = context.clock.date.addingTimeInterval(seconds)
            } else {
                let secrets = TokenAnswer.secrets(of: response, context, accessToken, refreshToken)
                context.report(
                    "the value at '\(text)' (\(TokenAnswer.quoted(value, hiding: secrets))) is not a usable number of seconds; the new"
                        + " token's lifetime is unknown, so it is used until the server refuses it")
            }
        }
        return Credentials(accessToken: accessToken, refreshToken: refreshToken, expiresAt: expiresAt)
    }

    /// The refresh request for `credentials`.
    ///
    /// - Throws: ``RefreshFailure`` when a placeholder names a token the credentials do not have.
    func request(for credentials: Credentials?) throws(RefreshFailure) -> HTTPRequest {
        var requestHeaders: HTTPHeaders = ["Content-Type": "application/json", "Accept": "application/json"]
        for (name, value) in headerTemplates { try requestHeaders.set(name, value.resolve(credentials)) }
        var json = ""
        try Self.appendJSON(.map(bodyTemplate), credentials, to: &json)
        return HTTPRequest(method: "POST", url: url, headers: requestHeaders, body: Data(json.utf8), id: "http-refresh")
    }

    /// `value` as JSON (object keys sorted), placeholders in its texts replaced.
    private static func appendJSON(
        _ value: BodyValue, _ credentials: Credentials?, to json: inout String
    ) throws(RefreshFailure) {
        switch value {
        case .text(let text): json += PolicyEvent.quote(try text.resolve(credentials))
        case .bool(let flag): json += flag ? "true" : "false"
        case .number(let text):
            // As written when it is a JSON number; YAML spellings JSON lacks (007, 0x1F, .5) as text.
            json += isJSONNumber(text) ? text : PolicyEvent.quote(text)
        case .list(let items):
            json += "["
            for (index, item) in items.enumerated() {
                if index > 0 { json += "," }
                try appendJSON(item, credentials, to: &json)
            }
            json += "]"
        case .map(let fields):
            json += "{"
            for (index, key) in fields.keys.sorted().enumerated() {
                if index > 0 { json += "," }
                json += PolicyEvent.quote(key) + ":"
                if let field = fields[key] { try appendJSON(field, credentials, to: &json) }
            }
            json += "}"
        }
    }

    /// The text at `path` in the answer (a number as its text), `nil` when there is none.
    static func value(at path: ValuePath, in response: HTTPResponse) -> String? {
        switch path {
        case .header(let name):
            return response.headers[name]
        case .body(let jsonPath):
            // The whole body: unlike a business code on every response, a token answer is read once,
            // and a token past the scanner's default 64 KiB window must still be found.
            return response.body.withUnsafeBytes { bytes in
                JSONCodeScanner.code(in: bytes, at: jsonPath, maxBytes: max(bytes.count, 1))
            }
        }
    }
}

/// Whether `text` is a number in JSON's grammar (RFC 8259 §6).
func isJSONNumber(_ text: String) -> Bool {
    var bytes = Array(text.utf8)[...]
    if bytes.first == UInt8(ascii: "-") { bytes = bytes.dropFirst() }
    func digits() -> Int {
        var count = 0
        while let byte = bytes.first, byte >= 0x30, byte <= 0x39 {
            bytes = bytes.dropFirst()
            count += 1
        }
        return count
    }
    if bytes.first == UInt8(ascii: "0") {
        bytes = bytes.dropFirst()
    } else if digits() == 0 {
        return false
    }
    if bytes.first == UInt8(ascii: ".") {
        bytes = bytes.dropFirst()
        if digits() == 0 { return false }
    }
    if bytes.first == UInt8(ascii: "e") || bytes.first == UInt8(ascii: "E") {
        bytes = bytes.dropFirst()
        if bytes.first == UInt8(ascii: "+") || bytes.first == UInt8(ascii: "-") { bytes = bytes.dropFirst() }
        if digits() == 0 { return false }
    }
    return bytes.isEmpty
}
