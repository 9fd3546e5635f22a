import Foundation
import ResponsePolicyTesting
import TestSupport
import Testing

@testable import ResponsePolicy

/// Issue 19's invariants (item 2) over random fleet scripts: 2–4 processes on one store, token
/// expiries, store outages and pauses, processes restarted (with their own file, the initial pair
/// or the latest) and killed, lease holders killed mid-refresh. Whatever happens:
/// - no refresh token is presented twice, but the documented one: a holder killed after the
///   server received its call (issue 30: the simulated server handles a call when it is made, as
///   a real one does), before it could tell anyone; the reuse's token was first presented by a
///   process killed while that call's answer was on its way (the revoke-on-reuse token server
///   counts it, and refuses nothing else);
/// - coordination trouble never logs anyone out (no `logout` event, no `logged-out` outcome: the
///   scripted server asks for one only after that documented reuse);
/// - every request ends once: delivered, failed with a reason, or cancelled because its process
///   was killed or not running;
/// - the same script prints the same lines every run.
///
/// Seeded (the seed is in every failure message), deterministic, virtual time only.
struct FleetSimulationPropertyTests {
    static let policy = """
        policy: 1
        name: fleet-property
        rules:
          - { name: expired, when: { status: [401] }, then: refresh }
        refresh:
          use: oauth2
          with: { token-url: "https://auth.example.com/token", client-id: app }
          timeout: 10s
          max-per-request: 1
          on-exhausted: logout
          on-failure: logout
        logout: { cooldown: 30s }
        coordination: { use: redis, with: { url: "redis://127.0.0.1:1/0", key: k, lease: 15s } }
        """

    /// A random fleet script. Expiries sit on a 5 s grid (at 5k + 0.5 s) and outages and pauses
    /// end at 5k + 2.5 s, so a token is never issued just before an expiry (a request refused
    /// twice in a row by the server's own expiries would rightly use up `max-per-request`);
    /// kills and restarts land on odd microseconds, between the simulation's other instants, and
    /// outside store outages: a lease holder killed while it keeps a pair it could not publish
    /// (the store down) takes the only copy of the rotated refresh token with it, a reuse no
    /// protocol can prevent without the token server's help (examples/fleet/11-… shows it; the
    /// closing note of issue 19 documents it).
    static func script(seed: UInt64) -> String {
        var g = SeededGenerator(seed: seed)
        let processes = g.int(2...4)
        var out = "policy: policy.yaml\n"
        let expiries = (1...9).filter { _ in g.chance(50) }.map { "\($0 * 5).5s" }
        out += "tokens: { initial: valid, expire: [\(expiries.joined(separator: ", "))] }\n"
        out += "refresh:\n"
        for _ in 0..<g.int(1...3) { out += "  - { after: \(g.int(50...800))ms, result: ok, expires-in: 1h }\n" }
        out += "processes:\n"
        var starts: [Int] = []
        for index in 1...processes {
            let start = index == 1 || g.chance(50) ? 0 : g.int(1...20)
            starts.append(start)
            out += "  - id: p\(index)\n    start: \(start)s\n"
            if g.chance(30) { out += "    credentials: \(["initial", "latest", "none"][g.int(0...1)])\n" }
            out += "    requests:\n"
            for group in 0..<g.int(3...8) {
                let at = String(format: "%.3f", Double(start) + Double(g.int(0...45_000)) / 1000)
                out += "      - { id: g\(group), at: \(at)s, repeat: \(g.int(1...5)), responses: [{ status: 200 }] }\n"
            }
        }
        out += "events:\n"
        // Outages first: a kill lands outside them (see the note on ``script(seed:)``).
        var outages: [(from: Double, to: Double)] = []
        for _ in 0..<g.int(0...2) {
            let from = g.int(0...8) * 5 + 1
            let span = Double(g.int(0...3) * 5) + 1.5
            outages.append((Double(from), Double(from) + span))
            out += "  - { at: \(from)s, store: down, for: \(span)s }\n"
        }
        func outside(_ time: Double) -> String {
            let moved = outages.first { $0.from <= time && time <= $0.to }.map { $0.to + 0.5 } ?? time
            return String(format: "%.6f", moved)
        }
        for _ in 0..<g.int(1...6) {
            let odd = outside(Double(g.int(0...49_000)) / 1000 + 0.000317)
            let target = "p\(g.int(1...processes))"
            switch g.int(0...7) {
            case 0:
                out += "  - { at: \(g.int(0...8) * 5 + 2)s, store: pause, for: 500ms }\n"
            case 1...3:
                out += "  - { at: \(odd)s, kill: lease-holder }\n"
            case 4:
                // A plain kill of a process that has started.
                let index = g.int(1...processes)
                out +=
                    "  - { at: \(outside(Double(starts[index - 1]) + 0.000317 + Double(g.int(0...40))))s, kill: p\(index) }\n"
            default:
                let credentials = ["", ", credentials: initial", ", credentials: latest"][g.int(0...2)]
                out += "  - { at: \(odd)s, restart: \(target)\(credentials) }\n"
            }
        }
        return out
    }

    static let seeds: [UInt64] = Array(1...150)

    @Test(arguments: seeds)
    func noReuseNoLogoutAndEveryRequestEndsWithAReason(seed: UInt64) async throws {
        let text = Self.script(seed: seed)
        let (parsed, diagnostics) = SimulationScript.parse(Array(text.utf8), file: "seed-\(seed).yaml")
        let script = try #require(parsed, "seed \(seed): \(diagnostics.map(\.description))\n\(text)")
        let policy = try Policy.load(yaml: Self.policy)
        let result = try await FleetSimulator.run(policy: policy, script: script)
        let summary = result.summary
        let context = "seed \(seed)\n\(text)"

        // The documented reuse: the presented token's first call was made by a process killed before
        // its answer (the step's `after`, at most 800ms) reached it.
        let notes = result.lines.compactMap { line -> FleetSimulator.Note? in
            if case .note(let note) = line { return note } else { return nil }
        }
        func field(_ note: FleetSimulator.Note, _ key: String) -> String? { note.fields.first { $0.key == key }?.json }
        var revokedAt: Duration?
        for note in notes where note.event == "token-call" && field(note, "result") == "\"reuse\"" {
            let first = notes.first {
                $0.event == "token-call" && field($0, "presented") == field(note, "presented")
                    && field($0, "result") == "\"ok\""
            }
            let killed = first.flatMap { call in
                notes.first {
                    ($0.event == "kill" || $0.event == "restart") && $0.process == call.process && $0.time >= call.time
                        && $0.time <= call.time + .milliseconds(800)
                }
            }
            #expect(killed != nil, "\(note.text) at \(note.time), not after a holder was killed; \(context)")
            revokedAt = min(revokedAt ?? note.time, note.time)
        }
        #expect(summary.reuses <= 1, "more than the documented reuse; \(context)")
        var outcomes: [String: Int] = [:]
        for line in result.lines {
            switch line {
            case .note(let note):
                if note.event == "token-call", revokedAt == nil || note.time < revokedAt ?? .zero {
                    let refused = note.fields.contains { $0.key == "result" && $0.json == "\"refused\"" }
                    #expect(!refused, "\(note.text) at \(note.time); \(context)")
                }
            case .engine(let process, let event):
                // A logout only after the documented reuse revoked the family (the server asked).
                #expect(
                    event.kind != .logout || (revokedAt.map { event.time >= $0 } ?? false),
                    "\(process) logged out at \(event.time): \(event.reason ?? ""); \(context)")
                guard event.kind == .outcome else { continue }
                outcomes["\(process)/\(event.request ?? "?")", default: 0] += 1
                switch event.result {
                case .delivered?: break
                case .failed?:
                    #expect(
                        event.reason?.isEmpty == false,
                        "\(process)/\(event.request ?? "") failed without a reason; \(context)")
                case .loggedOut? where revokedAt.map({ event.time >= $0 }) ?? false: break
                case .cancelled?:
                    let why = event.reason ?? ""
                    #expect(
                        why.contains("killed") || why.contains("not running"),
                        "\(process)/\(event.request ?? "") cancelled: \(why); \(context)")
                default:
                    Issue.record(
                        "\(process)/\(event.request ?? "") ended \(event.result?.rawValue ?? "without a result"); \(context)"
                    )
                }
            }
        }
        let expected = script.fleet?.processes.reduce(0) { $0 + $1.requests.count } ?? 0
        #expect(outcomes.count == expected, "requests without an outcome; \(context)")
        #expect(outcomes.values.allSatisfy { $0 == 1 }, "a request ended twice; \(context)")
        #expect(summary.total.requests == expected)
        #expect(
            summary.total.delivered + summary.total.failed + summary.total.cancelled + summary.total.loggedOut
                == expected)
        if revokedAt == nil { #expect(summary.total.logouts == 0 && summary.total.loggedOut == 0) }

        // Determinism: the same script prints the same lines again.
        if seed <= 5 {
            let again = try await FleetSimulator.run(policy: policy, script: script)
            #expect(again.summary == summary, "seed \(seed)")
            #expect(Self.render(again.lines) == Self.render(result.lines), "seed \(seed)")
        }
    }

    /// The generator reaches what the invariants are about: over the seeds, token calls, outages,
    /// kills of a lease holder while it held the lease, restarts, and failed requests.
    @Test func theRandomScriptsReachTheFaults() async throws {
        var tokenCalls = 0
        var kills = 0
        var restarts = 0
        var failed = 0
        var outages = 0
        let policy = try Policy.load(yaml: Self.policy)
        for seed in Self.seeds.prefix(30) {
            let (parsed, _) = SimulationScript.parse(Array(Self.script(seed: seed).utf8), file: "s.yaml")
            let script = try #require(parsed)
            let result = try await FleetSimulator.run(policy: policy, script: script)
            tokenCalls += result.summary.tokenCalls
            kills += result.summary.kills
            restarts += result.summary.restarts
            failed += result.summary.total.failed
            outages += script.fleet?.events.filter { if case .storeDown = $0.kind { true } else { false } }.count ?? 0
        }
        #expect(tokenCalls > 30)
        #expect(kills > 5)
        #expect(restarts > 5)
        #expect(outages > 5)
        #expect(failed > 0)
    }

    static func render(_ lines: [FleetSimulator.Line]) -> [String] {
        lines.map { line in
            switch line {
            case .note(let note): return note.jsonLine
            case .engine(let process, let event): return process + " " + event.jsonLine
            }
        }
    }
}

/// `PolicySimulation` (the testing product's public API) runs fleet scripts too: the fleet's
/// counters, each process's, and the unmet expectations with their positions.
struct FleetPolicySimulationTests {
    @Test func aServiceTestRunsAFleetScript() async throws {
        let policy = try Policy.load(yaml: FleetSimulationPropertyTests.policy)
        let result = try await PolicySimulation.run(
            policy: policy,
            script: """
                tokens: { initial: valid, expire: [1s] }
                refresh: [{ after: 100ms, result: ok, expires-in: 1h }]
                processes:
                  - id: a
                    requests: [{ id: r, at: 1s, repeat: 2, responses: [{ status: 200 }], expect: delivered }]
                  - id: b
                    requests: [{ id: r, at: 1s, repeat: 2, responses: [{ status: 200 }], expect: delivered }]
                    expect: { summary: { refreshes: 1 } }
                events:
                  - { at: 1500ms, restart: b }
                expect:
                  summary: { token-calls: 1, reuses: 0, restarts: 2 }
                """, file: "fleet.yaml")
        let fleet = try #require(result.fleet)
        #expect(fleet.tokenCalls == 1)
        #expect(fleet.reuses == 0)
        #expect(fleet.leases == 1)
        #expect(fleet.restarts == 1)
        #expect(fleet.processes["a"]?.refreshes == 1)
        #expect(fleet.processes["b"]?.refreshes == 0)
        #expect(result.summary.delivered == 4)
        #expect(result.events.contains { $0.request == "b/r-2" && $0.kind == .outcome && $0.result == .delivered })
        #expect(
            result.unmet == [
                "fleet.yaml:8:26: process 'b': expected refreshes 1, got 0",
                "fleet.yaml:12:41: summary: expected restarts 2, got 1",
            ])
    }

    /// Every shipped fleet scenario (examples/fleet/) meets its expectations through the library
    /// too, with the reuse and logout counts the scenario is about. Among them the repros of the
    /// two logouts the random test found: a process started during an outage (10) and a pair
    /// published late (11), both re-sent with credentials adopted from the fleet.
    @Test(arguments: [
        "01-cold-expiry", "02-adopted-token", "03-outage-during-expiry", "04-long-outage", "05-store-pause",
        "06-lease-holder-killed", "07-start-during-cooldown", "08-logout-during-outage",
        "09-restart-older-credentials", "10-start-during-outage", "11-late-publication",
        "12-known-limit-holder-killed-during-outage", "13-pause-longer-than-the-lease", "14-uncoordinated",
        "15-flush-between-expiries", "16-flush-during-a-token-call", "17-restart-empty-during-an-expiry",
        "18-evicted-lease", "19-slow-store", "20-frozen-holder", "21-frozen-holder-taken-over",
        "22-retry-after-holds-every-process", "23-frozen-holder-token-expired",
    ])
    func theShippedScenarioHolds(_ name: String) async throws {
        let folder = repositoryRoot.appendingPathComponent("examples/fleet")
        let policyName = name.hasPrefix("14-") ? "uncoordinated.yaml" : "policy.yaml"
        let policy = try Policy.load(contentsOf: folder.appendingPathComponent(policyName))
        let text = try String(contentsOf: folder.appendingPathComponent(name + ".yaml"), encoding: .utf8)
        let result = try await PolicySimulation.run(policy: policy, script: text, file: name + ".yaml")
        #expect(result.unmet == [])
        let fleet = try #require(result.fleet)
        // 06, 12 and 21: a holder killed or frozen after the server received its call (the
        // documented reuse); 14: no coordination.
        #expect(fleet.reuses == (["06-", "12-", "14-", "21-"].contains(where: name.hasPrefix) ? 1 : 0))
        if !["06-", "07-", "08-", "12-", "14-", "21-"].contains(where: name.hasPrefix) {
            #expect(result.summary.logouts == 0)
        }
    }
}
