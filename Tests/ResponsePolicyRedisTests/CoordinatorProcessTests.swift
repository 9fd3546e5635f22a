import Foundation
import ResponsePolicy
import ResponsePolicyRedis
import TestGate
import TestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// Coordinators in separate processes (`coordinator-probe`), as a fleet would run them: one
/// refresh among four, and a lease holder killed with SIGKILL mid-refresh.
@Suite(.measuresRealTime(filter: "CoordinatorProcessTests"), .loadGate(.realTime), .serialized)
struct CoordinatorProcessTests {
    enum Backend: String, CaseIterable, Sendable { case redis, file }

    @Test(arguments: Backend.allCases)
    func fourProcessesMeetingOneExpiredTokenMakeOneRefresh(_ backend: Backend) throws {
        if backend == .redis, !RedisServerFixture.isInstalled { return }
        let folder = try ProbeFolder()
        let server = backend == .redis ? try RedisServerFixture() : nil
        for trial in 0..<3 {
            let counter = folder.path("counter-\(trial)")
            let target =
                backend == .redis
                ? ["redis", server?.url ?? "", "key-\(trial)"] : ["file", folder.path("credentials-\(trial).json")]
            let probes = try (0..<4).map { _ in try Probe(target + ["--counter", counter]) }
            for probe in probes { #expect(probe.waitFor("ready")) }
            for probe in probes { probe.send("go") }
            for probe in probes { probe.waitForExit() }
            let refreshes = (try? String(contentsOfFile: counter, encoding: .utf8))?.split(separator: "\n").count ?? 0
            #expect(refreshes == 1, "trial \(trial): \(probes.map(\.output))")
            let outputs = probes.map(\.output)
            #expect(outputs.filter { $0.contains("published 1") && $0.contains("turn lease") }.count == 1)
            #expect(
                outputs.filter { $0.contains("turn published 1") || $0.contains("turn newer 1") }.count == 3,
                "\(outputs)")
        }
    }

    @Test(arguments: Backend.allCases)
    func aLeaseHolderKilledMidRefreshDelaysTheOthersByAtMostTheLease(_ backend: Backend) throws {
        if backend == .redis, !RedisServerFixture.isInstalled { return }
        let folder = try ProbeFolder()
        let server = backend == .redis ? try RedisServerFixture() : nil
        let counter = folder.path("counter")
        let target = backend == .redis ? ["redis", server?.url ?? "", "k"] : ["file", folder.path("credentials.json")]
        // The refresh timeout within the lease: a lease is never shorter than the refresh it covers.
        let options = ["--counter", counter, "--lease", "600", "--timeout", "500"]
        let holder = try Probe(target + options + ["--hold", "60000"])
        #expect(holder.waitFor("ready"))
        holder.send("go")
        #expect(holder.waitFor("refreshing"))
        let next = try Probe(target + ["--counter", counter, "--hold", "10"])  // a long lease of its own
        #expect(next.waitFor("ready"))
        holder.kill()
        let killed = ContinuousClock.now
        next.send("go")
        #expect(next.waitFor("published 1"), "\(next.output)")
        let delay = ContinuousClock.now - killed
        #expect(delay < .milliseconds(600 + 3_000), "took over after \(delay)")
        #expect(next.output.contains("turn lease 2"))
    }
}

/// A temporary folder for probe files.
final class ProbeFolder: Sendable {
    let url: URL
    init() throws {
        url = FileManager.default.temporaryDirectory.appendingPathComponent("probe-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    }
    func path(_ name: String) -> String { url.appendingPathComponent(name).path }
    deinit { try? FileManager.default.removeItem(at: url) }
}

/// One `coordinator-probe` child process, its stdout collected line by line.
final class Probe: @unchecked Sendable {
    // @unchecked: `lines` lives behind its lock; the process and pipes are only touched by the test.
    private let process = Process()
    private let input = Pipe()
    private let lines = Locked("")
    /// Set when stdout reaches its end: every line the probe wrote has been read.
    private let ended = Locked(false)

    static let binary: URL? = {
        let names = ["coordinator-probe"]
        var folders = [Bundle.main.bundleURL, Bundle.main.bundleURL.deletingLastPathComponent()]
        if let executable = Bundle.main.executableURL { folders.append(executable.deletingLastPathComponent()) }
        var root = URL(fileURLWithPath: #filePath)
        while root.path != "/"
            && !FileManager.default.fileExists(atPath: root.appendingPathComponent("Package.swift").path)
        {
            root.deleteLastPathComponent()
        }
        folders.append(root.appendingPathComponent(".build/debug"))
        for folder in folders {
            for name in names
            where FileManager.default.isExecutableFile(atPath: folder.appendingPathComponent(name).path) {
                return folder.appendingPathComponent(name)
            }
        }
        return nil
    }()

    init(_ arguments: [String]) throws {
        guard let binary = Self.binary else { throw FixtureError("coordinator-probe is not built; run swift build") }
        process.executableURL = binary
        process.arguments = arguments
        let output = Pipe()
        process.standardOutput = output
        process.standardInput = input
        process.standardError = FileHandle.nullDevice
        let handle = output.fileHandleForReading
        let lines = self.lines
        let ended = self.ended
        try process.run()
        readToEndOnThread(handle) { data in
            lines.withLock { $0 += String(decoding: data, as: UTF8.self) }
        } ended: {
            ended.withLock { $0 = true }
        }
    }

    var output: String { lines.withLock { $0 } }

    func waitFor(_ text: String, seconds: Double = 10) -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            if output.contains(text) { return true }
            usleep(2000)
        }
        return false
    }

    func send(_ line: String) {
        input.fileHandleForWriting.write(Data((line + "\n").utf8))
    }

    func waitForExit(seconds: Double = 20) {
        let deadline = Date().addingTimeInterval(seconds)
        while process.isRunning, Date() < deadline { usleep(5000) }
        if process.isRunning { kill() }
        // The last output: read until the pipe's end, not for a while.
        let drained = Date().addingTimeInterval(10)
        while !ended.withLock({ $0 }), Date() < drained { usleep(1000) }
    }

    func kill() {
        if process.isRunning {
            Glibc.kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }
    }

    deinit { kill() }
}
