import Foundation
import TestSupport
import Testing

@testable import PolicyCLI

/// Fleet scripts (`processes:`) through the built `policy` binary: the shipped scenarios of issue
/// 19 pass `policy test`, `simulate` prints per-process lines and the fleet summary, unmet fleet
/// expectations fail with their position, and bad fleet input gets positioned errors.
/// Serialized: each test runs the binary (see ``TestCommandTests``).
@Suite(.serialized)
struct FleetScriptCLITests {
    static let fleetFolder = repositoryRoot.appendingPathComponent("examples/fleet").path

    static let policy = """
        policy: 1
        name: fleet
        rules:
          - { name: expired, when: { status: [401] }, then: refresh }
          - { name: revoked, when: { status: [403] }, then: logout }
        refresh: { use: oauth2, with: { token-url: "https://auth.example.com/token", client-id: app }, timeout: 2s }
        logout: { cooldown: 30s }

        """

    static let coordination = "coordination: { use: redis, with: { url: \"redis://127.0.0.1:1/0\", key: k } }\n"

    /// Two processes, one expiry: one token call between them.
    static let twoProcesses = """
        policy: policy.yaml
        tokens: { initial: valid, expire: [1s] }
        refresh: [{ after: 100ms, result: ok, expires-in: 1h }]
        processes:
          - id: a
            requests: [{ id: r, at: 1s, repeat: 3, responses: [{ status: 200 }], expect: delivered }]
          - id: b
            requests: [{ id: r, at: 1s, repeat: 3, responses: [{ status: 200 }], expect: delivered }]
            expect:
              summary: { refreshes: 0 }

        """

    @Test func everyShippedFleetScenarioPasses() async throws {
        let files = try FileManager.default.contentsOfDirectory(atPath: Self.fleetFolder)
            .filter { $0.hasSuffix(".yaml") && $0.first?.isNumber == true }
        #expect(files.count >= 9, "\(files)")
        let result = try await runPolicy(["test", Self.fleetFolder], timeout: 120)
        #expect(result.status == 0, "\(result.stdout)\(result.stderr)")
        #expect(
            result.stdout.hasSuffix("\(files.count) scripts: \(files.count) passed, 0 failed\n"), "\(result.stdout)")
        for file in files { #expect(result.stdout.contains("PASS \(Self.fleetFolder)/\(file)"), "\(file)") }
    }

    @Test func simulatePrintsEachProcessAndTheFleetSummaryAsJSON() async throws {
        let dir = try TemporaryDirectory()
        try dir.write("policy.yaml", Self.policy + Self.coordination)
        try dir.write("fleet.yaml", Self.twoProcesses)
        let result = try await runPolicy(["simulate", "--script", "fleet.yaml", "--format", "json"], in: dir.url)
        #expect(result.status == 0, "\(result.stderr)")
        let lines = result.stdoutLines
        #expect(lines.first == #"{"t":0,"process":"a","event":"start","credentials":"pair 0"}"#)
        #expect(
            lines.contains(
                #"{"t":1.05,"process":"a","event":"token-call","call":1,"result":"ok","presented":0,"pair":1}"#))
        #expect(lines.filter { $0.contains(#""event":"token-call""#) }.count == 1)
        #expect(
            lines.contains(
                #"{"t":1.2,"process":"b","request":"r-2","event":"outcome","status":200,"result":"delivered"}"#))
        #expect(
            Array(lines.suffix(3)) == [
                #"{"event":"process-summary","process":"a","requests":3,"delivered":3,"failed":0,"logged-out":0,"refreshes":1,"logouts":0,"attempts":6}"#,
                #"{"event":"process-summary","process":"b","requests":3,"delivered":3,"failed":0,"logged-out":0,"refreshes":0,"logouts":0,"attempts":6}"#,
                #"{"event":"summary","processes":2,"requests":6,"delivered":6,"failed":0,"logged-out":0,"refreshes":1,"logouts":0,"attempts":12,"token-calls":1,"reuses":0,"leases":1,"restarts":0,"kills":0}"#,
            ])
        #expect(!result.stdout.contains("sim-refresh"), "no token in the output")
    }

    @Test func simulateTextNamesTheProcessOnEveryLine() async throws {
        let dir = try TemporaryDirectory()
        try dir.write("policy.yaml", Self.policy + Self.coordination)
        try dir.write("fleet.yaml", Self.twoProcesses)
        let result = try await runPolicy(["simulate", "--script", "fleet.yaml"], in: dir.url)
        #expect(result.status == 0, "\(result.stderr)")
        #expect(
            result.stdout.contains("    1.050s  a     -         token call 1: ok, pair 1 issued\n"), "\(result.stdout)")
        #expect(result.stdout.contains("    1.200s  b     r-1       => delivered 200\n"), "\(result.stdout)")
        #expect(
            result.stdout.hasSuffix(
                "summary a: 3 requests: 3 delivered, 0 failed, 0 logged out; 1 refresh, 0 logouts, 6 attempts\n"
                    + "summary b: 3 requests: 3 delivered, 0 failed, 0 logged out; 0 refreshes, 0 logouts, 6 attempts\n"
                    + "fleet: 2 processes, 6 requests: 6 delivered, 0 failed, 0 logged out; 1 token call, 0 reuses, "
                    + "0 logouts, 1 lease, 0 restarts, 0 kills\n"), "\(result.stdout)")
    }

    /// A reuse shows in the fleet summary: a process whose credentials file holds the spent pair 0
    /// refreshes alone (its store is down, and the policy says `on-unavailable: local`).
    @Test func aReuseIsCountedAndAnUnmetFleetExpectationFailsWithItsPosition() async throws {
        let dir = try TemporaryDirectory()
        try dir.write(
            "policy.yaml",
            Self.policy
                + "coordination: { use: redis, with: { url: \"redis://127.0.0.1:1/0\", on-unavailable: local } }\n")
        try dir.write(
            "reuse.yaml",
            """
            policy: policy.yaml
            tokens: { initial: valid, expire: [1s, 3s] }
            refresh: [{ after: 100ms, result: ok, expires-in: 1h }]
            processes:
              - id: a
                requests: [{ id: r, at: 1s, responses: [{ status: 200 }] }]
              - id: b
                start: 2s
                credentials: initial
                requests: [{ id: r, at: 3500ms, responses: [{ status: 200 }] }]
                expect:
                  summary: { logouts: 0 }
            events:
              - { at: 1500ms, store: down }
            expect:
              summary: { reuses: 0 }

            """)
        let result = try await runPolicy(["test", "reuse.yaml"], in: dir.url)
        expectResult(
            result,
            stdout: "FAIL reuse.yaml with policy.yaml\n"
                + "reuse.yaml:12:18: process 'b': expected logouts 0, got 1\n"
                + "reuse.yaml:16:14: summary: expected reuses 0, got 1\n"
                + "1 script: 0 passed, 1 failed\n",
            status: 1)
    }

    @Test func badFleetInputGetsPositionedErrors() async throws {
        let dir = try TemporaryDirectory()
        try dir.write("policy.yaml", Self.policy + Self.coordination)
        try dir.write(
            "bad.yaml",
            """
            policy: policy.yaml
            requests: [{ id: x, responses: [{ status: 200 }] }]
            processes:
              - id: a
                start: 2s
                credentials: newest
                requests: [{ id: r, at: 1s, responses: [{ status: 200 }] }]
              - id: a/b
                requests: []
            events:
              - { at: 1s, kill: c }
              - { at: 2s, store: pause }
              - { at: 3s, store: down, kill: a }
              - { at: 4s, kill: a, credentials: initial }

            """)
        let result = try await runPolicy(["simulate", "--script", "bad.yaml"], in: dir.url)
        #expect(result.status == 1)
        #expect(result.stdout.isEmpty)
        let errors = result.stderr.split(separator: "\n").filter { $0.hasPrefix("bad.yaml:") }.map(String.init)
        #expect(
            errors == [
                "bad.yaml:2:1: error: a fleet script lists each process's requests under its 'processes:' entry, not in a top-level 'requests:' [invalid-value]",
                "bad.yaml:6:18: error: 'credentials' cannot be 'newest'; use 'initial', 'latest', 'none' or the number of the refresh call whose pair the credentials file holds [invalid-value]",
                "bad.yaml:7:16: error: request 'r' is sent at 1s, before process 'a' starts at 2s [invalid-value]",
                "bad.yaml:8:9: error: a process id cannot contain '/': events name a request as 'process/request' [invalid-value]",
                "bad.yaml:11:21: error: 'kill' cannot be 'c'; use one of 'a', 'a/b', 'lease-holder' [invalid-value]",
                "bad.yaml:12:5: error: 'store: pause' needs 'for:', how long calls wait [missing-key]",
                "bad.yaml:13:5: error: a fleet event does one thing: 'store:', 'kill:', 'restart:' or 'freeze:' [invalid-value]",
                "bad.yaml:14:37: error: 'credentials' goes with 'restart:' only [invalid-value]",
            ], "\(result.stderr)")
    }

    /// `lint` checks a fleet script as a script, not as a policy.
    @Test func lintChecksAFleetScriptAsAScript() async throws {
        let dir = try TemporaryDirectory()
        try dir.write("policy.yaml", Self.policy + Self.coordination)
        try dir.write("fleet.yaml", Self.twoProcesses)
        let result = try await runPolicy(["lint", "fleet.yaml"], in: dir.url)
        expectResult(result, stdout: "1 file checked: 0 errors, 0 warnings\n", status: 0)
    }
}
