import Foundation
import ResponsePolicy
import ResponsePolicyTesting
import TestGate
import Testing

@testable import ResponsePolicyURLSession

/// The metrics against the real Prometheus (Debian's `prometheus` package): `promtool check metrics`
/// finds nothing to say about what `policy fetch --metrics` writes, the Prometheus server scrapes a
/// running `policy fetch --metrics-listen` and answers a PromQL query over its HTTP API with the
/// token calls the token server counted, and `prometheus-client`'s parsers (PyPI) read both formats.
///
/// Needs `promtool` and `prometheus` on PATH and the venv `.ci/run` makes (`.build/replay-venv`);
/// skipped without them locally, failing under CI (`CI` set).
@Suite(.measuresRealTime(filter: "PrometheusTests"), .loadGate(.realTime), .serialized)
struct PrometheusTests {
    static let promtool = RealTools.which("promtool")
    static let prometheus = RealTools.which("prometheus")
    static let python = RealTools.venvTool("python")

    static let needs = Comment(
        rawValue: "needs Debian's prometheus (apt-get install prometheus) and the venv: \(RealTools.makeVenv)")

    static func policy(tokenURL: String) -> String {
        """
        policy: 1
        name: scraped
        classify: { code: body.status }
        rules:
          - { name: token-expired, when: { code: [1401] }, then: refresh }
          - { name: transient, when: { status: [503] }, then: retry }
        refresh:
          use: oauth2
          with: { token-url: "\(tokenURL)", client-id: scraped }
        retry: { initial: 50ms, max-delay: 500ms }

        """
    }

    /// A folder with the policy and stale credentials for `server`.
    static func folder(_ server: FixtureServer) throws -> URL {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("prometheus-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        try Data(policy(tokenURL: server.url("/oauth/token").absoluteString).utf8).write(
            to: directory.appendingPathComponent("policy.yaml"))
        let credentials = directory.appendingPathComponent("credentials.json")
        try Data(#"{"access_token": "stale", "refresh_token": "refresh-0"}"#.utf8).write(to: credentials)
        try FileManager.default.setAttributes([.posixPermissions: 0o600], ofItemAtPath: credentials.path)
        return directory
    }

    struct Stats: Decodable {
        var counters: [String: Int]
    }

    @Test(.enabled(if: RealTools.runs([promtool]), Self.needs))
    func promtoolHasNothingToSayAboutTheExposition() async throws {
        let promtool = try RealTools.require(Self.promtool, "promtool")
        try await withFixtureServer("test_server") { server in
            let directory = try Self.folder(server)
            defer { try? FileManager.default.removeItem(at: directory) }
            let metricsFile = directory.appendingPathComponent("fetch.prom").path
            let run = try await runPolicy([
                "fetch", "--policy", directory.appendingPathComponent("policy.yaml").path, "--credentials",
                directory.appendingPathComponent("credentials.json").path, "--count", "40", "--concurrency", "8",
                "--metrics", metricsFile, server.url("/api/me").absoluteString,
            ])
            #expect(run.status == 0, "\(run.stdout)\(run.stderr)")
            let text = try String(contentsOfFile: metricsFile, encoding: .utf8)
            let stats = try await server.stats(Stats.self)
            #expect(
                text.contains("response_policy_token_calls_total \(stats.counters["token_calls"] ?? -1)\n"), "\(text)")
            #expect(text.contains(#"response_policy_requests_total{scope="default",result="delivered"} 40"#))
            #expect(!text.contains("stale") && !text.contains("refresh-0") && !text.contains("access-1"))
            let checked = try await runTool(promtool, ["check", "metrics"], stdin: metricsFile)
            #expect(checked.status == 0, "\(checked.output)")
            #expect(checked.output.isEmpty, "promtool says: \(checked.output)")
        }
    }

    @Test(.enabled(if: RealTools.runs([python]), Self.needs))
    func prometheusClientParsesBothFormats() async throws {
        let python = try RealTools.require(Self.python, "the replay venv's python")
        // The metrics of a storm with retries and a logout, in each format.
        let policy = try Policy.load(yaml: Policy.defaultPolicyText)
        let metrics = PolicyMetrics(policy: policy)
        let script = try #require(
            SimulationScript.parse(
                Array(
                    """
                    requests:
                      - { id: a, repeat: 20, responses: [{ body: '{"status":1401}' }, { status: 503 }, { body: '{"status":0}' }] }
                      - { id: b, at: 5s, responses: [{ body: '{"status":202}' }] }
                    refresh: [{ after: 120ms }]
                    """.utf8), file: nil
            ).0)
        let result = try await Simulator.run(policy: policy, script: script)
        for event in result.events { metrics.observe(event) }
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("promclient-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        try Data(metrics.exposition(.prometheus).utf8).write(to: directory.appendingPathComponent("text.prom"))
        try Data(metrics.exposition(.openMetrics).utf8).write(to: directory.appendingPathComponent("open.om"))
        let parser = """
            import json, sys
            from prometheus_client.parser import text_string_to_metric_families as text
            from prometheus_client.openmetrics.parser import text_string_to_metric_families as om
            def read(parse, path):
                out = {}
                for family in parse(open(path).read()):
                    for sample in family.samples:
                        key = sample.name + json.dumps(sample.labels, sort_keys=True)
                        out[key] = [family.type, sample.value]
                return out
            print(json.dumps({"text": read(text, sys.argv[1]), "om": read(om, sys.argv[2])}))
            """
        let parsed = try await runTool(
            python,
            [
                "-c", parser, directory.appendingPathComponent("text.prom").path,
                directory.appendingPathComponent("open.om").path,
            ])
        #expect(parsed.status == 0, "\(parsed.output)")
        let object = try JSONSerialization.jsonObject(with: Data(parsed.stdout.utf8)) as? [String: [String: [Any]]]
        let textSamples = try #require(object?["text"])
        let omSamples = try #require(object?["om"])
        func value(_ samples: [String: [Any]], _ key: String) -> Double? {
            (samples[key]?[1] as? NSNumber)?.doubleValue
        }
        #expect(value(textSamples, #"response_policy_requests_total{"result": "delivered", "scope": "default"}"#) == 20)
        #expect(value(omSamples, #"response_policy_requests_total{"result": "delivered", "scope": "default"}"#) == 20)
        #expect(value(omSamples, #"response_policy_token_calls_total{}"#) == Double(result.summary.refreshes))
        #expect(textSamples[#"response_policy_info{"policy": "mobile-api", "schema": "1", "version": "1.0.0"}"#] != nil)
        #expect(
            omSamples[#"response_policy_info{"policy": "mobile-api", "schema": "1", "version": "1.0.0"}"#]?.first
                as? String == "info")
        // Every sample of one format is in the other, with the same value.
        #expect(textSamples.count == omSamples.count, "\(Set(textSamples.keys).symmetricDifference(omSamples.keys))")
    }

    @Test(.enabled(if: RealTools.runs([prometheus]), Self.needs))
    func prometheusScrapesARunningFetchAndCountsTheTokenCallsTheServerSaw() async throws {
        let prometheus = try RealTools.require(Self.prometheus, "prometheus")
        try await withFixtureServer("test_server") { server in
            // Each API call takes 40 ms: 300 requests, 2 at once, last about 6 s, for scrapes to see.
            try await server.control(["api_delay": 0.04])
            let directory = try Self.folder(server)
            defer { try? FileManager.default.removeItem(at: directory) }
            let fetch = try RunningProcess(
                try policyBinary().path,
                [
                    "fetch", "--policy", directory.appendingPathComponent("policy.yaml").path, "--credentials",
                    directory.appendingPathComponent("credentials.json").path, "--count", "300", "--concurrency", "2",
                    "--metrics-listen", "127.0.0.1:0", server.url("/api/me").absoluteString,
                ])
            defer { fetch.stop() }
            var target = ""
            try await RealTools.wait("fetch printing its metrics address", seconds: 10) {
                guard
                    let line = fetch.stderr.split(separator: "\n").first(where: { $0.contains("serving metrics at") }),
                    let url = line.split(separator: " ").last, let host = URL(string: String(url))
                else { return false }
                target = "127.0.0.1:\(host.port ?? 0)"
                return true
            }
            let webPort = RealTools.freePort()
            let config = """
                global: { scrape_interval: 500ms, scrape_timeout: 400ms }
                scrape_configs:
                  - job_name: policy-fetch
                    static_configs: [{ targets: ["\(target)"] }]

                """
            try Data(config.utf8).write(to: directory.appendingPathComponent("prometheus.yml"))
            let scraper = try RunningProcess(
                prometheus,
                [
                    "--config.file=\(directory.appendingPathComponent("prometheus.yml").path)",
                    "--storage.tsdb.path=\(directory.appendingPathComponent("data").path)",
                    "--web.listen-address=127.0.0.1:\(webPort)", "--log.level=warn",
                ])
            defer { scraper.stop() }
            // The token server has seen the one refresh of the stale token (and no other).
            var answer = ""
            try await RealTools.wait("a PromQL answer with the token calls", seconds: 20) {
                guard fetch.isRunning || !answer.isEmpty else {
                    throw FixtureServer.Failure(
                        description: "fetch ended before Prometheus scraped it: \(fetch.stderr)")
                }
                guard
                    let (status, body) = try? await RealTools.get(
                        "http://127.0.0.1:\(webPort)/api/v1/query?query=response_policy_token_calls_total"),
                    status == 200, body.contains("\"value\"")
                else { return false }
                answer = body
                return true
            }
            let object = try JSONSerialization.jsonObject(with: Data(answer.utf8)) as? [String: Any]
            let data = object?["data"] as? [String: Any]
            let results = data?["result"] as? [[String: Any]]
            let value = (results?.first?["value"] as? [Any])?.last as? String
            let tokenCalls = try await server.stats(Stats.self).counters["token_calls"] ?? -1
            #expect(value == String(tokenCalls), "\(answer)")
            #expect(tokenCalls == 1)
            await fetch.waitForExit()
            #expect(fetch.status == 0, "\(fetch.stderr)")
        }
    }
}

/// Runs a tool to its end: its exit status, stdout, and stdout and stderr together.
func runTool(_ executable: String, _ arguments: [String], stdin path: String? = nil) async throws
    -> (status: Int32, stdout: String, output: String)
{
    try await withCheckedThrowingContinuation { continuation in
        Thread.detachNewThread {
            continuation.resume(
                with: Result {
                    let process = Process()
                    process.executableURL = URL(fileURLWithPath: executable)
                    process.arguments = arguments
                    let stdout = Pipe()
                    let stderr = Pipe()
                    process.standardOutput = stdout
                    process.standardError = stderr
                    process.standardInput =
                        path.flatMap { FileHandle(forReadingAtPath: $0) } ?? FileHandle.nullDevice
                    try process.run()
                    let errors = Locked(Data())
                    let group = DispatchGroup()
                    group.enter()
                    Thread.detachNewThread {
                        let data = stderr.fileHandleForReading.readDataToEndOfFile()
                        errors.withLock { $0 = data }
                        group.leave()
                    }
                    let out = stdout.fileHandleForReading.readDataToEndOfFile()
                    group.wait()
                    process.waitUntilExit()
                    let text = String(decoding: out, as: UTF8.self)
                    return (
                        process.terminationStatus, text,
                        text + String(decoding: errors.withLock { $0 }, as: UTF8.self)
                    )
                })
        }
    }
}
