import Foundation
import TestGate
import TestSupport
import Testing

/// The nemesis (issue 30), CI-sized: `scripts/fleet-nemesis.py` runs three `policy fetch` processes
/// again and again against a real `redis-server` and the rotating, revoke-on-reuse token server,
/// under a seeded random schedule of at least 20 faults (kill -9, SIGSTOP/SIGCONT shorter and longer
/// than the lease, the lease holder killed or stopped during its token call, FLUSHALL, a restart
/// with no persistence, CLIENT PAUSE shorter and longer than the lease, the token endpoint's 503,
/// 429 and slow answers), and checks the token server's log: no refresh token presented twice but
/// the documented one (named), no logout the server did not ask for, no pair lost. Long runs (200
/// faults and more) are the same script: `scripts/fleet-nemesis.py --binary .build/debug/policy
/// --faults 200 --seed N`.
@Suite(
    .measuresRealTime(filter: "FleetNemesisTests"), .serialized, .loadGate(.realTime),
    .enabled(if: FleetRig.redisInstalled, "needs redis-server: apt-get install redis-server"))
struct FleetNemesisTests {
    @Test(arguments: [(1, false), (2, true)] as [(Int, Bool)])
    func aShortScheduleOfFaultsBreaksNoInvariant(seed: Int, signed: Bool) async throws {
        let folder = try TemporaryDirectory()
        var arguments = [
            "python3", repositoryRoot.appendingPathComponent("scripts/fleet-nemesis.py").path, "--binary",
            try policyBinary.get().path, "--faults", "22", "--seed", String(seed), "--json", "--out",
            folder.url.appendingPathComponent("run").path,
        ]
        if signed { arguments.append("--signed") }
        let result = try await runExecutable(
            URL(fileURLWithPath: "/usr/bin/env"), arguments, timeout: 600)
        let report = try #require(
            try JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [String: Any],
            "\(result.stdout)\(result.stderr)")
        #expect(result.status == 0, "\(report["violations"] ?? result.stderr)")
        #expect((report["violations"] as? [String])?.isEmpty == true, "\(report["violations"] ?? "")")
        #expect((report["faults"] as? Int ?? 0) >= 20)
        // The fleet got somewhere through it: expiries refreshed, every process ran.
        #expect((report["pairs"] as? Int ?? 0) >= 3, "\(report)")
        #expect((report["runs"] as? Int ?? 0) >= 3, "\(report)")
    }
}
