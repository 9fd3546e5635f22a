import Foundation
import ResponsePolicy
import TestGate
import TestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// Four `policy fetch` processes × 50 concurrent requests, all meeting an expired token, against a
/// loopback OAuth2 server with single-use rotating refresh tokens that revokes the family on
/// reuse: with coordination there must be exactly one refresh, no logout, every request delivered.
///
/// Gated until `PolicyEngine` asks its coordinator before refreshing (the engine core is being
/// rewritten in parallel); ``CoordinationWiring/engineUsesCoordinator`` turns it on.
@Suite(.measuresRealTime(filter: "FleetEndToEndTests"), .serialized, .loadGate(.realTime))
struct FleetEndToEndTests {
    static var redisInstalled: Bool {
        ["/usr/bin/redis-server", "/usr/local/bin/redis-server"].contains {
            FileManager.default.isExecutableFile(atPath: $0)
        }
    }

    @Test func theTokenServerFixtureRotatesAndRevokesTheFamilyOnReuse() throws {
        let folder = try TemporaryDirectory()
        let server = try TokenServer(credentials: folder.url.appendingPathComponent("c.json").path)
        defer { server.stop() }
        func refresh(_ token: String) throws -> (Int, String) {
            try server.post("/token", "grant_type=refresh_token&refresh_token=\(token)&client_id=app")
        }
        #expect(try server.get("/api/x").0 == 401)
        let (status, body) = try refresh("refresh-0")
        #expect(status == 200 && body.contains("\"refresh_token\": \"refresh-1\""), "\(body)")
        #expect(try refresh("refresh-0").0 == 400)  // reuse: the family is revoked
        #expect(try refresh("refresh-1").0 == 400)
        let stats = try server.get("/stats").1
        #expect(
            stats.contains("\"refreshes\": 1") && stats.contains("\"reuses\": 1") && stats.contains("\"revoked\": true")
        )
    }

    @Test(
        .enabled(
            if: CoordinationWiring.engineUsesCoordinator,
            "skipped until PolicyEngine calls its SessionCoordinator (issue 11 wires it); the coordinators are tested directly meanwhile"
        ),
        arguments: ["redis", "file"])
    func fourFetchProcessesMeetingAnExpiredTokenMakeOneRefresh(_ backend: String) async throws {
        if backend == "redis", !Self.redisInstalled { return }
        let trials = Int(ProcessInfo.processInfo.environment["FLEET_TRIALS"] ?? "") ?? 20
        for trial in 0..<trials {
            let folder = try TemporaryDirectory()
            let credentials = folder.url.appendingPathComponent("credentials.json").path
            let server = try TokenServer(credentials: credentials)
            defer { server.stop() }
            var redis: Process?
            // Generous connect timeouts: the trial is about one refresh across processes; on a loaded
            // machine a slow answer would make a process fall back to refreshing alone, by design.
            var section = "coordination: { use: file, with: { connect-timeout: 5s } }\n"
            if backend == "redis" {
                // A free port from the kernel, not a random guess that may be taken; one more try
                // if another process takes it before redis-server binds it.
                var started: (Process, Int)?
                for _ in 0..<3 where started == nil {
                    let port = freeLoopbackPort()
                    let process = Process()
                    process.executableURL = URL(fileURLWithPath: "/usr/bin/redis-server")
                    process.arguments = [
                        "--port", String(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                    ]
                    process.standardOutput = FileHandle.nullDevice
                    try process.run()
                    // Started processes must find Redis up, or they coordinate locally (by design)
                    // and the trial measures the fallback instead.
                    if (try? waitUntilListening(port: port)) != nil {
                        started = (process, port)
                    } else {
                        kill(process.processIdentifier, SIGKILL)
                    }
                }
                guard let (process, port) = started else {
                    throw CLITestError.timedOut(arguments: ["redis-server"], seconds: 30)
                }
                redis = process
                section =
                    "coordination: { use: redis, with: { url: \"redis://127.0.0.1:\(port)/0\", key: t\(trial), connect-timeout: 5s } }\n"
            }
            defer {
                if let redis { kill(redis.processIdentifier, SIGKILL) }
            }
            let policy = try folder.write(
                "policy.yaml",
                """
                policy: 1
                name: fleet
                rules:
                  - { name: expired, when: { status: [401] }, then: refresh }
                refresh: { use: oauth2, with: { token-url: "http://127.0.0.1:\(server.port)/token", client-id: app } }

                """ + section)
            let results = try await runConcurrently(4) { _ in
                try await runPolicy(
                    [
                        "fetch", "--policy", policy.path, "--credentials", credentials, "--count", "50",
                        "--concurrency", "50", "http://127.0.0.1:\(server.port)/api/profile",
                    ], timeout: 60)
            }
            let stats = try server.get("/stats").1
            #expect(stats.contains("\"refreshes\": 1,") && stats.contains("\"reuses\": 0"), "trial \(trial): \(stats)")
            for result in results {
                #expect(result.status == 0, "\(result.stderr)")
                #expect(result.stdout.contains("50 delivered, 0 failed, 0 logged out"), "\(result.stdout)")
            }
        }
    }
}

extension FleetEndToEndTests {
    /// Issue 19's "done when", CI-sized: consecutive expiries × 4 `policy fetch` processes × 20
    /// concurrent requests, against the revoke-on-reuse server that sends `expires_in`; every
    /// process starts with the credentials file the previous round left (a restart with an older
    /// local token). One token call per expiry, no reuse, no logout, everything delivered.
    /// `FLEET_EXPIRIES=10` runs the full size (3 by default, to bound CI time).
    @Test(arguments: ["redis", "file"])
    func consecutiveExpiriesMakeOneTokenCallEachAndNoLogout(_ backend: String) async throws {
        if backend == "redis", !Self.redisInstalled { return }
        let expiries = Int(ProcessInfo.processInfo.environment["FLEET_EXPIRIES"] ?? "") ?? 3
        let folder = try TemporaryDirectory()
        let credentials = folder.url.appendingPathComponent("credentials.json").path
        let server = try TokenServer(credentials: credentials)
        defer { server.stop() }
        var redis: Process?
        var section = "coordination: { use: file, with: { connect-timeout: 5s } }\n"
        if backend == "redis" {
            let port = freeLoopbackPort()
            let process = Process()
            process.executableURL = URL(fileURLWithPath: "/usr/bin/redis-server")
            process.arguments = ["--port", String(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
            process.standardOutput = FileHandle.nullDevice
            try process.run()
            redis = process
            try waitUntilListening(port: port)
            section =
                "coordination: { use: redis, with: { url: \"redis://127.0.0.1:\(port)/0\", key: expiries, connect-timeout: 5s } }\n"
        }
        defer {
            if let redis { kill(redis.processIdentifier, SIGKILL) }
        }
        let policy = try folder.write(
            "policy.yaml",
            """
            policy: 1
            name: fleet
            rules:
              - { name: expired, when: { status: [401] }, then: refresh }
            refresh:
              use: oauth2
              with: { token-url: "http://127.0.0.1:\(server.port)/token", client-id: app }
              # The expiries come seconds apart here (an hour apart in production): the fleet-wide
              # refresh.limit, which counts every lease, must not stop them.
              limit: { count: 100, per: 30s }

            """ + section)
        for expiry in 1...expiries {
            if expiry > 1 { _ = try server.post("/expire", "") }
            let results = try await runConcurrently(4) { _ in
                try await runPolicy(
                    [
                        "fetch", "--policy", policy.path, "--credentials", credentials, "--count", "20",
                        "--concurrency", "20", "http://127.0.0.1:\(server.port)/api/profile",
                    ], timeout: 60)
            }
            let stats = try server.get("/stats").1
            #expect(
                stats.contains("\"refreshes\": \(expiry),") && stats.contains("\"reuses\": 0")
                    && stats.contains("\"revoked\": false"), "expiry \(expiry): \(stats)")
            for result in results {
                #expect(result.status == 0, "expiry \(expiry): \(result.stderr)")
                #expect(result.stdout.contains("20 delivered, 0 failed, 0 logged out"), "\(result.stdout)")
            }
        }
    }
}

/// A loopback port the kernel reports free (bound to port 0, then released).
func freeLoopbackPort() -> Int {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    defer { close(fd) }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    _ = withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) }
    }
    _ = withUnsafeMutablePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
    }
    return Int(UInt16(bigEndian: address.sin_port))
}

/// Waits (up to 10 s) until something accepts connections on the loopback `port`.
func waitUntilListening(port: Int) throws {
    let giveUp = ContinuousClock.now + .seconds(10)
    while ContinuousClock.now < giveUp {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0
            }
        }
        close(fd)
        if connected { return }
        usleep(20_000)
    }
    throw CLITestError.timedOut(arguments: ["redis-server", "--port", String(port)], seconds: 10)
}

/// Runs `count` jobs at once and returns their results in order.
func runConcurrently<T: Sendable>(_ count: Int, _ job: @escaping @Sendable (Int) async throws -> T) async throws -> [T]
{
    try await withThrowingTaskGroup(of: (Int, T).self) { group in
        for index in 0..<count { group.addTask { (index, try await job(index)) } }
        var results: [Int: T] = [:]
        for try await (index, result) in group { results[index] = result }
        return (0..<count).compactMap { results[$0] }
    }
}

/// `scripts/oauth2-rotating-server.py` on a free loopback port.
final class TokenServer: @unchecked Sendable {
    // @unchecked: set once in init; `stop` is called by the owning test.
    private let process: Process
    let port: Int

    init(credentials: String) throws {
        (process, port) = try startRotatingTokenServer(["--credentials", credentials])
    }

    func stop() {
        // SIGKILL: a child of the test runner may inherit a signal mask that blocks SIGTERM.
        if process.isRunning {
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }
    }

    deinit { stop() }

    func get(_ path: String) throws -> (Int, String) { try request("GET", path, nil) }
    func post(_ path: String, _ form: String) throws -> (Int, String) { try request("POST", path, form) }

    private func request(_ method: String, _ path: String, _ body: String?) throws -> (Int, String) {
        try loopbackHTTP(port: port, method, path, form: body)
    }
}
