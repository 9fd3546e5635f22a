import Foundation

/// Pure judgements about a token endpoint's answer: what kind of failure it is, whether a token
/// can be sent, how long the server asked to be left alone. No state, no clock: the refresh
/// flight (``RefreshFlight``) decides from them, and lint, explain and the docs state them.
///
/// Why apart from the transitions: a judgement is asked in more places than it is acted on (the
/// flight, the plugins' reasons, the tests that compare a real server with the rule), and a rule
/// stated once cannot drift (Envoy's router names its `wouldRetry…` judgements apart from the
/// `shouldRetry…` decisions the same way).
package enum TokenAnswer {
    /// The longest access token the engine puts in a request: `16 KiB`. A token is a few hundred
    /// bytes (a large JWT a few KiB); anything near this is not one, and servers refuse headers of
    /// 8–16 KiB anyway. The refresh token that came with a longer one is still kept.
    static let maxAccessTokenBytes = 16 * 1024

    /// The longest wait a `Retry-After` on a token endpoint's answer is read as: `24h`. Obeyed in
    /// full up to this; a longer one (a year, a date far ahead) is read as a day.
    static let maxRequestedWait = Duration.seconds(24 * 3600)

    /// The RFC 6749 §5.2 error codes: every one says the request cannot succeed as sent (a
    /// malformed request, a client the server does not know or trust, a grant that is dead, a grant
    /// type or scope it does not allow), so repeating it can only lock an account or burn a
    /// refresh token.
    static let definitiveCodes: Set<String> = [
        "invalid_request", "invalid_client", "invalid_grant", "unauthorized_client", "unsupported_grant_type",
        "invalid_scope",
    ]

    /// The codes that say "later": RFC 6749 §5.2's `temporarily_unavailable` (in §4.1.2.1) and RFC
    /// 8628 §3.5's `slow_down`.
    static let transientCodes: Set<String> = ["temporarily_unavailable", "slow_down"]

    /// The statuses of the 4xx class that are not an answer about the grant: 408 Request Timeout,
    /// 425 Too Early and 429 Too Many Requests say "not now".
    static let transientClientStatuses: Set<Int> = [408, 425, 429]

    /// The definitive answers in words, for `explain` and the docs: read from the sets above.
    package static var definitiveSummary: String {
        "any RFC 6749 §5.2 error: " + definitiveCodes.sorted().joined(separator: ", ") + "; any other 4xx but "
            + transientClientStatuses.sorted().map(String.init).joined(separator: ", ")
    }

    /// The transient answers in words, for `explain` and the docs.
    package static var transientSummary: String {
        "a 5xx, " + transientClientStatuses.sorted().map(String.init).joined(separator: ", ") + " answer, "
            + transientCodes.sorted().joined(separator: ", ") + ", no answer, a reset connection"
    }

    /// Whether a token endpoint's answer (one that is not a token) says the refresh cannot succeed
    /// if asked again (``RefreshFailure/Kind/definitive``) or may (``RefreshFailure/Kind/transient``):
    ///
    /// - an RFC 6749 §5.2 `error` code decides first: the six codes of §5.2 are definitive,
    ///   `temporarily_unavailable` and `slow_down` transient;
    /// - then the status: 408, 425, 429 and every 5xx are transient; every other 4xx is
    ///   definitive (401 and 403 from a login endpoint: a wrong password asked again locks the
    ///   account);
    /// - anything else (a 2xx that holds no token, a redirect not followed, a 1xx) is transient:
    ///   a proxy's page is not the identity provider's word.
    static func kind(of response: HTTPResponse) -> RefreshFailure.Kind {
        if let code = TokenEndpoint.errorCode(in: response) {
            if definitiveCodes.contains(code) { return .definitive }
            if transientCodes.contains(code) { return .transient }
        }
        switch response.status {
        case 400..<500: return transientClientStatuses.contains(response.status) ? .transient : .definitive
        default: return .transient
        }
    }

    /// `failure` with the policy's rules on top of the plugin's own kind: an answer that a
    /// `refresh`, `fail` or `logout` rule matches (`action`, the rule the shell classified the
    /// answer with) is definitive, a code or status the policy names; the rules never make a
    /// definitive answer transient.
    static func judged(_ failure: RefreshFailure, ruleAction action: ActionKind?) -> RefreshFailure {
        guard !failure.isDefinitive, failure.response != nil, let action else { return failure }
        switch action {
        case .refresh, .fail, .logout:
            var definitive = failure
            definitive.kind = .definitive
            return definitive
        case .retry, .deliver:
            return failure
        }
    }

    /// The wait `failure` asks for: the plugin's own, else the answer's `Retry-After` (seconds or
    /// an HTTP-date, against `date`), at most ``maxRequestedWait``; `nil` when it asks none.
    static func requestedWait(_ failure: RefreshFailure, date: Date) -> Duration? {
        let requested =
            failure.retryAfter
            ?? failure.response?.headers["Retry-After"].flatMap { RetryTiming.retryAfter($0, now: date) }
        return requested.map { min(max($0, .zero), maxRequestedWait) }
    }

    /// Why `token` cannot be sent in a request, `nil` when it can: empty, longer than
    /// ``maxAccessTokenBytes``, or holding a control character (CR or LF would end the header and
    /// start another, NUL or ESC would be cut or shown raw; a transport refuses such a header and
    /// the request would go out unsigned). Names sizes and character classes, never the token.
    static func unsendable(_ token: String) -> String? {
        let bytes = token.utf8.count
        if bytes == 0 { return "the access token is empty" }
        if bytes > maxAccessTokenBytes {
            return "the access token is \(bytes) bytes, over the \(maxAccessTokenBytes / 1024) KiB the engine sends"
        }
        if token.utf8.contains(where: { $0 < 0x20 || $0 == 0x7F }) {
            return "the access token holds control characters, which cannot be sent in a header"
        }
        return nil
    }

    /// Whether the token type an answer named (RFC 6749 §7.1, compared without case) is the one the
    /// policy's authorizer sends (`bearer` unless its options name another): a client must not use
    /// a token of a type it does not understand (a `mac` token sent as a bearer token is refused
    /// by the server, or worse, accepted by one that should not).
    static func acceptable(tokenType: String, sending sent: String) -> Bool {
        tokenType.caseInsensitiveCompare(sent) == .orderedSame
    }

    /// A value the server sent where a number belongs (an `expires_in`), quoted for a reason: a
    /// number as it is, a text that looks like one (digits, a sign, a point, an exponent; at most 24
    /// characters) in quotes, anything else by its length only: a server that puts a token where a
    /// lifetime belongs must not see it in a log.
    ///
    /// `secrets`: the tokens of the answer and of the credentials presented. A value that contains
    /// one of them, or is part of one, is given by its length only, whatever it looks like (a
    /// numeric token where a lifetime belongs).
    static func quoted(_ value: Any, hiding secrets: [String?] = []) -> String {
        if let number = value as? NSNumber, !(value is String) {
            let text = number.description
            return touches(text, secrets) ? "a number of \(text.count) characters" : text
        }
        guard let text = value as? String else { return "a value of type \(type(of: value))" }
        let numeric = text.utf8.allSatisfy { byte in
            (byte >= 0x30 && byte <= 0x39) || byte == UInt8(ascii: ".") || byte == UInt8(ascii: "-")
                || byte == UInt8(ascii: "+") || byte == UInt8(ascii: "e") || byte == UInt8(ascii: "E")
        }
        return numeric && !text.isEmpty && text.utf8.count <= 24 && !touches(text, secrets)
            ? "'\(text)'" : "a text of \(text.count) characters"
    }

    /// Every text a token answer holds under a key that names a token (`access_token`,
    /// `refresh_token`, `id_token`, a nested `token`; not `token_type`, the name of a kind of
    /// token) or `refresh`, at any depth: what a reason quoting another field must not show.
    /// Empty for a body that is not JSON.
    package static func tokenTexts(in body: Data) -> [String] {
        guard let root = try? JSONSerialization.jsonObject(with: body, options: [.fragmentsAllowed]) else { return [] }
        var found: [String] = []
        func walk(_ value: Any, key: String?) {
            if let text = value as? String, let key = key?.lowercased(), key != "token_type",
                key.contains("token") || key == "refresh"
            {
                found.append(text)
            } else if let object = value as? [String: Any] {
                for (name, child) in object { walk(child, key: name) }
            } else if let list = value as? [Any] {
                for child in list { walk(child, key: key) }
            }
        }
        walk(root, key: nil)
        return found
    }

    /// What a reason quoting a field of a refresh plugin's `response` must not show: every token
    /// the answer holds (``tokenTexts(in:)``), `tokens` (those the plugin read from it) and the
    /// credentials presented.
    static func secrets(of response: HTTPResponse, _ context: RefreshContext, _ tokens: String?...) -> [String?] {
        tokenTexts(in: response.body).map(Optional.some) + tokens
            + [context.credentials?.accessToken, context.credentials?.refreshToken]
    }

    /// Whether `text` contains one of `secrets` or is part of one (an empty secret counts for nothing).
    static func touches(_ text: String, _ secrets: [String?]) -> Bool {
        secrets.contains { secret in
            guard let secret, !secret.isEmpty else { return false }
            return text.contains(secret) || secret.contains(text)
        }
    }

    /// A token type the server named, quoted for a reason: a short word (letters, digits, `-_.`,
    /// at most 12: `Bearer`, `DPoP`, `MAC`, `N_A`) in quotes, anything else by its length only,
    /// and so is a word that contains one of `secrets` or is part of one (a server that puts its
    /// token in `token_type` must not see it in a log).
    static func quotedType(_ value: Any, hiding secrets: [String?] = []) -> String {
        guard let text = value as? String else { return "a value of type \(type(of: value))" }
        let word = text.utf8.allSatisfy { byte in
            (byte >= 0x30 && byte <= 0x39) || (byte >= 0x41 && byte <= 0x5A) || (byte >= 0x61 && byte <= 0x7A)
                || byte == UInt8(ascii: "-") || byte == UInt8(ascii: "_") || byte == UInt8(ascii: ".")
        }
        return word && !text.isEmpty && text.utf8.count <= 12 && !touches(text, secrets)
            ? "'\(text)'" : "a text of \(text.count) characters"
    }
}
