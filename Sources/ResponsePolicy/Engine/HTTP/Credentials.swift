import Foundation

/// The tokens the engine signs requests with.
///
/// The description never shows a token: it says which parts are present and when the access
/// token expires, so a `print(credentials)` in a host's log cannot leak them.
public struct Credentials: Sendable, Hashable, CustomStringConvertible, CustomDebugStringConvertible {
    /// The token that signs requests.
    public var accessToken: String
    /// The token a refresh presents, when the session has one.
    public var refreshToken: String?
    /// When the access token expires, if known: `refresh.ahead` refreshes before it.
    public var expiresAt: Date?
    /// When the token endpoint issued the access token (when its answer arrived), if known:
    /// with ``expiresAt`` it gives the lifetime as issued, which bounds `refresh.ahead` (at most
    /// half of it). Stores and coordinators keep it, so a token adopted from the fleet or read
    /// back after a restart is refreshed ahead as its issuer's was (issue 30, case 7).
    public var issuedAt: Date?

    /// Credentials with these tokens and times.
    public init(accessToken: String, refreshToken: String? = nil, expiresAt: Date? = nil, issuedAt: Date? = nil) {
        self.accessToken = accessToken
        self.refreshToken = refreshToken
        self.expiresAt = expiresAt
        self.issuedAt = issuedAt
    }

    /// Seconds the access token was valid for when it was issued, when both ends are known.
    package var lifetimeAsIssued: Double? {
        guard let expiresAt, let issuedAt else { return nil }
        return expiresAt.timeIntervalSince(issuedAt)
    }

    /// Which parts are present and when the access token expires; never a token.
    public var description: String {
        var parts = ["access token <redacted>"]
        if refreshToken != nil { parts.append("refresh token <redacted>") }
        if let expiresAt { parts.append("expires \(ISO8601DateFormatter().string(from: expiresAt))") }
        return "Credentials(" + parts.joined(separator: ", ") + ")"
    }

    /// The same as ``description``: never a token.
    public var debugDescription: String { description }
}

extension Credentials: CustomReflectable {
    /// `dump(credentials)` and debuggers show which parts exist, never the tokens.
    public var customMirror: Mirror {
        Mirror(
            self,
            children: [
                "accessToken": "<redacted>", "refreshToken": refreshToken == nil ? "nil" : "<redacted>",
                "expiresAt": expiresAt.map { "\($0)" } ?? "nil",
            ], displayStyle: .struct)
    }
}

extension Credentials {
    /// Whether `other` holds the same tokens. The expiry is left out on purpose: the credentials
    /// file keeps it to the second and the shared codecs to the millisecond, so the *same* tokens
    /// read back from two stores compare unequal as whole values, and treating them as new
    /// credentials made a process adopt its own token as "fresh" (issue 19).
    package func sameTokens(as other: Credentials?) -> Bool {
        guard let other else { return false }
        return accessToken == other.accessToken && refreshToken == other.refreshToken
    }
}
