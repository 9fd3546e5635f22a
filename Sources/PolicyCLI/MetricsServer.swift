import Foundation
import ResponsePolicy

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// `policy fetch --metrics-listen HOST:PORT`: serves `GET /metrics` (and `/`) with the engine's
/// metrics while the command runs, for a Prometheus server to scrape.
///
/// A socket, one thread, one connection at a time: a scrape every few seconds needs no more, and
/// nothing here can reach the requests' path. Each connection reads one request (at most 16 KiB
/// of head, 2 s to send it), answers it and closes; the format follows the scraper's `Accept`
/// header (OpenMetrics when asked, Prometheus' text format otherwise).
///
/// Concurrency contract: ``start(_:metrics:)`` and ``stop()`` are called by the command's task;
/// the accept loop runs on its own thread and ends when ``stop()`` shuts the socket down.
final class MetricsServer: @unchecked Sendable {
    // @unchecked: `descriptor` and `port` are set once in init; the thread only reads them, and
    // `stopped` is guarded by `lock`.
    struct Failure: Error, CustomStringConvertible {
        var description: String
    }

    let host: String
    let port: Int
    private let descriptor: Int32
    private let metrics: PolicyMetrics
    private let lock = NSLock()
    private var stopped = false
    private let done = DispatchSemaphore(value: 0)
    /// Scrapes answered so far.
    private(set) var scrapes = 0

    /// `127.0.0.1:9464`, `0.0.0.0:9464`, `localhost:0` (port 0: any free port, see ``port``):
    /// the host and port, or `nil` when the text is not one.
    static func parse(_ text: String) -> (host: String, port: Int)? {
        guard let colon = text.lastIndex(of: ":") else { return nil }
        var host = String(text[..<colon])
        if host == "localhost" { host = "127.0.0.1" }
        guard let port = Int(text[text.index(after: colon)...]), (0...65535).contains(port) else { return nil }
        var address = in_addr()
        guard inet_pton(AF_INET, host, &address) == 1 else { return nil }
        return (host, port)
    }

    private init(host: String, port: Int, descriptor: Int32, metrics: PolicyMetrics) {
        self.host = host
        self.port = port
        self.descriptor = descriptor
        self.metrics = metrics
    }

    /// Binds `address` (`HOST:PORT`, an IPv4 address) and starts answering.
    /// - Throws: ``Failure`` when the address cannot be bound (in use, not this machine's).
    static func start(_ address: (host: String, port: Int), metrics: PolicyMetrics) throws(Failure) -> MetricsServer {
        #if canImport(Glibc) || canImport(Musl)
            let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        #else
            let descriptor = socket(AF_INET, SOCK_STREAM, 0)
        #endif
        guard descriptor >= 0 else { throw Failure(description: "cannot open a socket: \(errorText())") }
        var yes: Int32 = 1
        setsockopt(descriptor, SOL_SOCKET, SO_REUSEADDR, &yes, socklen_t(MemoryLayout<Int32>.size))
        var socketAddress = sockaddr_in()
        socketAddress.sin_family = sa_family_t(AF_INET)
        socketAddress.sin_port = in_port_t(UInt16(address.port).bigEndian)
        inet_pton(AF_INET, address.host, &socketAddress.sin_addr)
        let bound = withUnsafePointer(to: &socketAddress) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard bound == 0, listen(descriptor, 16) == 0 else {
            let reason = errorText()
            close(descriptor)
            throw Failure(description: "cannot listen on \(address.host):\(address.port): \(reason)")
        }
        var actual = sockaddr_in()
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &actual) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(descriptor, $0, &length) }
        }
        let server = MetricsServer(
            host: address.host, port: Int(UInt16(bigEndian: actual.sin_port)), descriptor: descriptor,
            metrics: metrics)
        let thread = Thread { server.acceptLoop() }
        thread.name = "policy-metrics"
        thread.start()
        return server
    }

    /// `http://127.0.0.1:9464/metrics`.
    var url: String { "http://\(host):\(port)/metrics" }

    /// Stops answering and waits for the thread to end (a scrape being answered is finished first).
    func stop() {
        let first: Bool = lock.withLock {
            defer { stopped = true }
            return !stopped
        }
        guard first else { return }
        shutdown(descriptor, Int32(SHUT_RDWR))
        done.wait()
        close(descriptor)
    }

    private var isStopped: Bool { lock.withLock { stopped } }

    private func acceptLoop() {
        defer { done.signal() }
        while !isStopped {
            let connection = accept(descriptor, nil, nil)
            if connection < 0 {
                if errno == EINTR { continue }
                return
            }
            answer(connection)
            close(connection)
        }
    }

    /// Reads one request's head and answers it.
    private func answer(_ connection: Int32) {
        var timeout = timeval(tv_sec: 2, tv_usec: 0)
        setsockopt(connection, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(connection, SOL_SOCKET, SO_SNDTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        var head: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        let end: [UInt8] = Array("\r\n\r\n".utf8)
        while head.count < 16_384 {
            let count = recv(connection, &buffer, buffer.count, 0)
            guard count > 0 else { return }
            head += buffer[..<count]
            if head.count >= 4, Self.contains(head, end) { break }
        }
        let text = String(decoding: head, as: UTF8.self)
        let lines = text.components(separatedBy: "\r\n")
        let requestLine = lines.first?.split(separator: " ") ?? []
        guard requestLine.count >= 2 else {
            respond(connection, status: "400 Bad Request", type: "text/plain", body: "bad request\n", head: false)
            return
        }
        let method = String(requestLine[0])
        let target = requestLine[1].split(separator: "?").first.map(String.init) ?? "/"
        guard method == "GET" || method == "HEAD" else {
            respond(
                connection, status: "405 Method Not Allowed", type: "text/plain", body: "GET /metrics\n", head: false)
            return
        }
        guard target == "/metrics" || target == "/" else {
            respond(connection, status: "404 Not Found", type: "text/plain", body: "GET /metrics\n", head: false)
            return
        }
        let accept = lines.dropFirst().first { $0.lowercased().hasPrefix("accept:") }.map { String($0.dropFirst(7)) }
        let format = PolicyMetrics.Format(accept: accept)
        lock.withLock { scrapes += 1 }
        respond(
            connection, status: "200 OK", type: format.contentType, body: metrics.exposition(format),
            head: method == "HEAD")
    }

    private func respond(_ connection: Int32, status: String, type: String, body: String, head: Bool) {
        let payload = Array(body.utf8)
        var out = Array(
            "HTTP/1.1 \(status)\r\nContent-Type: \(type)\r\nContent-Length: \(payload.count)\r\nConnection: close\r\n\r\n"
                .utf8)
        if !head { out += payload }
        var sent = 0
        while sent < out.count {
            #if canImport(Glibc) || canImport(Musl)
                let count = out[sent...].withUnsafeBytes {
                    send(connection, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL))
                }
            #else
                let count = out[sent...].withUnsafeBytes { send(connection, $0.baseAddress, $0.count, 0) }
            #endif
            guard count > 0 else { return }
            sent += count
        }
    }

    private static func contains(_ bytes: [UInt8], _ pattern: [UInt8]) -> Bool {
        guard bytes.count >= pattern.count else { return false }
        for start in 0...(bytes.count - pattern.count)
        where bytes[start..<(start + pattern.count)].elementsEqual(pattern) {
            return true
        }
        return false
    }

    private static func errorText() -> String { String(cString: strerror(errno)) }
}
