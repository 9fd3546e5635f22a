import Foundation
import Testing

@testable import PolicyCLI
@testable import ResponsePolicy

/// `policy simulate` writes events as they happen: through the binary, the lines are exactly
/// the events the library collects, in order, then the summary.
struct SimulateStreamingTests {
    @Test func theBinaryStreamsTheSameEventsTheLibraryCollects() async throws {
        let folder = try TemporaryDirectory()
        let policyText = """
            policy: 1
            name: streaming
            classify: { code: body.status }
            rules:
              - { name: token-expired, when: { code: [1401] }, then: refresh }
              - { name: busy, when: { status: [503] }, then: retry }
            refresh:
              use: oauth2
              with: { token-url: "https://auth.example.com/token", client-id: app }
            retry: { backoff: constant, initial: 100ms }
            """
        let scriptText = """
            requests:
              - { id: r, repeat: 300, responses: [{ body: '{"status":1401}' }, { status: 503 }, { body: '{"status":0}' }] }
            refresh: [{ after: 100ms }]
            """
        let policyFile = try folder.write("policy.yaml", policyText)
        let scriptFile = try folder.write("script.yaml", scriptText)
        let run = try await runPolicy(["simulate", policyFile.path, "--script", scriptFile.path, "--format", "json"])
        #expect(run.status == 0, "\(run.stderr)")

        let policy = try Policy.load(yaml: policyText, file: "policy.yaml")
        let script = try #require(SimulationScript.parse(Array(scriptText.utf8), file: "script.yaml").0)
        let collected = try await Simulator.run(policy: policy, script: script)
        #expect(run.stdoutLines == collected.events.map(\.jsonLine) + [collected.summary.jsonLine])
        #expect(run.stdout.utf8.count > 1 << 16, "more than one 64 KiB buffer's worth")
    }
}
