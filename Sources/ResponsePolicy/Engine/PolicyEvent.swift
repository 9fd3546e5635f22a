/// Something the engine did, as `policy simulate --format json` prints it and observers see it.
///
/// Events name requests, rules and actions and carry statuses and business codes; they never
/// carry headers, bodies or tokens.
public struct PolicyEvent: Sendable, Hashable {
    public enum Kind: String, Sendable, Hashable {
        case send, response, wait, cancel, outcome, logout, reload
        /// Something the engine could not do that does not end a request: a plugin that could
        /// not be made, a credential store that could not be read or written.
        case problem
        case refreshStart = "refresh-start"
        case refreshEnd = "refresh-end"
    }

    /// How a request ended.
    public enum Result: String, Sendable, Hashable {
        case delivered, failed, cancelled
        case loggedOut = "logged-out"
    }

    public var kind: Kind
    /// The engine clock's time (virtual seconds in a simulation).
    public var time: Duration
    public var request: String?
    public var attempt: Int?
    public var status: Int?
    public var code: String?
    /// The transport error class of an attempt that got no response.
    public var error: TransportErrorClass?
    public var rule: String?
    public var action: ActionKind?
    public var ok: Bool?
    public var delay: Duration?
    public var result: Result?
    /// A short explanation (why a request failed, why a reload was refused). Never a secret.
    public var reason: String?
    /// The compiled graph's edge a decision took (``RuleGraph/Edge/id``), for checking the
    /// engine against the graph; not part of the printed event.
    package var edge: String?

    public init(_ kind: Kind, time: Duration, request: String? = nil) {
        self.kind = kind
        self.time = time
        self.request = request
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
                if scalar.value < 0x20 {
                    let hex = String(scalar.value, radix: 16)
                    out += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
                } else {
                    out.unicodeScalars.append(scalar)
                }
            }
        }
        return out + "\""
    }
}
