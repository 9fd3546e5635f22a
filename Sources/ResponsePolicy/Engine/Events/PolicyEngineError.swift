import Foundation

/// Why `PolicyEngine.send` did not deliver a response. One case per way a request can end.
///
/// Descriptions show statuses and reasons, never headers, bodies or tokens.
public enum PolicyEngineError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The session was logged out (by this request's response, another's, a failed refresh, the
    /// host or another process), or is in its cooldown. `until` is when the cooldown ends, on the
    /// wall clock; `reason` says why the session ended (the same for every request it ended).
    case loggedOut(until: Date, reason: LogoutReason)
    /// Retries ran out, were not allowed (method, budget) or `on-exhausted: fail` applied.
    /// Carries the last response when there was one, else the last transport error.
    case retriesExhausted(lastResponse: HTTPResponse?, lastError: TransportError?)
    /// A rule with `then: fail` matched this response.
    case failed(response: HTTPResponse, rule: String)
    /// A refresh trigger could not get a fresh token and `on-failure: fail` applied.
    case refreshFailed(reason: String)
    /// The caller's task was cancelled.
    case cancelled
    /// `retry.deadline` passed (or a wait would have ended past it).
    case deadlineExceeded
    /// The attempt failed without a response and no rule handled that.
    case transport(TransportError)

    /// What went wrong, for logs; never a token.
    public var description: String {
        switch self {
        case .loggedOut(let until, let reason):
            return "\(reason.sentence); new requests fail until \(ISO8601DateFormatter().string(from: until))"
        case .retriesExhausted(let response?, _): return "retries exhausted; last response \(response)"
        case .retriesExhausted(nil, let error?): return "retries exhausted; last attempt: \(error)"
        case .retriesExhausted: return "retries exhausted"
        case .failed(let response, let rule): return "rule '\(rule)' failed the request (\(response))"
        case .refreshFailed(let reason): return "token refresh failed: \(reason)"
        case .cancelled: return "the request was cancelled"
        case .deadlineExceeded: return "the request's deadline passed"
        case .transport(let error): return "transport failed: \(error)"
        }
    }
}
