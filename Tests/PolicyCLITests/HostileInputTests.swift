import Foundation
import Testing

@testable import ResponsePolicy

/// Inputs that used to buy memory or minutes, and a runtime wait the policy allows without
/// limit, through the built `policy` binary.
struct HostileInputTests {
    @Test func aHugePluginSchemaFileIsRefusedWithoutBeingRead() async throws {
        let folder = try TemporaryDirectory()
        let policy = try folder.write("policy.yaml", "policy: 1\nname: x\nrules: []\n")
        // 1 GiB, sparse: it costs no disk, and reading it whole would cost 1 GiB of memory.
        let huge = folder.url.appendingPathComponent("plugins.yaml")
        #expect(FileManager.default.createFile(atPath: huge.path, contents: nil))
        let handle = try FileHandle(forWritingTo: huge)
        try handle.truncate(atOffset: 1 << 30)
        try handle.close()
        let run = try await runPolicy(["lint", "--plugins", huge.path, policy.path])
        #expect(run.status == 66)
        #expect(
            run.stderr
                == "error: '\(huge.path)' is larger than 1 MiB; a plugin schema file declares plugins and their "
                + "options, and is far smaller\n")
        #expect(run.stdout.isEmpty)
    }

    static func script(reloads: [String]) -> String {
        var text = """
            requests:
              - { id: a, at: 0s, responses: [{ status: 200 }] }
            reload:

            """
        for (index, file) in reloads.enumerated() { text += "  - { at: \(index + 1)ms, policy: \(file) }\n" }
        return text
    }

    @Test func reloadStepsAreBoundedInCountAndInFiles() async throws {
        let folder = try TemporaryDirectory()
        for index in 0..<9 { try folder.write("p\(index).yaml", "policy: 1\nname: p\(index)\nrules: []\n") }
        let tooMany = try folder.write("many.yaml", Self.script(reloads: Array(repeating: "p0.yaml", count: 101)))
        let manyFiles = try folder.write("files.yaml", Self.script(reloads: (0..<9).map { "p\($0).yaml" }))
        let fine = try folder.write("fine.yaml", Self.script(reloads: Array(repeating: "p1.yaml", count: 100)))
        let many = try await runPolicy(["lint", tooMany.path])
        #expect(many.status == 1)
        #expect(
            many.stdout.contains(
                "\(tooMany.path):104:5: error: the script reloads more than 100 times; reload less often [too-many-reloads]"
            ), "\(many.stdout)")
        let files = try await runPolicy(["lint", manyFiles.path])
        #expect(files.status == 1)
        #expect(
            files.stdout.contains(
                "\(manyFiles.path):12:5: error: the script reloads more than 8 different policy files [too-many-reloads]"
            ), "\(files.stdout)")
        let ok = try await runPolicy(["lint", fine.path])
        #expect(ok.status == 0, "\(ok.stdout)")
    }

    @Test func aReloadedPolicyOverTheLimitIsRefusedAndTheRunningOneStays() async throws {
        let folder = try TemporaryDirectory()
        let policy = try folder.write("policy.yaml", "policy: 1\nname: small\nrules: []\n")
        let padding = String(
            repeating: "# padding padding padding padding padding padding padding padding\n", count: 17_000)
        try folder.write("big.yaml", "policy: 1\nname: big\nrules: []\n" + padding)
        let script = try folder.write(
            "script.yaml",
            """
            requests:
              - { id: a, at: 10ms, responses: [{ status: 200 }] }
            reload:
              - { at: 1ms, policy: big.yaml }
              - { at: 2ms, policy: big.yaml }
            """)
        let run = try await runPolicy(["simulate", policy.path, "--script", script.path, "--format", "json"])
        #expect(run.status == 0, "\(run.stderr)")
        let reloads = run.stdoutLines.filter { $0.contains(#""event":"reload""#) }
        #expect(reloads.count == 2)
        #expect(reloads.allSatisfy { $0.contains(#""ok":false"#) }, "\(reloads)")
        #expect(run.stdoutLines.contains { $0.contains(#""event":"outcome""#) && $0.contains("delivered") })
    }

    @Test func explainSaysARetryAfterWithoutMaxDelayIsHonouredWithoutLimit() async throws {
        let folder = try TemporaryDirectory()
        let policy = try folder.write(
            "policy.yaml",
            """
            policy: 1
            name: unbounded
            rules:
              - { name: busy, when: { status: [503] }, then: retry }
            retry: { backoff: constant, initial: 1s, max-delay: none, retry-after: honor, deadline: none }
            """)
        let run = try await runPolicy(["explain", policy.path])
        #expect(run.status == 0, "\(run.stderr)")
        #expect(
            try explanation(ofFile: policy.path).contains(
                "Retry-After honoured without limit: max-delay is none, so a server can make a request wait as long "
                    + "as it asks, an HTTP-date years away included"), "\(run.stdout)")
        // And the engine does what explain says: a Retry-After 31 years away is the wait.
        var response = HTTPResponse(status: 503)
        response.headers.set("Retry-After", "Fri, 01 Jan 2055 00:00:00 GMT")
        let now = Date(timeIntervalSince1970: 1_764_547_200)  // 2025-12-01
        var settings = RetrySettings()
        settings.maxDelay = nil
        settings.honorRetryAfter = true
        let wait = RetryTiming.delay(
            forRetry: 1, settings: settings, response: response, now: now, random: SeededRandomSource(seed: 1))
        #expect(wait > .seconds(29 * 365 * 86_400))
    }
}
