/// Why a session was logged out, as ``PolicyEngineError/loggedOut(until:reason:)`` carries it:
/// so an app can tell "signed in elsewhere" (a rule) from "the refresh failed" or its own sign-out.
///
/// Carries no token or credential; a response is the one that caused the logout (its
/// description shows only its status and size).
public enum LogoutReason: Sendable, Equatable, CustomStringConvertible {
    /// A `logout` rule matched (directly, or as a rule's `on-exhausted`): the rule's name and the
    /// response that matched it, when there was one.
    case rule(String, response: HTTPResponse?)
    /// A refresh failed and `on-failure: logout` applied, or the token endpoint's answer matched a
    /// `logout` rule: the refresh's reason and that answer, when there was one.
    case refreshFailed(String, response: HTTPResponse?)
    /// The host called ``PolicyEngine/logout(reason:)``.
    case host(String)
    /// Another engine sharing the session logged out (a ``SessionCoordinator`` told this one).
    case elsewhere(String)

    /// The reason in a few words, for logs; never a token.
    public var description: String {
        switch self {
        case .rule(let name, _): return "rule '\(name)'"
        case .refreshFailed(let reason, _): return "refresh failed: \(reason)"
        case .host(let reason): return "the host: \(reason)"
        case .elsewhere(let reason): return "another process: \(reason)"
        }
    }

    /// The reason a coordinator gives when another process logged the session out and did not
    /// say why (the lock-file store keeps only the cooldown's end).
    package static let elsewhereWithoutReason = "another process sharing the session logged out"

    /// One sentence for people, as errors and `policy fetch` print it: `logged out by rule
    /// 'forced-logout'`, `logged out because the token refresh failed: …`, `logged out by the
    /// host: …`, `logged out by another process sharing the session`.
    package var sentence: String {
        switch self {
        case .rule(let name, _): return "logged out by rule '\(name)'"
        case .refreshFailed(let reason, _): return "logged out because the token refresh failed: \(reason)"
        case .host(let reason): return "logged out by the host: \(reason)"
        case .elsewhere(let reason):
            return reason == Self.elsewhereWithoutReason
                ? "logged out by another process sharing the session"
                : "logged out by another process sharing the session: \(reason)"
        }
    }

    /// The text `logout` events and ``LogoutContext/reason`` carry: the rule's name, `refresh
    /// failed: <the refresh's reason>`, or the host's or other process's reason.
    var eventText: String {
        switch self {
        case .rule(let name, _): return name
        case .refreshFailed(let reason, _): return "\(PolicyEngine.refreshFailedReason): \(reason)"
        case .host(let reason), .elsewhere(let reason): return reason
        }
    }

    /// The rule's name, when a rule caused it.
    var ruleName: String? {
        if case .rule(let name, _) = self { return name }
        return nil
    }
}
