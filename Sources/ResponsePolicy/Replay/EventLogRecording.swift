import Foundation

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// The engine's own events as a replay: the JSON lines of `policy fetch --verbose` (stderr),
/// `policy simulate --format json`, or the `log` observer (`observe: [{use: log}]`).
///
/// Each request id's `response` events are its attempts' answers, in order: the status and the
/// business code (put back where the live policy's `classify.code` reads it) or the error class;
/// an answer's latency is from its `send`. Its `outcome` is what the recording shows it came to.
/// A `refresh-start` without a reason and the `refresh-end` after it are a token call (ok, or a
/// failure with the status it carried; no status: transient). Lines that are not JSON objects
/// (other stderr output) are skipped; a line that starts with `{` and is not valid JSON is an
/// error at its line and column.
///
/// Events carry no headers or bodies, so a replay from them knows only statuses, codes and error
/// classes: a rule on a header (`when: header`) or a `Retry-After` is not seen.
package final class EventLogRecording: ReplaySource {
    let file: String
    let limits: ReplayLimits
    /// Where the live policy reads business codes, to put them back into a body or header.
    let classify: CodeSource?
    private let descriptor: Int32
    private var buffer = [UInt8](repeating: 0, count: 1 << 16)
    private var bufferStart = 0
    private var bufferEnd = 0
    private var atEnd = false
    private var lineNumber = 0
    private var origin: Double?
    private var tokens = TokenCallWindow()
    private(set) package var stats = ReplayStats()
    /// Requests seen, in the order of their first event, until they leave.
    private var requests: [Partial] = []
    private var requestsHead = 0
    private var openIDs: [String: Int] = [:]
    private var base = 0
    private var flightStart: [String: Double] = [:]
    private var finished = false

    struct Partial {
        var id: String
        var start: Double
        var method = "GET"
        var path = "/"
        var sends: [Double] = []
        var responses: [SimulationScript.Response] = []
        var recorded = RecordedOutcome()
        var complete = false
        var position: TextPosition
    }

    /// The longest line read: `1 MiB` (an event is a few hundred bytes).
    package static let maxLineBytes = 1 << 20

    /// Opens `path`; `policy` says where business codes go back into an answer.
    /// - Throws: ``ReplayInputError`` when it cannot be opened.
    package init(path: String, policy: Policy, limits: ReplayLimits = ReplayLimits()) throws(ReplayInputError) {
        file = path
        self.limits = limits
        classify = policy.graph.scopes.last?.classify
        let descriptor = open(path, O_RDONLY)
        guard descriptor >= 0 else {
            let reason = errno == ENOENT ? "no such file or directory" : String(cString: strerror(errno))
            throw ReplayInputError(file: path, position: nil, message: "cannot read '\(path)': \(reason)")
        }
        self.descriptor = descriptor
    }

    deinit { close(descriptor) }

    package func tokenCalls(since: Duration) -> [RecordedTokenCall] { tokens.since(since) }

    package func next() throws(ReplayInputError) -> ReplayRequest? {
        while true {
            if requestsHead < requests.count, requests[requestsHead].complete || finished {
                let partial = requests[requestsHead]
                requests[requestsHead].responses = []
                requestsHead += 1
                openIDs[partial.id] = nil
                if requestsHead > 4096, requestsHead * 2 > requests.count {
                    base += requestsHead
                    requests.removeFirst(requestsHead)
                    requestsHead = 0
                }
                stats.requests += 1
                return request(partial)
            }
            if finished { return nil }
            guard let line = try nextLine() else {
                finished = true
                continue
            }
            try read(line)
        }
    }

    private func request(_ partial: Partial) -> ReplayRequest {
        var request = SimulationScript.Request(id: partial.id)
        request.at = .seconds(max(0, partial.start - (origin ?? partial.start)))
        request.method = partial.method
        request.path = partial.path
        request.responses = partial.responses
        return ReplayRequest(request: request, recorded: partial.recorded, position: partial.position)
    }

    // MARK: - Lines

    private func nextLine() throws(ReplayInputError) -> [UInt8]? {
        while true {
            if let newline = buffer[bufferStart..<bufferEnd].firstIndex(of: 0x0A) {
                let line = Array(buffer[bufferStart..<newline])
                bufferStart = newline + 1
                lineNumber += 1
                return line
            }
            if atEnd {
                guard bufferStart < bufferEnd else { return nil }
                let line = Array(buffer[bufferStart..<bufferEnd])
                bufferStart = bufferEnd
                lineNumber += 1
                return line
            }
            if bufferEnd - bufferStart >= Self.maxLineBytes {
                throw ReplayInputError(
                    file: file, position: TextPosition(line: lineNumber + 1, column: 1),
                    message: "a line longer than \(Self.maxLineBytes) bytes; an event is one short JSON line")
            }
            // Move what is left to the front and read more behind it.
            if bufferStart > 0 {
                buffer.replaceSubrange(0..<(bufferEnd - bufferStart), with: buffer[bufferStart..<bufferEnd])
                bufferEnd -= bufferStart
                bufferStart = 0
            }
            if bufferEnd == buffer.count { buffer += [UInt8](repeating: 0, count: buffer.count) }
            let read = buffer.withUnsafeMutableBytes { raw in
                readBytes(descriptor, raw.baseAddress.map { $0 + bufferEnd }, raw.count - bufferEnd)
            }
            guard read >= 0 else {
                throw ReplayInputError(
                    file: file, position: nil, message: "cannot read the file: \(String(cString: strerror(errno)))")
            }
            if read == 0 { atEnd = true } else { bufferEnd += read }
        }
    }

    private func read(_ line: [UInt8]) throws(ReplayInputError) {
        stats.entries += 1
        guard let first = line.firstIndex(where: { $0 != 0x20 && $0 != 0x09 && $0 != 0x0D }), line[first] == 0x7B else {
            stats.skipped += 1
            return
        }
        let reader = JSONStreamReader(bytes: line, file: file, line: lineNumber)
        let value = try reader.readValue(stringLimit: limits.maxStringBytes, maxMembers: 100)
        guard try reader.isAtEnd() else { throw reader.error("text after the event's JSON object") }
        let position = TextPosition(line: lineNumber, column: 1)
        guard let kind = value["event"]?.string else {
            stats.skipped += 1
            return
        }
        guard let t = value["t"]?.number else {
            if kind == "summary" { return }
            throw ReplayInputError(file: file, position: position, message: "an event without 't' (its time)")
        }
        if origin == nil { origin = t }
        let id = value["request"]?.string
        switch kind {
        case "refresh-start":
            if value["reason"] == nil, let id { flightStart[id] = t }
        case "refresh-end":
            guard let id, let start = flightStart.removeValue(forKey: id) else { return }
            stats.tokenCalls += 1
            let ok = value["ok"] == .bool(true)
            var step = SimulationScript.RefreshStep()
            step.after = .seconds(max(0, t - start))
            if !ok {
                if let status = value["status"]?.number {
                    step.result = .fail
                    step.status = Int(status)
                } else {
                    // No answer's status: transient when the engine's reason says the endpoint gave
                    // none, else definitive (a plugin's failure without an answer is taken at its word).
                    let reason = value["reason"]?.string?.lowercased() ?? ""
                    let transient = ["no answer", "transient", "timed out", "timeout", "connection", "unavailable"]
                    step.result = transient.contains { reason.contains($0) } ? .transient : .fail
                }
            }
            tokens.append(RecordedTokenCall(at: .seconds(max(0, start - (origin ?? start))), step: step))
        case "send", "response", "outcome", "queued", "held", "wait", "cancel":
            guard let id else { return }
            let index = partialIndex(id, at: t, position: position)
            if let method = value["method"]?.string, !method.isEmpty { requests[index].method = method }
            if let path = value["path"]?.string, !path.isEmpty { requests[index].path = path }
            switch kind {
            case "send":
                requests[index].sends.append(t)
            case "response":
                guard requests[index].responses.count < limits.maxAttemptsPerRequest else { return }
                let sent = requests[index].sends.last ?? t
                var response = answer(value)
                response.latency = .seconds(max(0, t - sent))
                requests[index].responses.append(response)
            case "outcome":
                requests[index].complete = true
                let result = value["result"]?.string.flatMap(PolicyEvent.Result.init(rawValue:))
                requests[index].recorded = RecordedOutcome(
                    result: result, status: value["status"]?.number.map { Int($0) }, code: value["code"]?.string)
            default:
                break
            }
        default:
            return
        }
    }

    /// The request `id`'s place, made at its first event.
    private func partialIndex(_ id: String, at t: Double, position: TextPosition) -> Int {
        if let number = openIDs[id] { return number - base }
        requests.append(Partial(id: id, start: t, position: position))
        openIDs[id] = base + requests.count - 1
        if openIDs.count > limits.maxOpenRequests,
            let oldest = requests[requestsHead...].firstIndex(where: { !$0.complete })
        {
            requests[oldest].complete = true
            stats.forcedClosed += 1
        }
        return requests.count - 1
    }

    /// A `response` event as the answer that makes it: its status and its code where the live
    /// policy reads codes, or its error class.
    private func answer(_ event: JSONValue) -> SimulationScript.Response {
        var response = SimulationScript.Response()
        if let error = event["error"]?.string {
            response.error = TransportErrorClass(rawValue: error) ?? .connection
            return response
        }
        response.status = event["status"]?.number.map { Int($0) } ?? 200
        guard let code = event["code"]?.string else { return response }
        switch classify {
        case .header(let name)?: response.headers = [(name, code)]
        case .body(let path)?: response.body = Self.body(code: code, at: path)
        default: break
        }
        return response
    }

    /// `{"status":1401}` for `status`; `{"errors":[{"code":"E1"}]}` for `errors.0.code`: the
    /// smallest JSON body that holds `code` at `path` (a number when it reads as one).
    static func body(code: String, at path: String) -> String {
        let isNumber = Int64(code) != nil
        var json = isNumber ? code : PolicyEvent.quote(code)
        for part in path.split(separator: ".").reversed() {
            if let index = Int(part), index >= 0, index < 64 {
                json = "[" + String(repeating: "null,", count: index) + json + "]"
            } else {
                json = "{" + PolicyEvent.quote(String(part)) + ":" + json + "}"
            }
        }
        return json
    }
}

/// `read(2)`, named apart from the recording's own `read`.
private func readBytes(_ descriptor: Int32, _ buffer: UnsafeMutableRawPointer?, _ count: Int) -> Int {
    read(descriptor, buffer, count)
}
