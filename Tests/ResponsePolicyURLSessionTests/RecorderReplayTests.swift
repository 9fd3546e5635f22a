import Foundation
import ResponsePolicy
import TestGate
import Testing

@testable import ResponsePolicyURLSession

/// `policy replay` of recordings made by real recorders, read unchanged: mitmproxy's HAR export
/// (`mitmdump --set hardump`) in front of the loopback test server while `policy fetch` runs a
/// 1401 storm and a 202 logout through it, and headless Chromium (Debian's, its network events
/// recorded as HAR by Playwright) loading a loopback page whose script refreshes once on 1401.
/// With the policy that was live every request comes out as recorded; with a changed one the
/// differences are shown; no token of the recording reaches the output.
///
/// Needs the venv `.ci/run` makes (`.build/replay-venv`: mitmproxy, Playwright) and Debian's
/// chromium; skipped without them locally, failing under CI (`CI` set).
@Suite(.measuresRealTime(filter: "RecorderReplayTests"), .loadGate(.realTime), .serialized)
struct RecorderReplayTests {
    static let mitmdump = RealTools.venvTool("mitmdump")
    static let python = RealTools.venvTool("python")
    static let chromium = RealTools.which("chromium")

    static let needs = Comment(
        rawValue: "needs Debian's chromium (apt-get install chromium) and the venv: \(RealTools.makeVenv)")

    static let policy = """
        policy: 1
        name: recorded
        classify: { code: body.status }
        rules:
          - { name: token-expired, when: { code: [1401] }, then: refresh }
          - { name: forced-logout, when: { code: [202] }, then: logout }
          - { name: transient, when: { status: [502, 503, 504] }, then: retry }
        refresh:
          use: oauth2
          with: { token-url: "TOKEN_URL", client-id: recorded }
        retry: { initial: 100ms, max-delay: 2s }

        """
    /// The same, with 1401 a reason to log out rather than refresh.
    static let strict = policy.replacingOccurrences(
        of: "when: { code: [1401] }, then: refresh", with: "when: { code: [1401] }, then: logout")

    /// The `attempts` of a JSON summary line.
    static func attempts(_ summary: String) -> Int { count("attempts", summary) }

    /// A count of a JSON summary line (`Int.max` when it has none).
    static func count(_ key: String, _ summary: String) -> Int {
        guard let range = summary.range(of: "\"\(key)\":") else { return Int.max }
        return Int(summary[range.upperBound...].prefix { $0.isNumber }) ?? Int.max
    }

    struct Stats: Decodable {
        var counters: [String: Int]
    }

    static func directory() throws -> URL {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("recorder-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        return directory
    }

    /// `policy fetch` of 20 requests at once through mitmdump in front of the test server in
    /// `mode`; the HAR mitmdump wrote, and the server's counters.
    func recordWithMitmproxy(_ mode: String, in directory: URL) async throws -> (har: String, stats: Stats) {
        let mitmdump = try RealTools.require(Self.mitmdump, "mitmdump")
        var recorded: (String, Stats)?
        try await withFixtureServer("test_server") { server in
            try await server.control(["api_mode": mode])
            let port = RealTools.freePort()
            let har = directory.appendingPathComponent("mitm-\(mode).har").path
            // Through a launcher that unblocks signals and restores SIGINT's default before it
            // becomes mitmdump: a test process's children inherit a blocked or ignored signal, and
            // mitmdump then never hears the one that makes it write its HAR.
            let python = try RealTools.require(Self.python, "the replay venv's python")
            let proxy = try RunningProcess(
                python,
                [
                    "-c",
                    "import os, signal, sys; signal.pthread_sigmask(signal.SIG_SETMASK, []); "
                        + "signal.signal(signal.SIGINT, signal.SIG_DFL); signal.signal(signal.SIGTERM, signal.SIG_DFL); "
                        + "os.execv(sys.argv[1], sys.argv[1:])",
                    mitmdump,
                    "--mode", "reverse:http://127.0.0.1:\(server.port)", "--listen-host", "127.0.0.1", "--listen-port",
                    "\(port)", "--set", "hardump=\(har)", "-q",
                ])
            defer { proxy.stop() }
            try await RealTools.wait("mitmdump listening", seconds: 20) { RealTools.listening(port) }
            let policyFile = directory.appendingPathComponent("live.yaml")
            try Data(
                Self.policy.replacingOccurrences(of: "TOKEN_URL", with: "http://127.0.0.1:\(port)/oauth/token").utf8
            )
            .write(to: policyFile)
            let credentials = directory.appendingPathComponent("credentials.json")
            try Data(#"{"access_token": "stale", "refresh_token": "refresh-0"}"#.utf8).write(to: credentials)
            try FileManager.default.setAttributes([.posixPermissions: 0o600], ofItemAtPath: credentials.path)
            let run = try await runPolicy([
                "fetch", "--policy", policyFile.path, "--credentials", credentials.path, "--count", "20",
                "--concurrency", "20", "http://127.0.0.1:\(port)/api/orders",
            ])
            #expect(run.status == (mode == "logout" ? 1 : 0), "\(run.stdout)\(run.stderr)")
            #expect(await proxy.shutDown(), "mitmdump did not shut down: \(proxy.stderr)")
            #expect(FileManager.default.fileExists(atPath: har), "mitmdump wrote no HAR: \(proxy.stderr)")
            recorded = (har, try await server.stats(Stats.self))
        }
        return try #require(recorded)
    }

    /// The policy files the replays run with (the live one's token URL is the proxy's; a replay
    /// knows token calls by the URL's path, as a proxy may rewrite the host).
    func writePolicies(in directory: URL) throws -> (live: String, strict: String) {
        let live = directory.appendingPathComponent("replay-live.yaml")
        let strict = directory.appendingPathComponent("replay-strict.yaml")
        try Data(Self.policy.replacingOccurrences(of: "TOKEN_URL", with: "https://auth.example.com/oauth/token").utf8)
            .write(to: live)
        try Data(Self.strict.replacingOccurrences(of: "TOKEN_URL", with: "https://auth.example.com/oauth/token").utf8)
            .write(to: strict)
        return (live.path, strict.path)
    }

    @Test(.enabled(if: RealTools.runs([mitmdump]), Self.needs))
    func aMitmproxyStormComesOutAsRecordedAndAStricterPolicyDiffers() async throws {
        let directory = try Self.directory()
        defer { try? FileManager.default.removeItem(at: directory) }
        let (har, stats) = try await recordWithMitmproxy("normal", in: directory)
        let (live, strict) = try writePolicies(in: directory)
        let replay = try await runPolicy(["replay", live, har, "--format", "json"])
        #expect(replay.status == 0, "\(replay.stdout.suffix(2000))\(replay.stderr)")
        let summary = replay.stdoutLines.last ?? ""
        #expect(summary.contains(#""requests":20,"delivered":20"#), "\(summary)")
        // As many token calls as the server answered, and the attempts it saw.
        #expect(summary.contains(#""refreshes":\#(stats.counters["token_calls"] ?? -1),"#), "\(summary)")
        // No more attempts than the server saw: a replayed request signed with the new token skips
        // the answers the recording got with the old one (on the virtual clock the refresh may end
        // before a request the real client sent stale).
        #expect(Self.attempts(summary) <= stats.counters["api_calls"] ?? -1, "\(summary)")
        for token in ["stale", "refresh-0", "access-1", "refresh-1"] {
            #expect(!replay.stdout.contains("\"\(token)\"") && !replay.stdout.contains("Bearer"), "\(token) shown")
        }
        let against = try await runPolicy(["replay", live, har, "--against", strict, "--format", "json"])
        #expect(against.status == 1)
        #expect(against.stdoutLines.filter { $0.contains(#""event":"difference""#) }.count == 20)
    }

    @Test(.enabled(if: RealTools.runs([mitmdump]), Self.needs))
    func aMitmproxyLogoutComesOutAsRecorded() async throws {
        let directory = try Self.directory()
        defer { try? FileManager.default.removeItem(at: directory) }
        let (har, stats) = try await recordWithMitmproxy("logout", in: directory)
        let (live, _) = try writePolicies(in: directory)
        let replay = try await runPolicy(["replay", live, har, "--format", "json"])
        let summary = replay.stdoutLines.last ?? ""
        // Every request the recording shows (those that reached the proxy; the rest were refused in
        // the cooldown, never sent) is logged out, by one logout.
        let sent = stats.counters["api_calls"] ?? -1
        let requests = Self.count("requests", summary)
        #expect(requests >= sent && requests <= 20, "\(summary)")
        #expect(summary.contains(#""delivered":0,"failed":0,"logged-out":\#(requests)"#), "\(summary)")
        #expect(summary.contains(#""logouts":1"#), "\(summary)")
        // A request that went out as the 202 landed may show an answer its caller never got (the
        // client cancelled it mid-answer): the only way one may come out otherwise than recorded.
        let otherwise = replay.stdoutLines.filter { $0.contains(#""event":"recording-mismatch""#) }
        #expect(replay.status == (otherwise.isEmpty ? 0 : 1), "\(replay.stdout.suffix(2000))\(replay.stderr)")
        for line in otherwise {
            #expect(line.contains(#""recorded":{"result":"delivered","status":200}"#), "\(line)")
            #expect(line.contains(#""replayed":{"result":"logged-out""#), "\(line)")
        }
    }

    @Test(.enabled(if: RealTools.runs([python, chromium]), Self.needs))
    func aChromiumRecordingComesOutAsRecordedAndAStricterPolicyDiffers() async throws {
        let python = try RealTools.require(Self.python, "the replay venv's python")
        let chromium = try RealTools.require(Self.chromium, "chromium")
        let directory = try Self.directory()
        defer { try? FileManager.default.removeItem(at: directory) }
        guard let script = Bundle.module.url(forResource: "chromium_har", withExtension: "py", subdirectory: "Fixtures")
        else { throw FixtureServer.Failure(description: "Fixtures/chromium_har.py is missing from the test bundle") }
        let har = directory.appendingPathComponent("chromium.har").path
        let recorded = try await runTool(python, [script.path, har, chromium, "12"])
        #expect(recorded.status == 0, "\(recorded.output)")
        let counts = try JSONSerialization.jsonObject(with: Data(recorded.stdout.utf8)) as? [String: Int]
        let (live, strict) = try writePolicies(in: directory)
        let replay = try await runPolicy(["replay", live, har, "--format", "json"])
        #expect(replay.status == 0, "\(replay.stdout.suffix(2000))\(replay.stderr)")
        let summary = replay.stdoutLines.last ?? ""
        // The page itself and its 12 API requests, one refresh, each API request sent twice.
        #expect(summary.contains(#""requests":13,"delivered":13"#), "\(summary)")
        #expect(summary.contains(#""refreshes":\#(counts?["token_calls"] ?? -1),"#), "\(summary)")
        #expect(Self.attempts(summary) <= (counts?["api_calls"] ?? -1) + 1, "\(summary)")
        #expect(!replay.stdout.contains("page-refresh-secret") && !replay.stdout.contains("new-page-token"))
        let against = try await runPolicy(["replay", live, har, "--against", strict])
        #expect(against.status == 1)
        #expect(against.stdout.contains("12 of 13 requests differ between the policies"), "\(against.stdout)")
    }
}

extension PolicyRun {
    /// Stdout's lines, without the empty one after the last newline.
    var stdoutLines: [String] {
        stdout.split(separator: "\n", omittingEmptySubsequences: false).map(String.init).filter { !$0.isEmpty }
    }
}
