import Foundation

/// A HAR 1.2 file (HTTP Archive: browsers' developer tools, Playwright, mitmproxy's `hardump`,
/// Charles) read as a replay: its `log.entries` one at a time, never the whole file.
///
/// Each entry is an exchange: a request (`startedDateTime`, `method`, `url`, `headers`,
/// `postData.text`) and its answer (`response.status`, `headers`, `content.text`, base64 when
/// `content.encoding` says so) after `time` milliseconds; a `status` of 0 or less (or an
/// `_error`) is an attempt that got no answer. An entry whose URL path is the token endpoint's
/// (`tokenPaths`) is a token call, one whose path is a logout endpoint's (`logoutPaths`) a logout
/// call; any other `http`/`https` entry is an attempt of a request (``ReplayChains`` gathers
/// retries and re-sends into their request).
///
/// Only what a replay needs is kept: bodies cut at ``ReplayLimits/maxBodyBytes``, no cookie,
/// `Authorization` or `Set-Cookie` header, no token from a token endpoint's answer. Entries are
/// sorted by start within ``ReplayLimits/reorderWindow``; one further out of order is an error.
package final class HARRecording: ReplaySource {
    let reader: JSONStreamReader
    let limits: ReplayLimits
    let tokenPaths: Set<String>
    let logoutPaths: Set<String>
    /// Request headers a replay sends (the rest stay behind): the idempotency key headers the
    /// policy names, and `Content-Type`.
    let keptRequestHeaders: Set<String>
    private var chains: ReplayChains
    private var tokens = TokenCallWindow()
    private(set) package var stats = ReplayStats()
    /// Entries read, not yet given to the chains, sorted by start.
    private var pending: [Exchange] = []
    /// The first of `pending` not given yet.
    private var pendingHead = 0
    private var latestStart = -Double.infinity
    private var state = State.start
    private var finished = false

    enum State {
        case start
        case inEntries
        case done
    }

    struct Exchange {
        var start: Double
        /// Its `time`: what a replay waits before answering.
        var duration: Double
        /// The least it can have taken (``HARRecording/shortestDuration(of:)``): what its end is
        /// compared with a later exchange's start by.
        var shortest: Double
        var method: String
        var url: String
        var path: String
        var headers: [(String, String)]
        var body: String?
        var response: SimulationScript.Response
        var responseBody: String
        var retryAfter: String?
        /// A hash of the request's `Authorization` (or, without one, `Cookie`) value: whether two
        /// attempts carried the same credential, without keeping it.
        var credential: Int?
        var position: TextPosition
    }

    /// Opens `path`; the live `policy` judges which answers a recorded client sent again.
    /// - Throws: ``ReplayInputError`` when the file cannot be opened.
    package init(
        path: String, policy: Policy, tokenPaths: Set<String>, logoutPaths: Set<String>,
        limits: ReplayLimits = ReplayLimits()
    ) throws(ReplayInputError) {
        reader = try JSONStreamReader(path: path)
        self.limits = limits
        self.tokenPaths = tokenPaths
        self.logoutPaths = logoutPaths
        var kept: Set<String> = ["content-type"]
        for scope in policy.graph.scopes {
            if let key = scope.retry.idempotencyKey { kept.insert(key.lowercased()) }
            for flow in scope.compiled { if let key = flow.retry.idempotencyKey { kept.insert(key.lowercased()) } }
        }
        keptRequestHeaders = kept
        chains = ReplayChains(policy: policy, limits: limits)
    }

    package func tokenCalls(since: Duration) -> [RecordedTokenCall] { tokens.since(since) }

    package func next() throws(ReplayInputError) -> ReplayRequest? {
        while true {
            if let ready = chains.next(flush: finished) {
                stats.requests += 1
                return ready
            }
            if finished {
                stats.forcedClosed = chains.forcedClosed
                return nil
            }
            try readMore()
        }
    }

    // MARK: - Reading

    /// Reads one more entry (or the end), moving entries past the reorder window to the chains.
    private func readMore() throws(ReplayInputError) {
        if state == .start { try findEntries() }
        if state == .inEntries, try reader.nextElement() {
            _ = try reader.peekValue()  // the entry's own place, past the whitespace before it
            let position = reader.position
            let value = try reader.readValue(stringLimit: limits.maxBodyBytes * 4 / 3 + 4, maxMembers: 1000)
            stats.entries += 1
            let window = limits.reorderWindow.seconds
            if let exchange = try exchange(value, at: position) {
                guard exchange.start >= latestStart - window else {
                    throw ReplayInputError(
                        file: reader.file, position: position,
                        message:
                            "entry \(stats.entries) starts \(PolicyEvent.seconds(.seconds(latestStart - exchange.start)))s "
                            + "before an entry listed earlier; entries must be in time order (within "
                            + "\(limits.reorderWindow.policyText))")
                }
                insert(exchange)
                latestStart = max(latestStart, exchange.start)
            }
            while pendingHead < pending.count, pending[pendingHead].start < latestStart - window {
                give(pending[pendingHead])
                pendingHead += 1
            }
            if pendingHead > 1024, pendingHead * 2 > pending.count {
                pending.removeFirst(pendingHead)
                pendingHead = 0
            }
            return
        }
        if state == .inEntries {
            state = .done
            try finishDocument()
        }
        for exchange in pending[pendingHead...] { give(exchange) }
        pending = []
        pendingHead = 0
        finished = true
    }

    /// Walks from the document's start to the first element of `log.entries`, skipping what
    /// comes before it (`version`, `creator`, `pages`).
    private func findEntries() throws(ReplayInputError) {
        guard try reader.peekValue() == UInt8(ascii: "{") else {
            throw reader.error("not a HAR file: expected a JSON object with 'log'")
        }
        try reader.beginObject()
        while let key = try reader.nextKey() {
            guard key == "log" else {
                try reader.skipValue()
                continue
            }
            guard try reader.peekValue() == UInt8(ascii: "{") else { throw reader.error("'log' must be an object") }
            try reader.beginObject()
            while let member = try reader.nextKey() {
                guard member == "entries" else {
                    try reader.skipValue()
                    continue
                }
                guard try reader.peekValue() == UInt8(ascii: "[") else {
                    throw reader.error("'log.entries' must be an array")
                }
                try reader.beginArray()
                state = .inEntries
                return
            }
            throw reader.error("not a HAR file: 'log' has no 'entries'")
        }
        throw reader.error("not a HAR file: no 'log' object")
    }

    /// Reads what follows `entries` to the end of the document, checking it is well formed.
    private func finishDocument() throws(ReplayInputError) {
        while try reader.nextKey() != nil { try reader.skipValue() }  // the rest of `log`
        while try reader.nextKey() != nil { try reader.skipValue() }  // the rest of the document
        guard try reader.isAtEnd() else { throw reader.error("text after the HAR document's end") }
    }

    private func insert(_ exchange: Exchange) {
        // Nearly always in order: the end of the array.
        var index = pending.count
        while index > pendingHead, pending[index - 1].start > exchange.start { index -= 1 }
        pending.insert(exchange, at: index)
    }

    /// Hands an exchange, in start order, to the token calls or the chains.
    private func give(_ exchange: Exchange) {
        chains.noteStart(exchange.start)
        if tokenPaths.contains(exchange.path) {
            stats.tokenCalls += 1
            chains.tokenCallEnded(at: exchange.start + exchange.shortest)
            let error = exchange.response.error != nil
            tokens.append(
                RecordedTokenCall(
                    at: chains.offset(exchange.start),
                    step: refreshStep(
                        status: error ? nil : exchange.response.status, body: exchange.responseBody,
                        retryAfter: exchange.retryAfter, duration: .seconds(exchange.duration), error: error)))
            return
        }
        if logoutPaths.contains(exchange.path) {
            stats.logoutCalls += 1
            return
        }
        var response = exchange.response
        response.body = exchange.responseBody
        chains.add(
            key: exchange.method + " " + exchange.url + "\n" + (exchange.body ?? ""), start: exchange.start,
            end: exchange.start + exchange.shortest, method: exchange.method, path: exchange.path,
            headers: exchange.headers, body: exchange.body, response: response, credential: exchange.credential,
            position: exchange.position)
    }

    // MARK: - One entry

    /// The least the exchange can have taken, in seconds: its `time`, but no more than its
    /// `timings` add up to without `ssl`. A re-send starts after the answer it follows has ended,
    /// so it is this end, not `time`'s, that a re-send (or a token call's end) is ordered by.
    /// Recorders disagree on `ssl`: HAR 1.2 counts it inside `connect`; mitmproxy outside, adding it
    /// to `time` once; Playwright inside, adding it to `time` again, and over plain HTTP its `ssl` is
    /// the whole connect phase plus a millisecond. By `time`, a 1401 answered after the refresh and
    /// sent again at once ended after its re-send began, and the re-send read as a request of its
    /// own (a CI run's Chromium recording met it).
    static func shortestDuration(of entry: JSONValue) -> Double {
        let time = max(0, entry["time"]?.number ?? 0)
        guard let timings = entry["timings"], case .object = timings else { return time / 1000 }
        var phases = 0.0
        for phase in ["blocked", "dns", "connect", "send", "wait", "receive"] {
            if let milliseconds = timings[phase]?.number, milliseconds > 0 { phases += milliseconds }
        }
        return (phases > 0 ? min(time, phases) : time) / 1000
    }

    /// The entry as an exchange; `nil` for one a replay does not send (not http or https).
    private func exchange(_ entry: JSONValue, at position: TextPosition) throws(ReplayInputError) -> Exchange? {
        func fail(_ message: String) -> ReplayInputError {
            ReplayInputError(file: reader.file, position: position, message: "entry \(stats.entries): \(message)")
        }
        guard case .object = entry else { throw fail("an entry must be an object") }
        guard let started = entry["startedDateTime"]?.string else { throw fail("no 'startedDateTime'") }
        guard let start = Self.parseDate(started) else {
            throw fail("'startedDateTime' is not an ISO 8601 date and time")
        }
        let duration = max(0, entry["time"]?.number ?? 0) / 1000
        guard let request = entry["request"], case .object = request else { throw fail("no 'request' object") }
        guard let method = request["method"]?.string, !method.isEmpty, method.count <= 32 else {
            throw fail("no 'request.method'")
        }
        guard let urlText = request["url"]?.string, let url = URL(string: urlText) else {
            throw fail("'request.url' is not a URL")
        }
        guard let scheme = url.scheme?.lowercased(), scheme == "http" || scheme == "https" else {
            stats.skipped += 1
            return nil
        }
        var path = url.path
        if path.isEmpty { path = "/" }
        var headers: [(String, String)] = []
        var authorization: String?
        var cookie: String?
        for header in (request["headers"]?.array ?? []).prefix(limits.maxHeaders) {
            guard let name = header["name"]?.string, let value = header["value"]?.string else { continue }
            let lowered = name.lowercased()
            if keptRequestHeaders.contains(lowered) { headers.append((name, value)) }
            if lowered == "authorization" { authorization = value }
            if lowered == "cookie" { cookie = value }
        }
        let credential = (authorization ?? cookie).map { $0.hashValue }
        let body = request["postData"]?["text"]?.string
        guard let answer = entry["response"], case .object = answer else { throw fail("no 'response' object") }
        var response = SimulationScript.Response()
        response.latency = .seconds(duration)
        let status = Int(answer["status"]?.number ?? 0)
        let failure = answer["_error"]?.string ?? entry["_error"]?.string
        var retryAfter: String?
        if status <= 0 || failure != nil && status <= 0 {
            response.error = Self.errorClass(failure)
        } else {
            guard (100...999).contains(status) else { throw fail("'response.status' \(status) is not an HTTP status") }
            response.status = status
            for header in (answer["headers"]?.array ?? []).prefix(limits.maxHeaders) {
                guard let name = header["name"]?.string, let value = header["value"]?.string else { continue }
                let lowered = name.lowercased()
                // Never carried into a replay: what could hold a secret, or what HTTP/2 adds.
                if lowered == "set-cookie" || lowered.hasPrefix(":") { continue }
                if lowered == "retry-after" { retryAfter = value }
                response.headers.append((name, String(value.prefix(limits.maxStringBytes))))
            }
        }
        var text = ""
        if let content = answer["content"], let raw = content["text"]?.string {
            if content["encoding"]?.string?.lowercased() == "base64" {
                let usable = raw.prefix(raw.count - raw.count % 4)
                text =
                    Data(base64Encoded: String(usable), options: .ignoreUnknownCharacters).map {
                        String(decoding: $0.prefix(limits.maxBodyBytes), as: UTF8.self)
                    } ?? ""
            } else {
                text = String(decoding: raw.utf8.prefix(limits.maxBodyBytes), as: UTF8.self)
            }
        }
        return Exchange(
            start: start, duration: duration, shortest: Self.shortestDuration(of: entry), method: method.uppercased(),
            url: urlText, path: path,
            headers: headers, body: body.map { String(decoding: $0.utf8.prefix(limits.maxBodyBytes), as: UTF8.self) },
            response: response, responseBody: text, retryAfter: retryAfter, credential: credential,
            position: position)
    }

    /// A browser's or proxy's error text as the transport error class the policy's `error:`
    /// conditions name.
    static func errorClass(_ text: String?) -> TransportErrorClass {
        let upper = (text ?? "").uppercased()
        if upper.contains("TIMED_OUT") || upper.contains("TIMEOUT") { return .timeout }
        if upper.contains("NAME_NOT_RESOLVED") || upper.contains("DNS") { return .dns }
        if upper.contains("CERT") || upper.contains("SSL") || upper.contains("TLS") { return .tls }
        return .connection
    }

    /// `2026-01-01T00:00:00Z`, `…00.123Z`, `…00.123456+01:00`: seconds since the epoch.
    static func parseDate(_ text: String) -> Double? {
        let bytes = Array(text.utf8)
        func digits(_ from: Int, _ count: Int) -> Int? {
            guard from + count <= bytes.count else { return nil }
            var value = 0
            for index in from..<(from + count) {
                let byte = bytes[index]
                guard byte >= 0x30, byte <= 0x39 else { return nil }
                value = value * 10 + Int(byte - 0x30)
            }
            return value
        }
        guard bytes.count >= 19, let year = digits(0, 4), bytes[4] == 0x2D, let month = digits(5, 2),
            bytes[7] == 0x2D, let day = digits(8, 2), bytes[10] == 0x54 || bytes[10] == 0x20,
            let hour = digits(11, 2), bytes[13] == 0x3A, let minute = digits(14, 2), bytes[16] == 0x3A,
            let second = digits(17, 2), (1...12).contains(month), (1...31).contains(day), hour < 24, minute < 60,
            second < 61
        else { return nil }
        var index = 19
        var fraction = 0.0
        if index < bytes.count, bytes[index] == 0x2E {
            index += 1
            var scale = 0.1
            while index < bytes.count, bytes[index] >= 0x30, bytes[index] <= 0x39 {
                fraction += Double(bytes[index] - 0x30) * scale
                scale /= 10
                index += 1
            }
        }
        var offset = 0
        if index < bytes.count {
            switch bytes[index] {
            case 0x5A, 0x7A: index += 1  // Z
            case 0x2B, 0x2D:
                let sign = bytes[index] == 0x2D ? -1 : 1
                guard let hours = digits(index + 1, 2) else { return nil }
                var minutesAt = index + 3
                if minutesAt < bytes.count, bytes[minutesAt] == 0x3A { minutesAt += 1 }
                let minutes = digits(minutesAt, 2) ?? 0
                offset = sign * (hours * 3600 + minutes * 60)
                index = bytes.count
            default: return nil
            }
        }
        // Days since 1970-01-01 (proleptic Gregorian), Howard Hinnant's days_from_civil.
        let y = month <= 2 ? year - 1 : year
        let era = (y >= 0 ? y : y - 399) / 400
        let yearOfEra = y - era * 400
        let dayOfYear = (153 * (month + (month > 2 ? -3 : 9)) + 2) / 5 + day - 1
        let dayOfEra = yearOfEra * 365 + yearOfEra / 4 - yearOfEra / 100 + dayOfYear
        let days = era * 146_097 + dayOfEra - 719_468
        return Double(days * 86400 + hour * 3600 + minute * 60 + second - offset) + fraction
    }
}
