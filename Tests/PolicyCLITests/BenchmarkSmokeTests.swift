import Foundation
import TestGate
import Testing

/// Keeps `policy-bench` working: it runs with tiny counts (`--quick`), which measure nothing,
/// and its JSON must have every required result with sane fields. Timing is never asserted.
@Suite(.loadGate(.saturating))
struct BenchmarkSmokeTests {
    @Test func quickRunReportsEveryResult() async throws {
        let bench = try policyBinary.get().deletingLastPathComponent().appendingPathComponent("policy-bench")
        try #require(FileManager.default.isExecutableFile(atPath: bench.path), "build policy-bench first")
        let result = try await runExecutable(bench, ["--quick", "--json"], timeout: 120)
        #expect(result.status == 0, "stderr: \(result.stderr)")
        let json = try #require(try JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [String: Any])
        let results = try #require(json["results"] as? [[String: Any]])
        let names = results.compactMap { $0["name"] as? String }
        #expect(
            names == [
                "classify-1k-first", "classify-1k-last", "decide-20k-rules", "storm-10k", "storm-10k-dispatch-6",
                "engine-overhead", "engine-overhead-metrics", "replay", "load-default", "lint-20k", "diff-1k",
                "scale-100k-routes", "scale-100k-rules", "hostile-header",
            ])
        // Every row of these has its baseline from the same run, and the machine's load is printed.
        for entry in results
        where [
            "engine-overhead-metrics", "replay", "load-default", "lint-20k", "diff-1k", "scale-100k-routes",
            "scale-100k-rules", "hostile-header",
        ].contains(entry["name"] as? String) {
            #expect(entry["baseline"] is NSNumber && entry["ratio"] is NSNumber, "\(entry)")
        }
        let load = try #require(json["load"] as? [String: Any])
        #expect(load["start"] is String && load["end"] is String)
        let lint = try #require(results.first { $0["name"] as? String == "lint-20k" })
        #expect((lint["peak_rss_mib"] as? NSNumber)?.doubleValue ?? 0 > 0)
        for entry in results {
            #expect(entry["value"] is NSNumber && entry["unit"] is String, "\(entry)")
        }
        let storm = try #require(results.first { $0["name"] as? String == "storm-10k" })
        #expect(storm["refreshes"] as? Int == 1)
        #expect(storm["delivered"] as? Int == storm["requests"] as? Int)
        let dispatched = try #require(results.first { $0["name"] as? String == "storm-10k-dispatch-6" })
        #expect(dispatched["refreshes"] as? Int == 1)
        #expect(dispatched["delivered"] as? Int == dispatched["requests"] as? Int)
        #expect((dispatched["stale_attempts"] as? Int ?? .max) <= 12)
        let classify = try #require(results.first { $0["name"] as? String == "classify-1k-last" })
        #expect(classify["baseline"] is NSNumber && classify["ratio"] is NSNumber)
    }
}
