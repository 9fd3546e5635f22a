import Foundation

// MARK: - Refresh

/// What a refresh plugin gets to work with.
public struct RefreshContext: Sendable {
    /// The credentials being replaced (their refresh token, for OAuth2).
    public let credentials: Credentials?
    /// The engine's transport, for plugins that call a token endpoint. Calls through it bypass
    /// the policy's rules, so a refresh is never refreshed or retried by them.
    public let transport: any Transport
    /// The engine's clock (`date` for computing `expires_at`).
    public let clock: any PolicyClock
    /// Why the engine refreshes: the rule that matched (`token-expired`), `ahead` when the token
    /// expires within `refresh.ahead`, or `sign-in` when there are no credentials yet. Never a
    /// secret; the `exec` plugin passes it to its command.
    public let reason: String
    /// The token type the policy's authorizer sends (RFC 6749 §7.1): `bearer` unless its options
    /// name another. A plugin that reads a `token_type` refuses a token of another type, keeping
    /// the refresh token that came with it (``RefreshFailure/keeping``).
    public let tokenType: String
    /// Reports something odd in an answer that did not fail the refresh (an `expires_in` the
    /// engine cannot use, so the token's lifetime is unknown): a `problem` event. Never pass a
    /// secret; quote what the server sent only when it cannot be one.
    public let report: @Sendable (String) -> Void

    package init(
        credentials: Credentials?, transport: any Transport, clock: any PolicyClock, reason: String = "refresh",
        tokenType: String = "bearer", report: @escaping @Sendable (String) -> Void = { _ in }
    ) {
        self.credentials = credentials
        self.transport = transport
        self.clock = clock
        self.reason = reason
        self.tokenType = tokenType
        self.report = report
    }
}

/// Why a refresh failed, and whether trying again can help.
///
/// Why the distinction: a session must end only when the identity provider ended it. A
/// **definitive** failure says the refresh cannot succeed with these credentials (any RFC 6749
/// §5.2 code, any other 4xx but 408, 425 and 429): only such a failure reaches
/// `refresh.on-failure`, and it is not asked again within `refresh.timeout`. A **transient** one
/// is trouble that may pass (a 5xx, 408, 425 or 429 answer, `temporarily_unavailable`,
/// `slow_down`, no answer, a reset connection, a timeout, coordination trouble): the engine calls
/// the plugin again with backoff, obeying `Retry-After` in full, within `refresh.timeout`, while
/// the waiting requests stay parked; when the trouble outlasts the timeout the requests fail with
/// its reason and the session goes on.
///
/// When the token endpoint answered, `response` carries its answer: the engine classifies it with
/// the policy's rules too (a `logout` rule ends the session; a `refresh` or `fail` rule makes the
/// answer definitive; a `retry` rule makes it transient).
///
/// ```swift
/// throw RefreshFailure("the SSO answered 503", kind: .transient, retryAfter: .seconds(2))
/// ```
public struct RefreshFailure: Error, Sendable, Equatable, CustomStringConvertible {
    /// Whether the refresh can succeed if tried again.
    public enum Kind: String, Sendable, Hashable, CaseIterable {
        /// The refresh cannot succeed with these credentials: it reaches `refresh.on-failure`.
        case definitive
        /// Trouble that may pass: retried within `refresh.timeout`; never ends the session.
        case transient
    }

    /// Why the refresh failed, for logs and events; never a token.
    public var reason: String
    /// The token endpoint's answer, when there was one.
    public var response: HTTPResponse?
    /// Whether trying again can help.
    public var kind: Kind
    /// How long to wait before the next try, when the plugin knows (`nil`: the response's
    /// `Retry-After`, else the engine's backoff).
    public var retryAfter: Duration?
    /// Whether another call within this refresh would only get the same answer (the token
    /// endpoint's answer was over its size limit, `too-large`): the refresh fails at once, still
    /// transient, so the session goes on. `false` by default.
    package var endsRefresh = false
    /// Credentials the token endpoint returned with an answer the refresh cannot use (a token type
    /// the authorizer does not send, a token that cannot be put in a header): the engine keeps
    /// their refresh token, which the server has already rotated, and does not ask again within
    /// `refresh.timeout`. `nil` by default.
    public var keeping: Credentials?

    /// Creates a failure.
    ///
    /// - Parameters:
    ///   - reason: Why, for events, errors and the logout it may lead to; never a secret.
    ///   - response: The token endpoint's answer, when it answered; `nil` by default.
    ///   - kind: `nil` (the default) derives it: from `response` when there is one
    ///     (`kind(of:)`), else ``Kind/definitive`` — a plugin that throws without an answer is
    ///     taken at its word; the built-in plugins say `.transient` for an endpoint they could
    ///     not reach.
    ///   - retryAfter: The wait the server asked for; `nil` by default.
    ///   - keeping: Credentials that came with an answer the refresh cannot use; `nil` by default.
    public init(
        _ reason: String, response: HTTPResponse? = nil, kind: Kind? = nil, retryAfter: Duration? = nil,
        keeping: Credentials? = nil
    ) {
        self.reason = reason
        self.response = response
        self.kind = kind ?? response.map(Self.kind(of:)) ?? .definitive
        self.retryAfter = retryAfter
        self.keeping = keeping
    }

    /// Whether trying again can help, judged from the token endpoint's answer alone (SPEC "The
    /// refresh token is irreplaceable"): definitive for every RFC 6749 §5.2 code
    /// (`invalid_request`, `invalid_client`, `invalid_grant`, `unauthorized_client`,
    /// `unsupported_grant_type`, `invalid_scope`) and every 4xx but 408, 425 and 429; transient for
    /// `temporarily_unavailable`, `slow_down`, 408, 425, 429, every 5xx and an answer that is no
    /// token. The engine's classification by the policy's rules comes on top.
    package static func kind(of response: HTTPResponse) -> Kind {
        TokenAnswer.kind(of: response)
    }

    /// The RFC 6749 §5.2 error codes, each of which says the refresh cannot succeed as asked.
    package static let definitiveErrorCodes: Set<String> = TokenAnswer.definitiveCodes

    /// Whether the refresh cannot succeed if tried again.
    public var isDefinitive: Bool { kind == .definitive }

    /// The reason.
    public var description: String { reason }
}

/// Gets fresh credentials. The engine calls it at most once at a time (single flight) and
/// enforces `refresh.timeout` by cancelling the call.
///
/// Concurrency contract: called from an engine task; must honour cancellation. Throw
/// ``RefreshFailure`` (any other error is treated as a failure with its description, which must
/// not contain secrets).
public protocol RefreshPlugin: Sendable {
    /// New credentials from the token endpoint (or wherever they come from); throws ``RefreshFailure``.
    func refresh(_ context: RefreshContext) async throws -> Credentials

    /// Whether the plugin gets credentials when none are stored (an OAuth2 `client_credentials`
    /// or `password` grant, a login endpoint, a credential command). Then a request that finds
    /// no credentials waits for one refresh (single flight, reason `sign-in`) before it goes out,
    /// instead of going out unsigned. `false` by default: a refresh_token grant needs a token.
    var canSignIn: Bool { get }
}

extension RefreshPlugin {
    /// `false`: the plugin needs a refresh token.
    public var canSignIn: Bool { false }
}

// MARK: - Authorize

/// Signs a request with the current credentials. Must replace, never add to, an earlier
/// signature, since the engine re-signs the same request after every refresh.
public protocol AuthorizePlugin: Sendable {
    /// Puts `credentials` on `request`, replacing an earlier signature.
    func authorize(_ request: inout HTTPRequest, with credentials: Credentials)

    /// The token type it sends (RFC 6749 §7.1, compared without case): a token endpoint that
    /// issues another type is refused, since a token used as a type it is not is refused by the
    /// server at best. `bearer` by default.
    var tokenType: String { get }
}

extension AuthorizePlugin {
    /// `bearer`.
    public var tokenType: String { "bearer" }
}

// MARK: - Logout

/// Why the session ended.
public struct LogoutContext: Sendable {
    /// The request whose response triggered the logout, when one did.
    public let requestID: String?
    /// The rule that matched, or `refresh failed` when a failed refresh logged out.
    public let reason: String
    /// The session's credentials as they were at logout (to say which session to end).
    public let credentials: Credentials?
    /// The engine's transport for its own calls (rules do not apply to it).
    public let transport: any Transport
    /// The engine's clock, for timeouts: a plugin that waits on it runs on virtual time in tests.
    public let clock: any PolicyClock

    package init(
        requestID: String?, reason: String, credentials: Credentials?, transport: any Transport,
        clock: any PolicyClock = SystemPolicyClock()
    ) {
        self.requestID = requestID
        self.reason = reason
        self.credentials = credentials
        self.transport = transport
        self.clock = clock
    }
}

/// Tells the outside world the session ended (revoke a token, clear a keychain). Called once
/// per logout, in the background: the engine does not wait for it before failing requests.
public protocol LogoutPlugin: Sendable {
    /// Ends the session outside (revokes the token, clears what the service keeps).
    func logout(_ context: LogoutContext) async
}

// MARK: - Observe

/// Receives every engine event. Called synchronously on the engine's path: keep it fast and
/// never block. Events carry no tokens, headers or bodies.
public protocol PolicyObserver: Sendable {
    /// Receives one event, on the engine's path.
    func observe(_ event: PolicyEvent)
}

// MARK: - Store

/// Where credentials live between runs. Synchronous because credentials are small and the
/// engine touches the store only at start and after a refresh.
public protocol CredentialStore: Sendable {
    /// The stored credentials; `nil` when there are none.
    func load() throws -> Credentials?
    /// Stores `credentials` in place of what was stored.
    func save(_ credentials: Credentials) throws
}

// MARK: - Extract

/// Finds a response's business code when `classify.code` cannot express where it is.
/// Called on every response: keep it allocation-free where possible.
public protocol CodeExtractor: Sendable {
    /// The business code of `response`; `nil` when it has none.
    func code(in response: HTTPResponse) -> String?
}
