import Foundation
import ResponsePolicy
import ResponsePolicyRedis
import Testing

/// `Retry-After` fleet-wide (issue 29), through real `policy fetch` processes, a real
/// `redis-server` and the rotating token server: the token endpoint answers one process's call
/// 429 with `Retry-After`, and no process of the fleet calls it before that wait ends. The wait
/// here is far longer than the test, so nothing depends on how fast the machine is: the second
/// process starts after the first has exited, learns the wait from Redis alone, and fails its
/// requests with the reason (never a logout) without a token call.
@Suite(.serialized, .enabled(if: FleetRig.redisInstalled, "needs redis-server: apt-get install redis-server"))
struct FleetRetryAfterCLITests {
    @Test(arguments: [false, true])
    func aRetryAfterInOneProcessHoldsTheNextProcessToo(signed: Bool) async throws {
        let rig = try FleetRig()
        for slot in 1...2 { try rig.policy(slot: slot, timeout: "2s", signed: signed) }
        try rig.fault("status=429&retry_after=600&count=1")
        let first = await (try rig.fetch(slot: 1, count: 3, concurrency: 1, signed: signed)).result()
        #expect(rig.tokenCalls().count == 1, "\(rig.tokenCalls())")
        #expect(first.stdout.contains("Retry-After"), "\(first.stdout)\n\(first.stderr)")
        let stored = try rig.redisCommand(["HGET", "response-policy:{fleet}:session", "retry-after"]).text ?? ""
        #expect(stored.hasPrefix(String(stored.prefix { $0.isNumber })) && !stored.isEmpty, "Redis holds the wait")
        if signed { #expect(stored.contains(":v1."), "sealed under the fleet's key: \(stored)") }

        // Another process, started after the first one exited: it hears nothing but what Redis holds.
        let second = await (try rig.fetch(slot: 2, count: 3, concurrency: 1, signed: signed)).result()
        #expect(rig.tokenCalls().count == 1, "a token call before Retry-After ended: \(rig.tokenCalls())")
        #expect(second.stdout.contains("Retry-After"), "\(second.stdout)\n\(second.stderr)")
        for result in [first, second] {
            #expect(result.stdout.contains(" 0 logged out; "), "\(result.stdout)\n\(result.stderr)")
            #expect(result.stdout.contains(", 0 logouts, "), "\(result.stdout)")
            #expect(result.status == 1, "its requests failed (transient), the session stays: \(result.stdout)")
            #expect(!result.crashed, "\(result.stderr)")
        }
        #expect((try rig.stats()["reuses"] as? Int) == 0)
    }
}
