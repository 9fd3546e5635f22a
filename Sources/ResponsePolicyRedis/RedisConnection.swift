internal import CHiredis
import Foundation
import ResponsePolicy

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// A Redis reply, copied out of hiredis so no C type leaves this file.
package enum RedisReply: Sendable, Equatable {
    /// A bulk or status string.
    case string(String)
    case integer(Int64)
    case array([RedisReply])
    case null
    case error(String)

    package var text: String? {
        switch self {
        case .string(let text): return text
        case .integer(let value): return String(value)
        default: return nil
        }
    }

    package var integer: Int64? {
        switch self {
        case .integer(let value): return value
        case .string(let text): return Int64(text)
        default: return nil
        }
    }

    package var items: [RedisReply] {
        if case .array(let items) = self { return items }
        return []
    }
}

/// One blocking hiredis connection.
///
/// Why blocking and not hiredis' async API: every call here is off the hot path (a refresh, a
/// logout) and bounded by the connect timeout, which hiredis applies to connect, send and
/// receive; the subscriber reads with `poll(2)` so it can stop on its own. The async API would
/// need an event loop adapter for no gain.
///
/// Concurrency contract: not thread-safe. Each instance is used by one thread at a time (the
/// coordinator keeps its command connection behind a lock, the subscriber owns its own).
package final class RedisConnection {
    private let context: UnsafeMutablePointer<redisContext>
    let endpoint: RedisEndpoint
    /// The bound of every call, named in a timeout's message.
    let timeout: Duration

    /// Connects, authenticates and selects the database, each bounded by `timeout`.
    package init(_ endpoint: RedisEndpoint, password: String?, timeout: Duration) throws(RedisError) {
        self.endpoint = endpoint
        self.timeout = timeout
        context = try Self.open(endpoint, timeout: timeout)
        if let password {
            var arguments = ["AUTH"]
            if let user = endpoint.username { arguments.append(user) }
            arguments.append(password)
            // The reply says nothing about the password; the arguments are never echoed.
            if case .error(let message) = try command(arguments) {
                throw RedisError(message: "\(endpoint) refused the password: \(message)")
            }
        } else if case .error(let message) = try command(["PING"]), Self.asksForPassword(message) {
            // Issue 32: a server with a password answered the first script call with "ERR Protocol
            // error: unauthenticated multibulk length", which said nothing of the cause.
            throw RedisError(
                message: "\(endpoint) asks for a password: name the environment variable that holds it with "
                    + "'password-env'")
        }
        if endpoint.database != 0, case .error(let message) = try command(["SELECT", String(endpoint.database)]) {
            throw RedisError(message: "\(endpoint) refused database \(endpoint.database): \(message)")
        }
    }

    /// A connected context, each call bounded by `timeout`, with TCP keep-alive: what both
    /// initialisers start from.
    private static func open(_ endpoint: RedisEndpoint, timeout: Duration) throws(RedisError)
        -> UnsafeMutablePointer<redisContext>
    {
        let time = timeValue(timeout)
        guard let made = redisConnectWithTimeout(endpoint.host, Int32(endpoint.port), time) else {
            throw RedisError(message: "cannot connect to \(endpoint): out of memory")
        }
        if made.pointee.err != 0 {
            let reason = errorText(made, timeout: timeout)
            redisFree(made)
            throw RedisError(message: "cannot connect to \(endpoint): \(reason)")
        }
        _ = redisSetTimeout(made, time)
        _ = redisEnableKeepAlive(made)
        return made
    }

    /// How many answers to queued set-up commands (AUTH, SELECT) come before the first command's
    /// (``init(queueing:password:timeout:)``); 0 otherwise.
    package private(set) var setUpReplies = 0

    /// Connects and queues AUTH and SELECT without waiting for their answers: for a command that
    /// must reach Redis whatever happens meanwhile (a publication during a `CLIENT PAUSE`, which a
    /// blocking AUTH would time out on before the command is even sent). Their answers come first,
    /// in order (``setUpReplies`` of them), before the first command's.
    package init(queueing endpoint: RedisEndpoint, password: String?, timeout: Duration) throws(RedisError) {
        self.endpoint = endpoint
        self.timeout = timeout
        context = try Self.open(endpoint, timeout: timeout)
        if let password {
            var arguments = ["AUTH"]
            if let user = endpoint.username { arguments.append(user) }
            arguments.append(password)
            try send(arguments)
            setUpReplies += 1
        }
        if endpoint.database != 0 {
            try send(["SELECT", String(endpoint.database)])
            setUpReplies += 1
        }
    }

    deinit {
        redisFree(context)
    }

    /// Whether a server's error means the connection has not authenticated.
    static func asksForPassword(_ message: String) -> Bool {
        message.hasPrefix("NOAUTH") || message.contains("unauthenticated")
    }

    /// Sends one command and waits for its reply. A server error comes back as `.error`; a broken
    /// or timed-out connection throws, and the connection must then be dropped.
    package func command(_ arguments: [String]) throws(RedisError) -> RedisReply {
        let raw = withArguments(arguments) { count, pointers, lengths in
            redisCommandArgv(context, count, pointers, lengths)
        }
        guard let raw else { throw RedisError(message: "\(endpoint): \(Self.errorText(context, timeout: timeout))") }
        defer { freeReplyObject(raw) }
        return Self.convert(raw.assumingMemoryBound(to: redisReply.self))
    }

    /// Queues a command without waiting for a reply (SUBSCRIBE), and writes it out.
    func send(_ arguments: [String]) throws(RedisError) {
        let status = withArguments(arguments) { count, pointers, lengths in
            redisAppendCommandArgv(context, count, pointers, lengths)
        }
        guard status == REDIS_OK else {
            throw RedisError(message: "\(endpoint): \(Self.errorText(context, timeout: timeout))")
        }
        var done: Int32 = 0
        while done == 0 {
            guard redisBufferWrite(context, &done) == REDIS_OK else {
                throw RedisError(message: "\(endpoint): \(Self.errorText(context, timeout: timeout))")
            }
        }
    }

    /// The next pushed reply, waiting at most `milliseconds`; `nil` when none came in time.
    func nextReply(waitingAtMost milliseconds: Int32) throws(RedisError) -> RedisReply? {
        var raw: UnsafeMutableRawPointer?
        if redisGetReplyFromReader(context, &raw) != REDIS_OK {
            throw RedisError(message: "\(endpoint): \(Self.errorText(context, timeout: timeout))")
        }
        if raw == nil {
            var descriptor = pollfd(fd: context.pointee.fd, events: Int16(POLLIN), revents: 0)
            let ready = poll(&descriptor, 1, milliseconds)
            if ready < 0, errno == EINTR { return nil }
            guard ready >= 0 else { throw RedisError(message: "\(endpoint): poll failed") }
            if ready == 0 { return nil }
            guard redisBufferRead(context) == REDIS_OK else {
                throw RedisError(message: "\(endpoint): \(Self.errorText(context, timeout: timeout))")
            }
            if redisGetReplyFromReader(context, &raw) != REDIS_OK {
                throw RedisError(message: "\(endpoint): \(Self.errorText(context, timeout: timeout))")
            }
        }
        guard let raw else { return nil }
        defer { freeReplyObject(raw) }
        return Self.convert(raw.assumingMemoryBound(to: redisReply.self))
    }

    // MARK: - Helpers

    /// Calls `body` with argv/argvlen arrays that stay valid for the call (binary-safe lengths).
    private func withArguments<R>(
        _ arguments: [String],
        _ body: (Int32, UnsafeMutablePointer<UnsafePointer<CChar>?>?, UnsafePointer<Int>?) -> R
    ) -> R {
        let buffers = arguments.map { Array($0.utf8) }
        let storage = buffers.map { bytes -> UnsafeMutablePointer<CChar> in
            let pointer = UnsafeMutablePointer<CChar>.allocate(capacity: max(bytes.count, 1))
            bytes.withUnsafeBufferPointer { source in
                source.withMemoryRebound(to: CChar.self) { chars in
                    if let base = chars.baseAddress { pointer.initialize(from: base, count: chars.count) }
                }
            }
            return pointer
        }
        defer {
            for pointer in storage { pointer.deallocate() }
        }
        var pointers: [UnsafePointer<CChar>?] = storage.map { UnsafePointer($0) }
        let lengths = buffers.map(\.count)
        return pointers.withUnsafeMutableBufferPointer { argv in
            lengths.withUnsafeBufferPointer { argvlen in
                body(Int32(arguments.count), argv.baseAddress, argvlen.baseAddress)
            }
        }
    }

    private static func convert(_ reply: UnsafeMutablePointer<redisReply>) -> RedisReply {
        let value = reply.pointee
        func text() -> String {
            guard let pointer = value.str else { return "" }
            return String(decoding: UnsafeRawBufferPointer(start: pointer, count: value.len), as: UTF8.self)
        }
        switch value.type {
        case REDIS_REPLY_STRING, REDIS_REPLY_STATUS: return .string(text())
        case REDIS_REPLY_INTEGER: return .integer(value.integer)
        case REDIS_REPLY_ERROR: return .error(text())
        case REDIS_REPLY_ARRAY:
            var items: [RedisReply] = []
            if let elements = value.element {
                for index in 0..<value.elements {
                    if let element = elements[index] { items.append(convert(element)) }
                }
            }
            return .array(items)
        default: return .null
        }
    }

    /// hiredis's error, with a timeout said as one ("did not answer within 250ms", not
    /// "Resource temporarily unavailable", which is how EAGAIN reads).
    private static func errorText(_ context: UnsafeMutablePointer<redisContext>, timeout: Duration) -> String {
        let text = withUnsafeBytes(of: context.pointee.errstr) { bytes in
            String(decoding: bytes.prefix { $0 != 0 }, as: UTF8.self)
        }
        if text.contains("temporarily unavailable")
            || text.lowercased().contains("timed out")
        {
            return "did not answer within \(timeout.policyText) (connect-timeout)"
        }
        if !text.isEmpty { return text }
        return context.pointee.err == REDIS_ERR_IO ? "I/O error" : "connection failed"
    }

    private static func timeValue(_ duration: Duration) -> timeval {
        let (seconds, attoseconds) = duration.components
        var value = timeval()
        value.tv_sec = .init(seconds)
        value.tv_usec = .init(attoseconds / 1_000_000_000_000)
        return value
    }
}
