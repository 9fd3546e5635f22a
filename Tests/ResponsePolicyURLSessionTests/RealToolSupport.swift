import Foundation
import ResponsePolicy
import ResponsePolicyCurl
import TestSupport
import Testing

@testable import ResponsePolicyURLSession

// What PrometheusTests and RecorderReplayTests need: the real tools (Debian's prometheus and
// chromium, a venv with mitmproxy, Playwright and prometheus-client that `.ci/run` makes), long-running
// processes read while they run, and free loopback ports.

enum RealTools {
    /// The venv `.ci/run` makes: `.build/replay-venv` (mitmproxy, Playwright, prometheus-client).
    static let venv: String? = {
        var directory = URL(fileURLWithPath: #filePath)
        while directory.path != "/" {
            directory.deleteLastPathComponent()
            let candidate = directory.appendingPathComponent(".build/replay-venv/bin")
            if FileManager.default.isExecutableFile(atPath: candidate.appendingPathComponent("python").path) {
                return candidate.path
            }
            if FileManager.default.fileExists(atPath: directory.appendingPathComponent("Package.swift").path) { break }
        }
        return nil
    }()

    static let makeVenv =
        "python3 -m venv .build/replay-venv && .build/replay-venv/bin/pip install mitmproxy playwright prometheus-client"

    /// An executable on PATH (or at an absolute path), or `nil`.
    static func which(_ name: String) -> String? {
        if name.hasPrefix("/") { return FileManager.default.isExecutableFile(atPath: name) ? name : nil }
        for folder in (ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin").split(separator: ":") {
            let path = "\(folder)/\(name)"
            if FileManager.default.isExecutableFile(atPath: path) { return path }
        }
        return nil
    }

    static func venvTool(_ name: String) -> String? {
        guard let venv else { return nil }
        let path = venv + "/" + name
        return FileManager.default.isExecutableFile(atPath: path) ? path : nil
    }

    /// Whether the tests that need `tools` run: when all are here, or under CI (`CI` set), where a
    /// missing one fails the test rather than skipping it.
    static func runs(_ tools: [String?]) -> Bool {
        tools.allSatisfy { $0 != nil } || ProcessInfo.processInfo.environment["CI"] != nil
    }

    static func require(_ tool: String?, _ what: String) throws -> String {
        guard let tool else {
            throw FixtureServer.Failure(description: "CI is set but \(what) is missing (.ci/run installs it)")
        }
        return tool
    }

    /// A port nothing listens on now (bound and released: another process could take it first,
    /// which on a test machine's loopback does not happen).
    static func freePort() -> Int {
        let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(descriptor) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = 0
        inet_pton(AF_INET, "127.0.0.1", &address.sin_addr)
        _ = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(descriptor, $0, &length) }
        }
        return Int(UInt16(bigEndian: address.sin_port))
    }

    /// Whether something accepts connections on `port` now.
    static func listening(_ port: Int) -> Bool {
        let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(descriptor) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        inet_pton(AF_INET, "127.0.0.1", &address.sin_addr)
        return withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0
            }
        }
    }

    /// Polls `condition` every 100 ms until it holds or `seconds` pass (readiness of a process
    /// the test started: a port open, a line printed, a query answered).
    static func wait(
        _ what: String, seconds: Double, _ condition: () async throws -> Bool
    ) async throws {
        let deadline = ContinuousClock.now + .milliseconds(Int64(seconds * 1000))
        while ContinuousClock.now < deadline {
            if try await condition() { return }
            try await Task.sleep(for: .milliseconds(100))
        }
        throw FixtureServer.Failure(description: "\(what) did not happen within \(seconds)s")
    }

    /// GET `url` through the harness's transport (`HarnessTransport`): the body as text.
    static func get(_ url: String, headers: HTTPHeaders = [:]) async throws -> (Int, String) {
        guard let target = URL(string: url) else { throw FixtureServer.Failure(description: "bad URL \(url)") }
        let response = try await HarnessTransport.shared.send(HTTPRequest(url: target, headers: headers))
        return (response.status, String(decoding: response.body, as: UTF8.self))
    }
}

/// A process the test starts and reads while it runs; stopped by the test, or at the latest when
/// it is released.
final class RunningProcess: @unchecked Sendable {
    // @unchecked: `output` and `errors` are touched only under `lock`; the process is set once.
    private let process = Process()
    private let lock = NSLock()
    private var output = Data()
    private var errors = Data()

    init(_ executable: String, _ arguments: [String], environment: [String: String] = [:], in directory: URL? = nil)
        throws
    {
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = arguments
        process.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 }
        if let directory { process.currentDirectoryURL = directory }
        let stdout = Pipe()
        let stderr = Pipe()
        process.standardOutput = stdout
        process.standardError = stderr
        process.standardInput = FileHandle.nullDevice
        try process.run()
        readToEndOnThread(stdout.fileHandleForReading) { [weak self] data in
            self?.lock.withLock { self?.output.append(data) }
        }
        readToEndOnThread(stderr.fileHandleForReading) { [weak self] data in
            self?.lock.withLock { self?.errors.append(data) }
        }
    }

    deinit { stop() }

    var stdout: String { lock.withLock { String(decoding: output, as: UTF8.self) } }
    var stderr: String { lock.withLock { String(decoding: errors, as: UTF8.self) } }
    var isRunning: Bool { process.isRunning }
    var status: Int32 { process.terminationStatus }

    /// SIGTERM (mitmdump shuts down and writes its HAR on it; SIGINT may be ignored in a test
    /// process's children), then waits for the exit: `false` when it did not end within `seconds`
    /// (then it is killed).
    func shutDown(seconds: Double = 15) async -> Bool {
        if process.isRunning { kill(process.processIdentifier, SIGTERM) }
        let deadline = ContinuousClock.now + .milliseconds(Int64(seconds * 1000))
        while process.isRunning, ContinuousClock.now < deadline { try? await Task.sleep(for: .milliseconds(50)) }
        guard process.isRunning else { return true }
        kill(process.processIdentifier, SIGKILL)
        return false
    }

    func stop() {
        if process.isRunning { process.terminate() }
    }

    /// Waits for the process to end on a thread of its own (never blocking the test pool or
    /// Dispatch's global queue).
    func waitForExit() async {
        await withCheckedContinuation { continuation in
            Thread.detachNewThread {
                self.process.waitUntilExit()
                continuation.resume()
            }
        }
    }
}
