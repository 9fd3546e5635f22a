import Foundation
import ResponsePolicy
import Synchronization
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// A `redis-server` of the test's own, on a free loopback port, without persistence.
public final class RedisServerFixture: @unchecked Sendable {
    // @unchecked: `process` is replaced only by `kill`/`restart`, which the owning test calls
    // from one task.
    public private(set) var port: Int
    private var process: Process?

    public static var isInstalled: Bool { executable != nil }

    public static let executable: String? = [
        "/usr/bin/redis-server", "/usr/local/bin/redis-server", "/opt/homebrew/bin/redis-server",
    ]
    .first { FileManager.default.isExecutableFile(atPath: $0) }

    public init(password: String? = nil) throws {
        port = Self.freePort()
        self.password = password
        try launch()
    }

    private let password: String?

    public var url: String { "redis://127.0.0.1:\(port)/0" }

    /// Starts `redis-server` on `port`, or on another free port when that one was taken meanwhile.
    ///
    /// Why the identity check: a free port is free only until someone binds it. Tests start many
    /// servers at once (and other test runs on the machine do too); a server that loses the race
    /// for its port exits, and a readiness check that only PINGs would find the winner — another
    /// test's server, killed under this one later ("Connection reset by peer").
    private func launch() throws {
        for _ in 0..<5 {
            let process = Process()
            process.executableURL = URL(fileURLWithPath: Self.executable ?? "redis-server")
            var arguments = [
                "--port", String(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--protected-mode", "no", "--loglevel", "warning",
            ]
            if let password { arguments += ["--requirepass", password] }
            process.arguments = arguments
            process.standardOutput = FileHandle.nullDevice
            process.standardError = FileHandle.nullDevice
            try process.run()
            self.process = process
            // Ready when this process answers on the port (at most 10 s).
            let deadline = Date().addingTimeInterval(10)
            while Date() < deadline, process.isRunning {
                let info = try? command(["INFO", "server"])
                if info?.contains("process_id:\(process.processIdentifier)\r\n") == true { return }
                usleep(5_000)
            }
            kill()
            port = Self.freePort()
        }
        throw FixtureError("redis-server did not start on a free port")
    }

    /// Stops the server at once (SIGKILL), as a crash would.
    public func kill() {
        if let process, process.isRunning {
            Glibc.kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }
        process = nil
    }

    /// Starts it again on the same port, empty (no persistence).
    public func restart() throws {
        kill()
        try launch()
    }

    deinit { kill() }

    /// Runs one command with redis-cli-free plain RESP over a socket; returns the raw reply text.
    @discardableResult
    public func command(_ arguments: [String]) throws -> String {
        let descriptor = try Self.connect(port)
        defer { close(descriptor) }
        var request = "*\(arguments.count)\r\n"
        for argument in arguments { request += "$\(argument.utf8.count)\r\n\(argument)\r\n" }
        // QUIT: the server closes the connection after its replies, which ends the read below.
        request += "*1\r\n$4\r\nQUIT\r\n"
        if let password { request = "*2\r\n$4\r\nAUTH\r\n$\(password.utf8.count)\r\n\(password)\r\n" + request }
        _ = request.withCString { send(descriptor, $0, strlen($0), 0) }
        var reply = [UInt8]()
        var buffer = [UInt8](repeating: 0, count: 65536)
        var timeout = timeval(tv_sec: 2, tv_usec: 0)
        setsockopt(descriptor, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        while true {
            let count = recv(descriptor, &buffer, buffer.count, 0)
            if count <= 0 { break }
            reply += buffer[0..<count]
        }
        guard !reply.isEmpty else { throw FixtureError("no reply") }
        return String(decoding: reply, as: UTF8.self)
    }

    /// `INFO commandstats` as command name → calls.
    public func commandCalls() throws -> [String: Int] {
        var calls: [String: Int] = [:]
        for line in try command(["INFO", "commandstats"]).split(separator: "\r\n") where line.hasPrefix("cmdstat_") {
            let name = line.dropFirst(8).prefix { $0 != ":" }
            if let range = line.range(of: "calls="), let count = Int(line[range.upperBound...].prefix { $0.isNumber }) {
                calls[String(name)] = count
            }
        }
        return calls
    }

    /// Waits until `count` clients subscribe to `channel` (`PUBSUB NUMSUB`), polling the server
    /// for at most `timeout`: a coordinator's subscriber is ready, where a test used to sleep.
    public func waitForSubscribers(
        _ count: Int, on channel: String, within timeout: Duration = .seconds(60)
    ) async -> Bool {
        await poll(within: timeout) {
            let reply = (try? command(["PUBSUB", "NUMSUB", channel])) ?? ""
            let numbers = reply.split(separator: "\r\n").filter { $0.hasPrefix(":") }.compactMap { Int($0.dropFirst()) }
            return (numbers.last ?? 0) >= count
        }
    }

    /// Waits until the server has run `name` (lower case, as `INFO commandstats` names it) at least
    /// `calls` times, for at most `timeout`: a client has asked, where a test used to sleep.
    public func waitForCalls(_ name: String, atLeast calls: Int, within timeout: Duration = .seconds(60)) async
        -> Bool
    {
        await poll(within: timeout) { ((try? commandCalls())?[name] ?? 0) >= calls }
    }

    private func poll(within timeout: Duration, _ condition: () -> Bool) async -> Bool {
        let deadline = ContinuousClock.now + timeout
        while ContinuousClock.now < deadline {
            if condition() { return true }
            try? await Task.sleep(for: .milliseconds(2))
        }
        return condition()
    }

    public static func connect(_ port: Int) throws -> Int32 {
        let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let status = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                Glibc.connect(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard status == 0 else {
            close(descriptor)
            throw FixtureError("cannot connect")
        }
        return descriptor
    }

    public static func canConnect(_ port: Int) -> Bool {
        guard let descriptor = try? connect(port) else { return false }
        close(descriptor)
        return true
    }

    public static func freePort() -> Int {
        let (descriptor, port) = boundLoopbackSocket()
        close(descriptor)
        return port
    }

    /// A TCP socket bound to a free loopback port, not listening yet: connections to it are
    /// refused until the caller listens. The caller closes it.
    public static func boundLoopbackSocket() -> (descriptor: Int32, port: Int) {
        let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = 0
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        _ = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(descriptor, $0, &length) }
        }
        return (descriptor, Int(UInt16(bigEndian: address.sin_port)))
    }
}

public struct FixtureError: Error, CustomStringConvertible {
    public var description: String
    public init(_ description: String) { self.description = description }
}

/// Collects a coordinator's updates, with the time each arrived.
public final class UpdateLog: Sendable {
    private let entries = Mutex<[(SessionUpdate, ContinuousClock.Instant)]>([])

    public init() {}

    public var sink: @Sendable (SessionUpdate) -> Void {
        { [self] update in self.entries.withLock { $0.append((update, .now)) } }
    }

    public var updates: [SessionUpdate] { entries.withLock { $0.map(\.0) } }

    /// Waits (really: these coordinators talk to real servers) until an update matches.
    public func first(
        within timeout: Duration, where match: (SessionUpdate) -> Bool
    ) async -> (SessionUpdate, ContinuousClock.Instant)? {
        let deadline = ContinuousClock.now + timeout
        while ContinuousClock.now < deadline {
            if let found = entries.withLock({ $0.first { match($0.0) } }) { return found }
            try? await Task.sleep(for: .milliseconds(2))
        }
        return nil
    }
}

public func testCredentials(_ name: String) -> Credentials {
    Credentials(
        accessToken: "access-\(name)", refreshToken: "refresh-\(name)",
        expiresAt: Date(timeIntervalSince1970: 2_000_000_000))
}

/// A refresh server double: counts the refreshes the lease holders make.
public final class RefreshCounter: Sendable {
    private let count = Mutex(0)
    public init() {}
    public func refresh() async -> Credentials {
        let number = count.withLock { value -> Int in
            value += 1
            return value
        }
        try? await Task.sleep(for: .milliseconds(30))
        return testCredentials("refreshed-\(number)")
    }
    public var refreshes: Int { count.withLock { $0 } }
}

/// One engine's side of a refresh through a coordinator: what the engine of issue 11 will do.
public func coordinatedRefresh(
    _ coordinator: any SessionCoordinator, failedGeneration: UInt64, counter: RefreshCounter,
    timeout: Duration = .seconds(5)
) async -> RefreshTurn {
    let turn = await coordinator.beginRefresh(
        RefreshTurnRequest(failedGeneration: failedGeneration, timeout: timeout, limit: nil))
    if case .lease(let lease) = turn {
        let credentials = await counter.refresh()
        _ = await coordinator.publish(credentials, with: lease)
    }
    return turn
}

/// `Issue.record` as a `Void` call, for `guard … else { return recordFailure("…") }`.
public func recordFailure(_ message: String, sourceLocation: SourceLocation = #_sourceLocation) {
    Issue.record(Comment(rawValue: message), sourceLocation: sourceLocation)
}
