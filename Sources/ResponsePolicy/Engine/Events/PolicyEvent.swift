import Foundation

/// Something the engine did, as `policy simulate --format json` prints it and observers see it.
///
/// Events name requests, rules and actions and carry statuses and business codes; they never
/// carry headers, bodies or tokens.
public struct PolicyEvent: Sendable, Hashable {
    /// What an event is about; its raw value is the `event` field of `policy simulate --format json`.
    public enum Kind: String, Sendable, Hashable {
        /// An attempt leaves the engine; its `attempt-timeout` starts here.
        case send
        /// An attempt's response (`status`, `code`, the matched `rule` and `action`), or its
        /// transport `error` when it got none.
        case response
        /// A wait before the next attempt (a backoff, a `Retry-After`): `delay`.
        case wait
        /// A request on the wire or waiting was cancelled: `reason` is `logout` when another
        /// request's logout ended it, otherwise the caller cancelled it.
        case cancel
        /// A request ended: `result`, with `reason` for a failure.
        case outcome
        /// The session was logged out: `rule` and `reason` say why.
        case logout
        /// A reload of the policy: `ok`, and `reason` when it was refused.
        case reload
        /// A request waits in the engine for one of its host's dispatch slots
        /// (`dispatch.max-in-flight-per-host`); its `send` follows when it leaves. The wait is
        /// bounded by the request's deadline alone: its attempt timeout starts with the `send`.
        case queued
        /// A request about to go out (a first attempt or a retry) waits for the refresh in
        /// flight, to be signed with the fresh token.
        case held
        /// Something the engine could not do that does not end a request: a plugin that could
        /// not be made, a credential store that could not be read or written.
        case problem
        /// A refresh begins (`reason`: what triggered it).
        case refreshStart = "refresh-start"
        /// A refresh ended: `ok`, and `reason` when it failed.
        case refreshEnd = "refresh-end"
        /// A refresh met transient trouble (`status`, `reason`) and calls its plugin again after
        /// `delay`, within `refresh.timeout`; `attempt` is the call that failed.
        case refreshRetry = "refresh-retry"
    }

    /// How a request ended.
    public enum Result: String, Sendable, Hashable {
        /// A response was handed to the caller.
        case delivered
        /// An error was thrown: the deadline passed, a `fail` rule, a failed refresh, a transport error.
        case failed
        /// The caller cancelled its own request.
        case cancelled
        /// A logout ended it: the trigger itself, one it cancelled, or one refused during the cooldown.
        case loggedOut = "logged-out"
    }

    /// What the event is about.
    public var kind: Kind
    /// The engine clock's time (virtual seconds in a simulation).
    public var time: Duration
    /// The request's id, on events about a request.
    public var request: String?
    /// The attempt, from 1, on events about one.
    public var attempt: Int?
    /// The response's status code.
    public var status: Int?
    /// The business code the policy's `classify:` read from the response, if any.
    public var code: String?
    /// The transport error class of an attempt that got no response.
    public var error: TransportErrorClass?
    /// The name of the rule that matched.
    public var rule: String?
    /// What the matched rule does.
    public var action: ActionKind?
    /// Whether a refresh (`refresh-end`) or reload (`reload`) succeeded.
    public var ok: Bool?
    /// How long a `wait` (a backoff, a `Retry-After`) or a refresh retry waits.
    public var delay: Duration?
    /// How the request ended, on its `outcome` event.
    public var result: Result?
    /// A short explanation (why a request failed, why a reload was refused). Never a secret.
    public var reason: String?
    /// The request's method, on events about a request (set by the engine when it emits them).
    public var method: String?
    /// The request's path, never its query or fragment (which may carry tokens).
    public var path: String?
    /// The wall-clock time of the event (the engine clock's `date`), beside ``time``.
    public var date: Date?

    /// How much an event matters to an operator, lowest first.
    public enum Level: String, Sendable, Hashable, Comparable, CaseIterable {
        /// Every request's steps: `send`, `response`, `wait`, `queued`, `held`.
        case debug
        /// The normal course: a refresh, a reload, a cancel, an outcome but `failed` and `logged-out`.
        case info
        /// A failed refresh or refresh retry, a logout, a `failed` or `logged-out` outcome.
        case warning
        /// What needs an operator: a refused reload, a `problem`.
        case error

        /// Levels order from `debug` to `error`.
        public static func < (a: Level, b: Level) -> Bool {
            allCases.firstIndex(of: a) ?? 0 < allCases.firstIndex(of: b) ?? 0
        }
    }

    /// The event's level: `debug` for each attempt's `send`, `response`, `wait` and `queued`; `info` for
    /// refreshes, accepted reloads, cancellations and delivered or cancelled outcomes; `warning`
    /// for a failed refresh, a logout and a failed or logged-out outcome; `error` for a
    /// `problem` and a refused reload (something an operator must fix).
    public var level: Level {
        switch kind {
        case .send, .response, .wait, .queued, .held: return .debug
        case .cancel, .refreshStart: return .info
        case .refreshEnd: return ok == false ? .warning : .info
        case .refreshRetry: return .warning
        case .reload: return ok == false ? .error : .info
        case .logout: return .warning
        case .problem: return .error
        case .outcome:
            switch result {
            case .failed?, .loggedOut?: return .warning
            default: return .info
            }
        }
    }
    /// The compiled graph's edge a decision took (``RuleGraph/Edge/id``), for checking the
    /// engine against the graph; not part of the printed event.
    package var edge: String?
    /// The scope (``RuleGraph/Scope/id``: `default`, `route-N`) of the request an `outcome` is
    /// about, for ``PolicyMetrics``' labels; not part of the printed event.
    package var scope: String?
    /// A bounded class of what the event reports (``Category``), for ``PolicyMetrics``' labels:
    /// a `refresh-end`'s result, a failed `outcome`'s reason, a `logout`'s cause. Never free text;
    /// not part of the printed event.
    package var category: Category?
    /// The cooldown a `logout` started; not part of the printed event.
    package var cooldown: Duration?

    /// What a `refresh-end`, a failed `outcome` or a `logout` was, in a word fit for a metric's
    /// label (`snake_case`, a fixed set): the engine sets it where it builds the event, so a
    /// metric never parses a reason's text.
    package enum Category: String, Sendable, Hashable, CaseIterable {
        // refresh-end
        /// New tokens.
        case ok
        /// The token endpoint's answer cannot succeed if asked again (`on-failure` decides).
        case definitive
        /// Trouble that may pass (5xx, 429, no answer); retried within `refresh.timeout`.
        case transient
        /// The session's coordination store was unavailable; nobody was logged out.
        case coordination
        /// The session changed during the refresh (a sign-in or a logout): its result was not used.
        case superseded
        /// Its waiters were released at `refresh.timeout`; the call runs on.
        case timeout
        /// No call: the last answer for these credentials was definitive, a moment ago.
        case remembered
        /// No call: `refresh.limit` reached.
        case limited
        /// No call: the token endpoint's `Retry-After` runs past `refresh.timeout`.
        case retryAfter = "retry_after"
        // a failed outcome
        case retriesExhausted = "retries_exhausted"
        /// A `fail` rule matched.
        case rule
        case refreshFailed = "refresh_failed"
        case deadline
        case transport
        /// A retry the retry budget refused.
        case budget
        /// A retry the method did not allow.
        case notRetryable = "not_retryable"
        // logout (also `rule` and `refreshFailed`)
        /// The host called ``PolicyEngine/logout(reason:)``.
        case host
        /// Another process sharing the session logged out.
        case fleet
    }

    /// An event about the request of `context` (none when `nil`), with its id, method and path.
    init(_ kind: Kind, time: Duration, context: RequestContext?) {
        self.init(kind, time: time, request: context?.id)
        method = context?.method
        path = context?.path
    }

    package init(_ kind: Kind, time: Duration, request: String? = nil) {
        self.kind = kind
        self.time = time
        self.request = request
    }

    /// How ``logLine(_:)`` writes an event.
    package enum LogFormat: String, Sendable, Hashable, CaseIterable {
        /// One JSON object per line, `time` and `level` first.
        case json
        /// `key=value` pairs (Heroku / Go `slog` text style), values quoted when they need it.
        case logfmt
    }

    /// The event as one log line with the wall-clock time (ISO 8601, UTC, milliseconds), the
    /// level, the request's method and path, and the fields of ``jsonLine``:
    ///
    /// ```
    /// {"time":"2026-01-01T00:00:00.050Z","level":"info","t":0.05,"event":"refresh-end","request":"r1","method":"GET","path":"/profile","ok":true}
    /// time=2026-01-01T00:00:00.050Z level=info t=0.05 event=refresh-end request=r1 method=GET path=/profile ok=true
    /// ```
    package func logLine(_ format: LogFormat) -> String {
        var fields: [(String, String, quoted: Bool)] = []
        if let date { fields.append(("time", Self.iso8601(date), true)) }
        fields.append(("level", level.rawValue, true))
        fields.append(("t", Self.seconds(time), false))
        fields.append(("event", kind.rawValue, true))
        if let request { fields.append(("request", request, true)) }
        if let method { fields.append(("method", method, true)) }
        if let path { fields.append(("path", path, true)) }
        if let attempt { fields.append(("attempt", String(attempt), false)) }
        if let status { fields.append(("status", String(status), false)) }
        if let code { fields.append(("code", code, true)) }
        if let error { fields.append(("error", error.rawValue, true)) }
        if let rule { fields.append(("rule", rule, true)) }
        if let action { fields.append(("action", action.rawValue, true)) }
        if let ok { fields.append(("ok", String(ok), false)) }
        if let delay { fields.append(("delay", Self.seconds(delay), false)) }
        if let result { fields.append(("result", result.rawValue, true)) }
        if let reason { fields.append(("reason", reason, true)) }
        switch format {
        case .json:
            return "{"
                + fields.map { Self.quote($0.0) + ":" + ($0.quoted ? Self.quote($0.1) : $0.1) }
                .joined(separator: ",") + "}"
        case .logfmt:
            return fields.map { $0.0 + "=" + Self.logfmtValue($0.1) }.joined(separator: " ")
        }
    }

    /// A logfmt value: bare when it has no space, quote, `=` or control character, else quoted.
    static func logfmtValue(_ text: String) -> String {
        let plain =
            !text.isEmpty
            && !text.unicodeScalars.contains { $0 == " " || $0 == "\"" || $0 == "=" || $0 == "\\" || $0.value < 0x20 }
        return plain ? text : quote(text)
    }

    /// `2026-01-01T00:00:00.050Z`.
    static func iso8601(_ date: Date) -> String {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        return formatter.string(from: date)
    }

    /// The event as one JSON object, keys in a fixed order:
    /// `{"t":0.05,"request":"a","event":"response","attempt":1,"status":200,"code":"1401",...}`.
    public var jsonLine: String {
        var out = "{\"t\":" + Self.seconds(time)
        if let request { out += ",\"request\":" + Self.quote(request) }
        out += ",\"event\":\"" + kind.rawValue + "\""
        if let attempt { out += ",\"attempt\":\(attempt)" }
        if let status { out += ",\"status\":\(status)" }
        if let code { out += ",\"code\":" + Self.quote(code) }
        if let error { out += ",\"error\":\"" + error.rawValue + "\"" }
        if let rule { out += ",\"rule\":" + Self.quote(rule) }
        if let action { out += ",\"action\":\"" + action.rawValue + "\"" }
        if let ok { out += ",\"ok\":\(ok)" }
        if let delay { out += ",\"delay\":" + Self.seconds(delay) }
        if let result { out += ",\"result\":\"" + result.rawValue + "\"" }
        if let reason { out += ",\"reason\":" + Self.quote(reason) }
        return out + "}"
    }

    /// Seconds with up to 6 decimals, no trailing zeros: `0.05`, `2`, `0.000001`.
    package static func seconds(_ duration: Duration) -> String {
        let micros = Int64((duration.seconds * 1_000_000).rounded())
        let whole = micros / 1_000_000
        var fraction = String(abs(micros % 1_000_000))
        guard fraction != "0" else { return String(whole) }
        fraction = String(repeating: "0", count: 6 - fraction.count) + fraction
        while fraction.hasSuffix("0") { fraction.removeLast() }
        return (micros < 0 && whole == 0 ? "-" : "") + "\(whole).\(fraction)"
    }

    /// Whether a scalar at or above DEL is written as a `\u` escape: controls, format and
    /// separator characters, private use and unassigned code points.
    private static func escapedInJSON(_ scalar: Unicode.Scalar) -> Bool {
        switch scalar.properties.generalCategory {
        case .control, .format, .lineSeparator, .paragraphSeparator, .privateUse, .unassigned, .surrogate:
            return true
        default:
            return false
        }
    }

    /// `text` as a JSON string literal (RFC 8259 §7), for every JSON this package writes.
    package static func quote(_ text: String) -> String {
        var out = "\""
        for scalar in text.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            default:
                if scalar.value < 0x20 || (scalar.value >= 0x7F && Self.escapedInJSON(scalar)) {
                    // Also DEL, C1 controls, format characters (bidirectional overrides) and the
                    // line separators: valid JSON either way, but a terminal showing the line
                    // would act on them raw.
                    for unit in String(scalar).utf16 {
                        let hex = String(unit, radix: 16)
                        out += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
                    }
                } else {
                    out.unicodeScalars.append(scalar)
                }
            }
        }
        return out + "\""
    }
}
