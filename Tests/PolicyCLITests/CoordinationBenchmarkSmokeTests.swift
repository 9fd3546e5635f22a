import Foundation
import TestGate
import Testing

/// Keeps `policy-bench --only coordination` working; its counts (not its timings) are asserted:
/// two round trips per refresh, one refresh per storm, no Redis command on the hot path.
@Suite(.loadGate(.saturating))
struct CoordinationBenchmarkSmokeTests {
    @Test(.enabled(if: FleetEndToEndTests.redisInstalled, "needs redis-server: apt-get install redis-server"))
    func quickCoordinationRunCountsRoundTrips() async throws {
        let bench = try policyBinary.get().deletingLastPathComponent().appendingPathComponent("policy-bench")
        try #require(FileManager.default.isExecutableFile(atPath: bench.path), "build policy-bench first")
        let result = try await runExecutable(bench, ["--quick", "--json", "--only", "coordination"], timeout: 120)
        #expect(result.status == 0, "stderr: \(result.stderr)")
        let json = try #require(try JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [String: Any])
        let results = try #require(json["results"] as? [[String: Any]])
        func entry(_ name: String) throws -> [String: Any] {
            try #require(results.first { $0["name"] as? String == name })
        }
        #expect(try entry("coordination-refresh")["round_trips_per_refresh"] as? NSNumber == 2)
        #expect(try entry("coordination-refresh-signed")["round_trips_per_refresh"] as? NSNumber == 2)
        #expect(try entry("coordination-storm")["refreshes"] as? Int == 1)
        #expect(try entry("coordination-hot-path")["value"] as? Int == 0)
    }
}
