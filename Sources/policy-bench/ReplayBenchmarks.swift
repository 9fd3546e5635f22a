import Foundation
import ResponsePolicy
import ResponsePolicyTesting

/// `replay-1m`: `policy replay`'s reader and replayer over a HAR file of 1,000,000 requests, against
/// the same at 100,000, each in a child process of its own: the peak RSS must not grow with the
/// recording (bounded memory, streamed), and the wall time says what a replay of a day costs.
extension Benchmarks {
    /// The policy the generated recordings were made with: 1401 refreshes, 503 retries.
    static let replayPolicy = """
        policy: 1
        name: replay-bench
        classify: { code: body.status }
        rules:
          - { name: token-expired, when: { code: [1401] }, then: refresh }
          - { name: transient, when: { status: [503] }, then: retry }
        refresh:
          use: oauth2
          with: { token-url: "https://auth.example.com/oauth/token", client-id: bench }
        retry: { initial: 100ms, max-delay: 1s }

        """

    static func replay(quick: Bool) -> BenchResult {
        let big = quick ? 2_000 : 1_000_000
        let small = quick ? 200 : 100_000
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("policy-bench-replay-\(getpid())")
        try? FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let bigPath = directory.appendingPathComponent("big.har").path
        let smallPath = directory.appendingPathComponent("small.har").path
        let bigBytes = writeRecording(requests: big, to: bigPath)
        _ = writeRecording(requests: small, to: smallPath)
        let bigRun = replayInChildProcess(bigPath)
        let smallRun = replayInChildProcess(smallPath)
        return BenchResult(
            name: quick ? "replay" : "replay-1m", value: bigRun.wallMs, unit: "ms", baseline: smallRun.peakMiB,
            baselineName: "peak RSS (MiB) replaying \(small) requests", ratio: bigRun.peakMiB / smallRun.peakMiB,
            ratioMeaning: "peak RSS at \(big) requests / at \(small): about 1 when memory is bounded",
            extra: [
                ("requests", Double(big)), ("file_mib", Double(bigBytes) / 1_048_576),
                ("peak_rss_mib", bigRun.peakMiB), ("peak_rss_mib_small", smallRun.peakMiB),
                ("small_wall_ms", smallRun.wallMs), ("requests_per_second", Double(big) / (bigRun.wallMs / 1000)),
            ],
            goal: "peak RSS ratio < 1.5 (streamed)")
    }

    /// A HAR file of `requests` GETs a millisecond apart, 5 ms each; every 1,000th meets an
    /// expired token (1401), a token call and a re-send; every 997th a 503 and its retry.
    static func writeRecording(requests: Int, to path: String) -> Int {
        guard FileManager.default.createFile(atPath: path, contents: nil),
            let handle = FileHandle(forWritingAtPath: path)
        else { return 0 }
        defer { try? handle.close() }
        var written = 0
        var chunk =
            "{\"log\":{\"version\":\"1.2\",\"creator\":{\"name\":\"policy-bench\",\"version\":\"1\"},\"entries\":[\n"
        var first = true
        func date(_ seconds: Double) -> String {
            let whole = Int(seconds)
            let millis = Int(((seconds - Double(whole)) * 1000).rounded())
            let day = whole / 86400
            let rest = whole % 86400
            return String(
                format: "2026-01-%02dT%02d:%02d:%02d.%03dZ", 1 + day, rest / 3600, (rest % 3600) / 60, rest % 60,
                millis)
        }
        func entry(_ at: Double, _ ms: Double, _ method: String, _ url: String, _ status: Int, _ body: String) {
            if !first { chunk += ",\n" }
            first = false
            chunk +=
                "{\"startedDateTime\":\"\(date(at))\",\"time\":\(ms),\"request\":{\"method\":\"\(method)\",\"url\":\"\(url)\","
                + "\"httpVersion\":\"HTTP/1.1\",\"headers\":[{\"name\":\"Authorization\",\"value\":\"Bearer bench-secret\"}]},"
                + "\"response\":{\"status\":\(status),\"statusText\":\"\",\"headers\":[{\"name\":\"Content-Type\","
                + "\"value\":\"application/json\"}],\"content\":{\"size\":\(body.utf8.count),\"mimeType\":\"application/json\","
                + "\"text\":\"\(body.replacingOccurrences(of: "\"", with: "\\\""))\"}},\"timings\":{\"send\":0,\"wait\":\(ms),\"receive\":0}}"
            if chunk.utf8.count > 1 << 20 {
                written += chunk.utf8.count
                handle.write(Data(chunk.utf8))
                chunk = ""
            }
        }
        for index in 0..<requests {
            let at = Double(index) / 1000
            let url = "https://api.example.com/items/\(index % 5000)"
            if index % 1000 == 999 {
                entry(at, 5, "GET", url, 200, "{\"status\":1401}")
                entry(
                    at + 0.006, 20, "POST", "https://auth.example.com/oauth/token", 200,
                    "{\"access_token\":\"bench-token\",\"expires_in\":3600}")
                entry(at + 0.027, 5, "GET", url, 200, "{\"status\":0}")
            } else if index % 997 == 996 {
                entry(at, 5, "GET", url, 503, "")
                entry(at + 0.106, 5, "GET", url, 200, "{\"status\":0}")
            } else {
                entry(at, 5, "GET", url, 200, "{\"status\":0}")
            }
        }
        chunk += "\n]}}\n"
        written += chunk.utf8.count
        handle.write(Data(chunk.utf8))
        return written
    }

    /// In the child: replays `path` and prints `PEAK_MIB WALL_MS REQUESTS`.
    static func replayRun(path: String) -> String {
        guard let policy = try? Policy.load(yaml: replayPolicy),
            let source = try? HARRecording(
                path: path, policy: policy, tokenPaths: ["/oauth/token"], logoutPaths: [])
        else { return "nan nan 0" }
        let start = ContinuousClock.now
        let result = try? Replayer.run(policies: [policy], source: source)
        let wall = (ContinuousClock.now - start).nanoseconds / 1e6
        return "\(residentMemory().peak / 1_048_576) \(wall) \(result?.summaries.first?.delivered ?? 0)"
    }

    static func replayInChildProcess(_ path: String) -> (peakMiB: Double, wallMs: Double) {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: CommandLine.arguments[0]).standardizedFileURL
        if !FileManager.default.isExecutableFile(atPath: process.executableURL?.path ?? "") {
            process.executableURL = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath()
        }
        process.arguments = ["--replay-run", path]
        let pipe = Pipe()
        process.standardOutput = pipe
        do {
            try process.run()
        } catch {
            return (.nan, .nan)
        }
        let output = pipe.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        let parts = String(decoding: output, as: UTF8.self).split(separator: " ").map {
            Double($0.trimmingCharacters(in: .whitespacesAndNewlines)) ?? .nan
        }
        guard parts.count >= 2 else { return (.nan, .nan) }
        return (parts[0], parts[1])
    }
}
