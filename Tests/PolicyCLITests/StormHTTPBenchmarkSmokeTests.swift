import Foundation
import TestGate
import Testing

/// Keeps `policy-bench --only storm-http` working with tiny storms (`--quick`: 50 requests, one
/// repetition, through URLSessionTransport against `scripts/storm-server.py`). Its counts are
/// asserted, never its timings: the heavy storms (1,000 and 5,000) are for a quiet machine.
@Suite(.measuresRealTime(filter: "StormHTTPBenchmarkSmokeTests"), .loadGate(.realTime))
struct StormHTTPBenchmarkSmokeTests {
    @Test func quickStormHTTPRunCountsRequestsRefreshesAndLostAnswers() async throws {
        let bench = try policyBinary.get().deletingLastPathComponent().appendingPathComponent("policy-bench")
        try #require(FileManager.default.isExecutableFile(atPath: bench.path), "build policy-bench first")
        let result = try await runExecutable(bench, ["--quick", "--json", "--only", "storm-http"], timeout: 120)
        #expect(result.status == 0, "stderr: \(result.stderr)")
        let json = try #require(try JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [String: Any])
        let results = try #require(json["results"] as? [[String: Any]])
        #expect(
            results.compactMap { $0["name"] as? String } == [
                "storm-http-401-50", "storm-http-1401-50", "storm-http-202-50",
            ])
        for name in ["storm-http-401-50", "storm-http-1401-50"] {
            let entry = try #require(results.first { $0["name"] as? String == name })
            #expect(entry["refreshes_max"] as? Int == 1, "\(entry)")
            #expect(entry["failed_max"] as? Int == 0, "\(entry)")
            #expect((entry["requests_max"] as? Int ?? .max) <= 50 + 12, "\(entry)")
            // Every request the server counted is one the engine sent (no straggler of an earlier
            // storm charged to this one), and at most the 6 in flight met the expired token.
            #expect(entry["engine_sends_in_that_rep"] as? Int == entry["requests_max"] as? Int, "\(entry)")
            #expect((1...6).contains(entry["stale_answers_max"] as? Int ?? 0), "\(entry)")
            #expect(entry["value"] is NSNumber, "the server saw a token call after a rejection: \(entry)")
        }
        let logout = try #require(results.first { $0["name"] as? String == "storm-http-202-50" })
        #expect(logout["value"] as? Int == 0, "every OK answer before the 202 reached its caller: \(logout)")
        // Five are answered OK before the 202; those whose last byte was written before it count.
        #expect((1...5).contains(logout["ok_before_202"] as? Int ?? 0), "\(logout)")
        #expect(logout["arrivals_after_engine_saw_202_max"] as? Int == 0, "\(logout)")
        #expect(logout["sends_after_logout_max"] as? Int == 0, "\(logout)")
    }
}
