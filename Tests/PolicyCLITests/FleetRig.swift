import Foundation
import ResponsePolicy
import ResponsePolicyRedis
import TestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// A fleet of real `policy fetch` processes against a real `redis-server` and the rotating,
/// revoke-on-reuse token server (`scripts/oauth2-rotating-server.py`, which logs every token call),
/// all on loopback ports of their own: what the fault tests (issue 30) and their checks share.
///
/// Each process ("slot") has its own policy file (its token URL names it, `?p=SLOT`, so the token
/// server's log says who presented what) and its own credentials file, as processes on several
/// hosts would. Waits are on signals (the token server's counters and log, Redis's answers), each
/// bounded; nothing sleeps for a fixed time.
final class FleetRig: @unchecked Sendable {
    // @unchecked: the mutable parts (the Redis process) are touched by the owning test only.
    let folder: TemporaryDirectory
    let redisPort: Int
    private(set) var redis: Process?
    let tokenPort: Int
    private let tokenServer: Process
    let logPath: String
    let seedPath: String

    static var redisInstalled: Bool { FileManager.default.isExecutableFile(atPath: "/usr/bin/redis-server") }

    /// - Parameters:
    ///   - expiresIn: the `expires_in` of every pair the token server issues.
    ///   - apiDelayMs: how long each API call takes (so a `fetch` of N requests runs for a while).
    init(expiresIn: Int = 3600, apiDelayMs: Int = 20) throws {
        folder = try TemporaryDirectory()
        logPath = folder.url.appendingPathComponent("token-calls.jsonl").path
        seedPath = folder.url.appendingPathComponent("seed.json").path
        redisPort = freeLoopbackPort()
        (tokenServer, tokenPort) = try startRotatingTokenServer([
            "--credentials", seedPath, "--log", logPath, "--expires-in", String(expiresIn), "--api-delay-ms",
            String(apiDelayMs), "--refresh-delay-ms", "20",
        ])
        try startRedis()
    }

    deinit {
        stopRedis()
        kill(tokenServer.processIdentifier, SIGKILL)
        tokenServer.waitUntilExit()
    }

    // MARK: - Redis

    /// Starts `redis-server` on the rig's port with no persistence (a restart is empty).
    func startRedis() throws {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/redis-server")
        process.arguments = [
            "--port", String(redisPort), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
        ]
        process.standardOutput = FileHandle.nullDevice
        try process.run()
        redis = process
        try waitUntilListening(port: redisPort)
    }

    /// Kills Redis (SIGKILL: it forgets everything, every connection drops).
    func stopRedis() {
        guard let redis else { return }
        kill(redis.processIdentifier, SIGKILL)
        redis.waitUntilExit()
        self.redis = nil
    }

    /// Redis restarted with no persistence: empty, every connection dropped.
    func restartRedisEmpty() throws {
        stopRedis()
        try startRedis()
    }

    /// One command to Redis, as an operator (or an attacker with its password) would send it.
    @discardableResult
    func redisCommand(_ arguments: [String]) throws -> RedisReply {
        let endpoint = try RedisEndpoint.parse("redis://127.0.0.1:\(redisPort)/0").get()
        return try RedisConnection(endpoint, password: nil, timeout: .seconds(5)).command(arguments)
    }

    // MARK: - The token server

    func stats() throws -> [String: Any] {
        let (_, body) = try httpRequest("GET", "/stats", nil)
        return (try JSONSerialization.jsonObject(with: Data(body.utf8)) as? [String: Any]) ?? [:]
    }

    func expire() throws { _ = try httpRequest("POST", "/expire", "") }

    /// Queues a fault for the next token calls: `status=503&count=2`, `delay_ms=1500`, …
    func fault(_ form: String) throws { _ = try httpRequest("POST", "/fault", form) }

    /// Every token call logged so far, in the order they were answered.
    func tokenCalls() -> [[String: Any]] {
        guard let text = try? String(contentsOfFile: logPath, encoding: .utf8) else { return [] }
        return text.split(separator: "\n").compactMap {
            try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any]
        }.filter { $0["event"] as? String == "token" }
    }

    /// The token calls the server answered `ok`, in the order they arrived.
    func okCalls() -> [[String: Any]] {
        tokenCalls().filter { $0["result"] as? String == "ok" }.sorted {
            ($0["arrived"] as? Double ?? 0) < ($1["arrived"] as? Double ?? 0)
        }
    }

    func refreshes() -> Int { (try? stats()["refreshes"] as? Int) ?? nil ?? 0 }

    /// Callers whose token call the server has received and not answered yet.
    func inFlight() -> [String] { ((try? stats()["in_flight"]) as? [String]) ?? [] }

    // MARK: - Processes

    /// The policy of slot `slot`: the rig's token server (naming the slot) and Redis, `lease`,
    /// `refresh.timeout`, and `extra` policy text (rules, `logout:`, coordination options).
    @discardableResult
    func policy(
        slot: Int, timeout: String = "2s", lease: String = "3s", connectTimeout: String = "1s",
        coordination: String? = nil, extra: String = "", signed: Bool = false
    ) throws -> String {
        let store =
            coordination
                ?? """
                { use: redis, with: { url: "redis://127.0.0.1:\(redisPort)/0", key: fleet, lease: \(lease), \
                connect-timeout: \(connectTimeout)\(signed ? ", signing-key-env: FLEET_KEY" : "") } }
                """
        let text = """
            policy: 1
            name: fleet
            rules:
              - { name: expired, when: { status: [401] }, then: refresh }
              - { name: revoked, when: { status: [403] }, then: logout }
            refresh:
              use: oauth2
              with: { token-url: "http://127.0.0.1:\(tokenPort)/token?p=\(slot)", client-id: app }
              timeout: \(timeout)
              limit: { count: 100, per: 30s }
            logout: { cooldown: 30s, cancel-in-flight: true }
            coordination: \(store)
            \(extra)
            """
        return try folder.write("policy-\(slot).yaml", text).path
    }

    /// Slot `slot`'s credentials file (a copy of the token server's first pair when it has none).
    func credentials(_ slot: Int) throws -> String {
        let path = folder.url.appendingPathComponent("credentials-\(slot).json").path
        if !FileManager.default.fileExists(atPath: path) {
            try FileManager.default.copyItem(atPath: seedPath, toPath: path)
        }
        return path
    }

    /// Starts `policy fetch` for slot `slot` (its policy must have been written).
    func fetch(
        slot: Int, count: Int, concurrency: Int = 2, path: String = "/api/profile", signed: Bool = false
    ) throws -> FetchProcess {
        var environment = ProcessInfo.processInfo.environment
        if signed { environment["FLEET_KEY"] = "a-fleet-key-of-at-least-thirty-two-bytes" }
        // FLEET_RIG_VERBOSE=1: every engine event on the process's stderr, for a failure's story.
        let verbose = ProcessInfo.processInfo.environment["FLEET_RIG_VERBOSE"] == "1" ? ["--verbose"] : []
        return try FetchProcess(
            ["fetch"] + verbose + [
                "--policy", folder.url.appendingPathComponent("policy-\(slot).yaml").path, "--credentials",
                try credentials(slot), "--count", String(count), "--concurrency", String(concurrency),
                "http://127.0.0.1:\(tokenPort)\(path)",
            ], environment: environment)
    }

    // MARK: - Waiting on signals

    /// Returns once `condition` holds, asking again every few milliseconds; fails after `within`.
    func waitUntil(
        _ what: String, within: Duration = .seconds(60), sourceLocation: SourceLocation = #_sourceLocation,
        _ condition: () throws -> Bool
    ) async throws {
        let giveUp = ContinuousClock.now + within
        while ContinuousClock.now < giveUp {
            if (try? condition()) == true { return }
            try await Task.sleep(for: .milliseconds(10))
        }
        Issue.record("never happened: \(what)", sourceLocation: sourceLocation)
        throw CLITestError.timedOut(arguments: [what], seconds: Int(within.components.seconds))
    }

    /// Waits until `processes` processes listen on the fleet's channel (each has joined the shared
    /// session and hears every announcement from now on) and the first expiry's refresh is done:
    /// a fault injected after this meets a fleet that is up, not one still starting.
    func waitForFleet(_ processes: Int, sourceLocation: SourceLocation = #_sourceLocation) async throws {
        try await waitUntil("\(processes) processes listening", sourceLocation: sourceLocation) {
            let reply = try redisCommand(["PUBSUB", "NUMSUB", "response-policy:{fleet}:events"])
            return (reply.items.last?.integer ?? 0) >= Int64(processes)
        }
        try await waitUntil("the first refresh", sourceLocation: sourceLocation) { refreshes() >= 1 }
    }

    // MARK: - Checks

    /// The token server's log shows an intact chain: no refresh token presented twice, none refused
    /// or revoked, each pair's refresh token presented by the next successful call, and the last
    /// pair issued held by some process (a credentials file) or by Redis: no pair lost.
    func expectChainIntact(sourceLocation: SourceLocation = #_sourceLocation) throws {
        let calls = tokenCalls()
        let bad = calls.filter { ["reuse", "refused", "revoked"].contains($0["result"] as? String ?? "") }
        #expect(bad.isEmpty, "token calls refused: \(bad)", sourceLocation: sourceLocation)
        #expect((try stats()["reuses"] as? Int) == 0, sourceLocation: sourceLocation)
        let ok = okCalls()
        for (earlier, later) in zip(ok, ok.dropFirst()) {
            #expect(
                later["presented"] as? String == earlier["issued"] as? String,
                "a pair was skipped: \(earlier) then \(later)", sourceLocation: sourceLocation)
        }
        guard let last = ok.last?["issued"] as? String else { return }
        let files = (try? FileManager.default.contentsOfDirectory(atPath: folder.url.path)) ?? []
        let held = files.filter { $0.hasPrefix("credentials-") }.contains { name in
            (try? String(contentsOfFile: folder.url.appendingPathComponent(name).path, encoding: .utf8))?
                .contains("\"\(last)\"") == true
        }
        let shared = (try? redisCommand(["HGET", "response-policy:{fleet}:session", "creds"]).text)??.contains(last)
        #expect(held || shared == true, "the last pair (\(last)) is held by nobody", sourceLocation: sourceLocation)
    }
}

/// One `policy fetch` process of a rig: its pid (to signal it), its output, its exit.
final class FetchProcess: @unchecked Sendable {
    // @unchecked: `process` is set once; the output is read by the drain threads into locked buffers.
    let process = Process()
    private let stdout = Locked(Data())
    private let stderr = Locked(Data())
    private let done = DispatchGroup()

    init(_ arguments: [String], environment: [String: String]) throws {
        process.executableURL = try policyBinary.get()
        process.arguments = arguments
        process.environment = environment
        process.currentDirectoryURL = repositoryRoot
        let out = Pipe()
        let err = Pipe()
        process.standardOutput = out
        process.standardError = err
        process.standardInput = FileHandle.nullDevice
        try process.run()
        for (pipe, buffer) in [(out, stdout), (err, stderr)] {
            done.enter()
            Thread.detachNewThread { [done] in
                let data = pipe.fileHandleForReading.readDataToEndOfFile()
                buffer.withLock { $0 = data }
                done.leave()
            }
        }
    }

    var pid: Int32 { process.processIdentifier }

    func signal(_ number: Int32) { kill(pid, number) }

    /// Waits for the exit (at most `seconds`, then kills it) and returns what it printed.
    func result(within seconds: Int = 120) async -> CLIResult {
        await withCheckedContinuation { continuation in
            Thread.detachNewThread { [self] in
                if done.wait(timeout: .now() + .seconds(seconds)) == .timedOut { kill(pid, SIGKILL) }
                process.waitUntilExit()
                done.wait()
                continuation.resume(
                    returning: CLIResult(
                        stdout: stdout.withLock { String(decoding: $0, as: UTF8.self) },
                        stderr: stderr.withLock { String(decoding: $0, as: UTF8.self) },
                        status: process.terminationStatus, crashed: process.terminationReason == .uncaughtSignal))
            }
        }
    }
}

/// A plain HTTP/1.1 exchange with the rig's token server.
extension FleetRig {
    func httpRequest(_ method: String, _ path: String, _ body: String?) throws -> (Int, String) {
        try loopbackHTTP(port: tokenPort, method, path, form: body)
    }
}

/// `scripts/oauth2-rotating-server.py` started with `arguments`, and the free loopback port it
/// says it listens on (its first line of output).
func startRotatingTokenServer(_ arguments: [String]) throws -> (Process, Int) {
    let server = Process()
    server.executableURL = URL(fileURLWithPath: "/usr/bin/env")
    server.arguments =
        ["python3", repositoryRoot.appendingPathComponent("scripts/oauth2-rotating-server.py").path] + arguments
    let output = Pipe()
    server.standardOutput = output
    server.standardError = FileHandle.nullDevice
    try server.run()
    var line = Data()
    var byte: UInt8 = 0
    let descriptor = output.fileHandleForReading.fileDescriptor
    while byte != UInt8(ascii: "\n"), read(descriptor, &byte, 1) == 1 { line.append(byte) }
    let text = String(decoding: line, as: UTF8.self)
    guard text.hasPrefix("listening "), let port = Int(text.dropFirst(10).prefix { $0.isNumber }) else {
        kill(server.processIdentifier, SIGKILL)
        throw CLITestError.binaryNotFound(searched: ["python3 scripts/oauth2-rotating-server.py"])
    }
    return (server, port)
}
