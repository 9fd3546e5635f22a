import CCurl
import Foundation
import ResponsePolicy

/// One exchange on the wire (one redirect hop): an easy handle, the request's body and headers
/// that libcurl reads from, the response as it arrives, and the one continuation to resume.
///
/// Concurrency contract: two kinds of fields. The easy handle, the header list and everything the
/// callbacks fill (``head``, ``body``, ``headerCount``, ``status``) are touched only on the loop's
/// thread once ``CurlLoop/add(_:)`` handed the transfer over (before that, only by the task that
/// made it). The outcome (``state``) is behind its own lock, because cancellation, the attempt
/// timeout and the loop race to finish the transfer: whoever takes the continuation out of the
/// state resumes it, after unlocking; the others find nothing to do. That split is why the
/// `@unchecked Sendable` is safe.
final class CurlTransfer: @unchecked Sendable {
    enum State {
        /// Made, not yet handed to the loop.
        case idle
        /// Stopped before it started: ``start`` resumes at once with this error.
        case stopped(any Error)
        case running(CheckedContinuation<HTTPResponse, any Error>)
        case finished
    }

    /// Why the transfer was ended from a callback (they can only return "abort" to libcurl).
    enum Abort {
        case tooLarge(String)
    }

    let state = Locked<State>(.idle)
    /// `METHOD url` with the URL redacted, for messages (made only when one is written).
    var label: String { "\(request.method) \(RedirectRules.redacted(request.url))" }
    let url: URL
    /// The largest decoded body accepted; `nil` for none.
    let limit: Int?
    let maxHeaders: Int
    /// Tells the engine the response has begun to arrive.
    let arriving: (@Sendable () -> Void)?
    /// The request body, kept alive (and at a fixed address) for libcurl's read callback.
    let requestBody: [UInt8]
    let sendsBody: Bool
    let isHead: Bool

    // Loop-thread fields (see the type's contract).
    var easy: UnsafeMutableRawPointer?
    var headerList: UnsafeMutablePointer<curl_slist>?
    var readOffset = 0
    var status = 0
    var head: [(String, String)] = []
    var headerCount = 0
    /// The current head's `Content-Encoding` (whether there is one) and last `Content-Length`,
    /// noted as the fields arrive.
    var encoded = false
    var announcedLength: Int?
    var body = Data()
    var abort: Abort?
    /// It was sent again on a new connection after its first connection failed it before any
    /// answer (``mayGoAgain``): once only.
    var sentAgain = false
    /// libcurl's message for a failure (`CURLOPT_ERRORBUFFER`); at a fixed address for the transfer's life.
    let errorBuffer: UnsafeMutablePointer<CChar>
    /// The request as it goes out (its headers and method are set on the handle by the loop).
    let request: HTTPRequest
    /// Where it goes: the loop admits a bounded number of transfers per origin.
    let origin: RedirectRules.Origin
    /// When the call's timeout ends: a transfer waiting for admission past it fails, and the
    /// rest is libcurl's `CURLOPT_TIMEOUT_MS` once it starts.
    let deadline: ContinuousClock.Instant

    init(
        request: HTTPRequest, limit: Int?, maxHeaders: Int, deadline: ContinuousClock.Instant,
        arriving: (@Sendable () -> Void)?
    ) {
        self.request = request
        origin = RedirectRules.origin(request.url)
        self.deadline = deadline
        errorBuffer = .allocate(capacity: Int(CURL_ERROR_SIZE) + 1)
        errorBuffer.initialize(repeating: 0, count: Int(CURL_ERROR_SIZE) + 1)
        url = request.url
        self.limit = limit
        self.maxHeaders = maxHeaders
        self.arriving = arriving
        isHead = request.method == "HEAD"
        if let body = request.body, !(body.isEmpty && request.method == "GET") {
            requestBody = [UInt8](body)
            sendsBody = true
        } else {
            requestBody = []
            sendsBody = false
        }
    }

    deinit {
        if let headerList { curl_slist_free_all(headerList) }
        errorBuffer.deallocate()
    }

    /// libcurl's own message for the failure, when it wrote one.
    var curlMessage: String {
        errorBuffer[0] == 0 ? "" : String(cString: errorBuffer)
    }

    // MARK: - Outcome (any thread)

    /// Hands the continuation over; resumes at once when the transfer was stopped before.
    /// Returns whether the loop should start it.
    func start(_ continuation: CheckedContinuation<HTTPResponse, any Error>) -> Bool {
        let early: (any Error)? = state.withLock { state in
            switch state {
            case .idle:
                state = .running(continuation)
                return nil
            case .stopped(let error):
                state = .finished
                return error
            case .running, .finished:
                preconditionFailure("CurlTransfer started twice")
            }
        }
        if let early {
            continuation.resume(throwing: early)
            return false
        }
        return true
    }

    /// Ends the transfer with `error` unless it ended already. Returns whether it did (the loop
    /// must then remove the handle).
    @discardableResult
    func stop(throwing error: any Error) -> Bool {
        let continuation: CheckedContinuation<HTTPResponse, any Error>? = state.withLock { state in
            switch state {
            case .idle:
                state = .stopped(error)
                return nil
            case .running(let continuation):
                state = .finished
                return continuation
            case .stopped, .finished:
                return nil
            }
        }
        continuation?.resume(throwing: error)
        return continuation != nil
    }

    /// The loop's end of the transfer: resumes with `result` unless it was stopped first.
    func finish(_ result: Result<HTTPResponse, any Error>) {
        let continuation: CheckedContinuation<HTTPResponse, any Error>? = state.withLock { state in
            guard case .running(let continuation) = state else { return nil }
            state = .finished
            return continuation
        }
        continuation?.resume(with: result)
    }

    var isFinished: Bool {
        state.withLock { if case .finished = $0 { true } else { false } }
    }

    // MARK: - Callbacks (loop thread)

    var tooLarge: String {
        "\(label): the response body is larger than \(limit.map(byteCount) ?? "the limit") (max-body)"
    }

    /// A header line (the status line, a field, or the blank line that ends the head).
    func header(_ line: UnsafeBufferPointer<UInt8>) -> Bool {
        var end = line.count
        while end > 0, line[end - 1] == 0x0A || line[end - 1] == 0x0D { end -= 1 }
        if end == 0 {
            return headEnded()
        }
        if line.count >= 5, line[0] == 0x48, line[1] == 0x54, line[2] == 0x54, line[3] == 0x50, line[4] == 0x2F {
            // "HTTP/": a new response (an interim 1xx came before, or this is the first).
            startHead()
            return true
        }
        headerCount += 1
        if headerCount > maxHeaders {
            abort = .tooLarge("\(label): the response has more than \(maxHeaders) header fields (max-headers)")
            return false
        }
        let bytes = UnsafeBufferPointer(rebasing: line[0..<end])
        guard let colon = bytes.firstIndex(of: 0x3A) else { return true }  // a folded or odd line: skipped
        let name = String(decoding: UnsafeBufferPointer(rebasing: bytes[0..<colon]), as: UTF8.self)
        var start = colon + 1
        while start < end, bytes[start] == 0x20 || bytes[start] == 0x09 { start += 1 }
        var stop = end
        while stop > start, bytes[stop - 1] == 0x20 || bytes[stop - 1] == 0x09 { stop -= 1 }
        let value = String(decoding: UnsafeBufferPointer(rebasing: bytes[start..<stop]), as: UTF8.self)
        if colon == 16, name.equalsIgnoringASCIICase("content-encoding") {
            encoded = true
        } else if colon == 14, name.equalsIgnoringASCIICase("content-length") {
            announcedLength = Int(value)
        }
        head.append((name, value))
        return true
    }

    /// Forgets the head so far: a new response begins (after an interim 1xx, or a new try).
    private func startHead() {
        head.removeAll(keepingCapacity: true)
        headerCount = 0
        status = 0
        encoded = false
        announcedLength = nil
    }

    private func headEnded() -> Bool {
        guard let easy else { return true }
        var code = 0
        _ = ccurl_easy_getinfo_long(easy, CURLINFO_RESPONSE_CODE, &code)
        status = code
        if (100..<200).contains(code) { return true }  // an interim answer: the real head follows
        if !RedirectRules.statuses.contains(code) { arriving?() }
        // A length announced over the limit ends the transfer before the body is read (a body
        // with a Content-Encoding is counted as it is decoded instead).
        if let limit, !isHead, !encoded, let length = announcedLength, length > limit {
            abort = .tooLarge(tooLarge)
            return false
        }
        return true
    }

    /// Decoded body bytes: counted as they arrive, the transfer ends at the limit.
    func received(_ chunk: UnsafeBufferPointer<UInt8>) -> Bool {
        if let limit, body.count + chunk.count > limit {
            abort = .tooLarge(tooLarge)
            return false
        }
        body.append(chunk)
        return true
    }

    /// Fills libcurl's buffer with the next bytes of the request body.
    func read(into buffer: UnsafeMutableRawBufferPointer) -> Int {
        let count = min(buffer.count, requestBody.count - readOffset)
        guard count > 0 else { return 0 }
        requestBody.withUnsafeBytes { source in
            guard let from = source.baseAddress else { return }
            buffer.baseAddress?.copyMemory(from: from + readOffset, byteCount: count)
        }
        readOffset += count
        return count
    }

    /// libcurl rewinds the body to send the request again (a kept-alive connection that was
    /// reset when it was reused, before any byte of the answer came back): the same bytes again.
    func seek(to offset: Int) -> Bool {
        guard offset >= 0, offset <= requestBody.count else { return false }
        readOffset = offset
        return true
    }

    // MARK: - Sent again (loop thread)

    /// Whether a transfer libcurl ended with `code`, having received `headerBytes` of an answer
    /// and sent `bodyBytesSent` of the request's body, may go again on a new connection, once:
    /// the connection failed before any byte of an answer came back, and the server cannot have
    /// acted on the request, because it is a `GET` or a `HEAD` (safe methods, RFC 9110 §9.2.1) or
    /// because its body did not all go out (a server acts on a whole request). That covers an
    /// HTTP/2 connection that a load balancer or server closes (`GOAWAY`), which fails some of
    /// the requests starting on it with libcurl 7.88, and a kept-alive connection reset while
    /// the request was still being written, which libcurl does not send again itself (issue 33).
    /// A token call whose body did not all go out cannot have presented its refresh token; one
    /// whose body went out whole is never sent again here.
    func mayGoAgain(_ code: CURLcode, headerBytes: Int, bodyBytesSent: Int) -> Bool {
        guard !sentAgain, abort == nil, headerBytes == 0 else { return false }
        switch code {
        case CURLE_HTTP2, CURLE_HTTP2_STREAM, CURLE_SEND_ERROR, CURLE_RECV_ERROR, CURLE_GOT_NOTHING: break
        default: return false
        }
        return sendsBody ? bodyBytesSent < requestBody.count : request.method == "GET" || request.method == "HEAD"
    }

    /// Makes the transfer ready to go again: nothing of the first try is kept.
    func prepareToGoAgain() {
        sentAgain = true
        readOffset = 0
        startHead()
        errorBuffer[0] = 0
        if let headerList { curl_slist_free_all(headerList) }
        headerList = nil
    }

    /// The response, once libcurl said the transfer is done.
    func response() -> HTTPResponse {
        var headers = head
        // By name regardless of case, then as written, as `URLSessionTransport` gives them.
        headers.sort { $0.0.precedesIgnoringASCIICase($1.0) }
        return HTTPResponse(status: status, headers: HTTPHeaders(headers), body: isHead ? Data() : body)
    }
}

/// `bytes` for people: `64 MiB`, `1 MiB`, `1500 bytes`.
func byteCount(_ bytes: Int) -> String {
    if bytes >= 1 << 20, bytes % (1 << 20) == 0 { return "\(bytes >> 20) MiB" }
    if bytes >= 1 << 10, bytes % (1 << 10) == 0 { return "\(bytes >> 10) KiB" }
    return "\(bytes) bytes"
}
