import Foundation
import Testing

@testable import PolicyCLI
@testable import ResponsePolicy
@testable import ResponsePolicyTesting

/// `PolicyMetrics` counts what the engine's events say: the shipped simulation scripts run on the
/// virtual clock, their events go to a `PolicyMetrics`, and its counters must agree with the
/// simulator's own summary (requests by result, attempts, token calls, logouts) for every script.
struct PolicyMetricsTests {
    static let examples = "examples/simulations"

    /// Runs an example script and feeds its events to fresh metrics.
    static func run(_ name: String) async throws -> (PolicyMetrics, Simulator.Summary) {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent()
        let path = root.appendingPathComponent("\(examples)/\(name)").path
        let bytes = try Policy.readFile(path, limits: .default)
        let parsed = Policy.parse(bytes: bytes, limits: .default)
        let script = try #require(SimulationScript.parse(parsed, file: path).0)
        let (expectations, _) = SimulationExpectations.parse(parsed, file: path)
        let policyName = try #require(expectations.policy)
        let folder = URL(fileURLWithPath: path).deletingLastPathComponent()
        let policy = try Policy.load(path: folder.appendingPathComponent(policyName).path)
        let metrics = PolicyMetrics(policy: policy)
        let result = try await Simulator.run(policy: policy, script: script) { file throws(PolicyError) -> Policy in
            try Policy.load(path: folder.appendingPathComponent(file).path)
        }
        for event in result.events { metrics.observe(event) }
        return (metrics, result.summary)
    }

    /// The value of one sample line (`name{labels} value`) of an exposition, 0 when absent.
    static func value(_ exposition: String, _ sample: String) -> Double {
        for line in exposition.split(separator: "\n") where line.hasPrefix(sample + " ") {
            return Double(line.dropFirst(sample.count + 1)) ?? .nan
        }
        return 0
    }

    /// The sum of every sample of a metric (all label sets).
    static func sum(_ exposition: String, _ name: String) -> Double {
        exposition.split(separator: "\n").filter { $0.hasPrefix(name + "{") || $0.hasPrefix(name + " ") }
            .compactMap { $0.split(separator: " ").last.flatMap { Double($0) } }.reduce(0, +)
    }

    static var scripts: [String] {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().appendingPathComponent(examples)
        return ((try? FileManager.default.contentsOfDirectory(atPath: root.path)) ?? [])
            .filter { $0.hasSuffix(".yaml") }.sorted()
    }

    @Test(arguments: scripts)
    func countersAgreeWithTheSimulatorsSummary(_ name: String) async throws {
        let (metrics, summary) = try await Self.run(name)
        let text = metrics.exposition()
        func requests(_ result: String) -> Double {
            Self.sum(text, "response_policy_requests_total") == 0
                ? 0
                : text.split(separator: "\n").filter {
                    $0.hasPrefix("response_policy_requests_total{") && $0.contains("result=\"\(result)\"")
                }.compactMap { $0.split(separator: " ").last.flatMap { Double($0) } }.reduce(0, +)
        }
        #expect(requests("delivered") == Double(summary.delivered), "\(name)")
        #expect(requests("failed") == Double(summary.failed), "\(name)")
        #expect(requests("logged_out") == Double(summary.loggedOut), "\(name)")
        #expect(Self.value(text, "response_policy_attempts_total") == Double(summary.attempts), "\(name)")
        #expect(Self.value(text, "response_policy_token_calls_total") == Double(summary.refreshes), "\(name)")
        #expect(Self.sum(text, "response_policy_logouts_total") == Double(summary.logouts), "\(name)")
        // Failed requests are all classified, and each refresh that ended says how.
        #expect(Self.sum(text, "response_policy_request_failures_total") == Double(summary.failed), "\(name)")
        #expect(!text.contains("reason=\"other\""), "\(name): a failure or logout without its class")
    }

    @Test func aStormIsOneOkRefreshWithItsDurationAndLag() async throws {
        let (metrics, _) = try await Self.run("01-refresh-storm.yaml")
        let text = metrics.exposition()
        #expect(Self.value(text, #"response_policy_requests_total{scope="default",result="delivered"}"#) == 51)
        #expect(Self.value(text, #"response_policy_refreshes_total{result="ok"}"#) == 1)
        #expect(Self.value(text, "response_policy_refresh_duration_seconds_count") == 1)
        #expect(Self.value(text, "response_policy_refresh_duration_seconds_sum") == 0.1)
        #expect(Self.value(text, #"response_policy_refresh_duration_seconds_bucket{le="0.05"}"#) == 0)
        #expect(Self.value(text, #"response_policy_refresh_duration_seconds_bucket{le="0.1"}"#) == 1)
        #expect(Self.value(text, "response_policy_refresh_lag_seconds_sum") == 0.1)
        #expect(
            Self.value(text, #"response_policy_rule_matches_total{rule="token-expired",action="refresh"}"#) == 51)
    }

    @Test func aFailedRefreshIsDefinitiveAndItsLogoutStartsTheCooldown() async throws {
        let (metrics, _) = try await Self.run("05-refresh-failure.yaml")
        let text = metrics.exposition()
        #expect(Self.value(text, #"response_policy_refreshes_total{result="definitive"}"#) == 1)
        #expect(Self.value(text, #"response_policy_logouts_total{reason="refresh_failed",rule=""}"#) == 1)
        #expect(Self.value(text, "response_policy_cooldown_seconds_total") == 20)
    }

    @Test func aRefreshStoppedByTheLimitIsLimitedAndMakesNoCall() async throws {
        let (metrics, summary) = try await Self.run("08-refresh-limit.yaml")
        let text = metrics.exposition()
        #expect(Self.value(text, #"response_policy_refreshes_total{result="limited"}"#) == 1)
        #expect(Self.value(text, "response_policy_token_calls_total") == Double(summary.refreshes))
        // The lag runs from the first trigger to the next new token: a refusal keeps it open.
        #expect(Self.value(text, "response_policy_refresh_lag_seconds_count") == 3)
    }

    @Test func retriesAndBudgetRefusalsAreByRule() async throws {
        let (metrics, _) = try await Self.run("15-retry-budget.yaml")
        let text = metrics.exposition()
        #expect(Self.sum(text, "response_policy_retry_budget_refusals_total") > 0)
        #expect(Self.sum(text, "response_policy_retries_total") > 0)
        #expect(
            Self.value(text, "response_policy_retry_wait_seconds_count")
                == Self.sum(text, "response_policy_retries_total"))
    }

    @Test func openMetricsNamesFamiliesAndEndsWithEOF() async throws {
        let (metrics, _) = try await Self.run("01-refresh-storm.yaml")
        let text = metrics.exposition(.openMetrics)
        #expect(text.hasSuffix("# EOF\n"))
        #expect(text.contains("# TYPE response_policy_requests counter\n"))
        #expect(text.contains("# TYPE response_policy info\n"))
        #expect(text.contains("response_policy_info{policy=\"mobile-api\",schema=\"1\",version=\"1.0.0\"} 1\n"))
        #expect(text.contains("# UNIT response_policy_refresh_duration_seconds seconds\n"))
        let prometheus = metrics.exposition()
        #expect(prometheus.contains("# TYPE response_policy_requests_total counter\n"))
        #expect(prometheus.contains("# TYPE response_policy_info gauge\n"))
        #expect(!prometheus.contains("# EOF"))
        #expect(
            PolicyMetrics.Format(accept: "application/openmetrics-text;version=1.0.0,text/plain;q=0.5") == .openMetrics)
        #expect(PolicyMetrics.Format(accept: "text/plain") == .prometheus)
        #expect(PolicyMetrics.Format(accept: nil) == .prometheus)
    }

    @Test func labelsAreBoundedAndEscaped() {
        let metrics = PolicyMetrics()
        for index in 0..<(PolicyMetrics.maxSeriesPerMetric + 100) {
            var event = PolicyEvent(.response, time: .zero, request: "r\(index)")
            event.rule = "rule-\(index)"
            event.action = .retry
            metrics.observe(event)
        }
        let text = metrics.exposition()
        let series = text.split(separator: "\n").filter { $0.hasPrefix("response_policy_retries_total{") }
        #expect(series.count == PolicyMetrics.maxSeriesPerMetric + 1)
        #expect(Self.value(text, #"response_policy_retries_total{rule="other"}"#) == 100)
        #expect(MetricsExposition.escapeLabel("a\"b\\c\nd") == #"a\"b\\c\nd"#)
    }

    @Test func anAttachedEngineShowsItsGaugesAndPolicy() async throws {
        let policy = try Policy.load(yaml: Policy.defaultPolicyText)
        let metrics = PolicyMetrics()
        var options = PolicyEngine.Options()
        options.observers = [metrics]
        let engine = PolicyEngine(
            policy: policy, transport: StaticTransport(),
            credentials: MemoryCredentialStore(Credentials(accessToken: "t")),
            options: options)
        metrics.attach(engine)
        _ = try await engine.send(HTTPRequest(url: URL(fileURLWithPath: "/profile")))
        let text = metrics.exposition()
        #expect(text.contains("response_policy_info{policy=\"\(policy.name)\""))
        #expect(Self.value(text, "response_policy_requests_in_flight") == 0)
        #expect(Self.value(text, "response_policy_credentials_generation") == 0)
        #expect(text.contains("# TYPE response_policy_cooldown_remaining_seconds gauge"))
        #expect(!text.contains("Bearer") && !text.contains("\"t\""))
    }

    struct StaticTransport: Transport {
        func send(_ request: HTTPRequest) async throws -> HTTPResponse {
            HTTPResponse(status: 200, body: Data("{\"status\":0}".utf8))
        }
    }
}
