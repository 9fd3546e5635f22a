import Foundation
import Testing

@testable import PolicyCLI

/// `policy fetch --metrics FILE` and `--metrics-listen HOST:PORT`: checked before anything is sent
/// (a bad address is a usage error, a file or address that cannot be had is exit 73), and the file
/// holds the run's exposition, written whole at the end. No server is needed: 127.0.0.1:9 refuses.
@Suite(.serialized)
struct FetchMetricsOptionTests {
    static let policy = """
        policy: 1
        name: metered
        rules: [{ name: transient, when: { status: [503] }, then: retry }]

        """

    @Test func aMalformedAddressIsAUsageError() async throws {
        let dir = try TemporaryDirectory()
        try dir.write("policy.yaml", Self.policy)
        let run = try await runPolicy(
            ["fetch", "--policy", "policy.yaml", "--metrics-listen", "metrics.example:80", "http://127.0.0.1:9/"],
            in: dir.url)
        #expect(run.status == 64)
        #expect(
            run.stderr.hasPrefix(
                "Error: Invalid value 'metrics.example:80' for '--metrics-listen <address>'; expected HOST:PORT with an IPv4 host"
            ), "\(run.stderr)")
    }

    @Test func aMetricsFileThatCannotBeWrittenStopsTheRunBeforeSending() async throws {
        let dir = try TemporaryDirectory()
        try dir.write("policy.yaml", Self.policy)
        let run = try await runPolicy(
            ["fetch", "--policy", "policy.yaml", "--metrics", "no/such/folder/m.prom", "http://127.0.0.1:9/"],
            in: dir.url)
        #expect(run.status == 73, "\(run.stderr)")
        #expect(run.stderr.contains("error: cannot write the metrics file 'no/such/folder/m.prom'; nothing was sent"))
        #expect(run.stdout.isEmpty)
    }

    @Test func anAddressInUseStopsTheRunBeforeSending() async throws {
        let dir = try TemporaryDirectory()
        try dir.write("policy.yaml", Self.policy)
        // Hold a port: the first fetch serves on it while the second asks for it.
        let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(descriptor) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        inet_pton(AF_INET, "127.0.0.1", &address.sin_addr)
        _ = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        listen(descriptor, 1)
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(descriptor, $0, &length) }
        }
        let port = UInt16(bigEndian: address.sin_port)
        let run = try await runPolicy(
            ["fetch", "--policy", "policy.yaml", "--metrics-listen", "127.0.0.1:\(port)", "http://127.0.0.1:9/"],
            in: dir.url)
        #expect(run.status == 73, "\(run.stderr)")
        #expect(run.stderr.contains("error: cannot listen on 127.0.0.1:\(port): "), "\(run.stderr)")
        #expect(run.stdout.isEmpty)
    }

    @Test func theFileHoldsTheRunsMetrics() async throws {
        let dir = try TemporaryDirectory()
        try dir.write("policy.yaml", Self.policy)
        let run = try await runPolicy(
            [
                "fetch", "--policy", "policy.yaml", "--count", "3", "--metrics", "m.prom", "--metrics-listen",
                "127.0.0.1:0", "http://127.0.0.1:9/",
            ], in: dir.url)
        #expect(run.status == 1)
        #expect(run.stderr.contains("policy: serving metrics at http://127.0.0.1:"), "\(run.stderr)")
        let text = try String(contentsOf: dir.url.appendingPathComponent("m.prom"), encoding: .utf8)
        #expect(text.contains("response_policy_info{policy=\"metered\",schema=\"1\",version=\"1.0.0\"} 1\n"))
        #expect(text.contains("response_policy_requests_total{scope=\"default\",result=\"failed\"} 3\n"))
        #expect(text.contains("response_policy_request_failures_total{scope=\"default\",reason=\"transport\"} 3\n"))
        #expect(text.contains("response_policy_attempt_errors_total{error=\"connection\"} 3\n"))
        #expect(
            text.contains("# TYPE response_policy_requests_in_flight gauge\nresponse_policy_requests_in_flight 0\n"))
        // Written whole, by a rename: no temporary file is left beside it.
        let left = try FileManager.default.contentsOfDirectory(atPath: dir.url.path).filter { $0.hasSuffix(".tmp") }
        #expect(left.isEmpty)
    }
}
