import Foundation

/// The tokens the engine signs requests with.
///
/// The description never shows a token: it says which parts are present and when the access
/// token expires, so a `print(credentials)` in a host's log cannot leak them.
public struct Credentials: Sendable, Hashable, CustomStringConvertible, CustomDebugStringConvertible {
    public var accessToken: String
    public var refreshToken: String?
    public var expiresAt: Date?

    public init(accessToken: String, refreshToken: String? = nil, expiresAt: Date? = nil) {
        self.accessToken = accessToken
        self.refreshToken = refreshToken
        self.expiresAt = expiresAt
    }

    public var description: String {
        var parts = ["access token <redacted>"]
        if refreshToken != nil { parts.append("refresh token <redacted>") }
        if let expiresAt { parts.append("expires \(ISO8601DateFormatter().string(from: expiresAt))") }
        return "Credentials(" + parts.joined(separator: ", ") + ")"
    }

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
    func sameTokens(as other: Credentials?) -> Bool {
        guard let other else { return false }
        return accessToken == other.accessToken && refreshToken == other.refreshToken
    }
}
