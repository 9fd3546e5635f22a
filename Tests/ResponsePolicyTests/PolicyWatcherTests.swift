import Foundation
import Testing

@testable import ResponsePolicy

struct PolicyWatcherTests {
    func policyText(_ name: String) -> String {
        "policy: 1\nname: \(name)\nrules:\n  - { name: busy, when: { status: [503] }, then: fail }\n"
    }

    let broken = "policy: 1\nname: broken\nrules:\n  - { name: unauthorized, when: { status: [401] }, then: refresh }\n"

    func makeEngine(_ file: URL, events: EventLog) throws -> PolicyEngine {
        var options = PolicyEngine.Options()
        options.observers = [events]
        return PolicyEngine(
            policy: try Policy.load(contentsOf: file), transport: RecordingTransport { _, _ in response("") },
            options: options)
    }

    @Test func reloadsOnChangeRefusesABrokenFileAndRecovers() throws {
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("watcher-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: folder) }
        let file = folder.appendingPathComponent("policy.yaml")
        try policyText("first").write(to: file, atomically: true, encoding: .utf8)
        let events = EventLog()
        let engine = try makeEngine(file, events: events)
        let watcher = PolicyWatcher(engine: engine, url: file, settle: .zero)

        #expect(watcher.check() == .unchanged)
        try policyText("second-one").write(to: file, atomically: true, encoding: .utf8)
        #expect(watcher.check() == .reloaded(name: "second-one"))
        #expect(engine.policy.name == "second-one")

        try broken.write(to: file, atomically: true, encoding: .utf8)
        guard case .refused(let diagnostics) = watcher.check() else {
            Issue.record("a broken policy was not refused")
            return
        }
        #expect(diagnostics.map(\.rule).contains("missing-refresh-plugin"))
        #expect(engine.policy.name == "second-one", "the running policy stays")
        // The same broken bytes are not tried again on every poll.
        try broken.write(to: file, atomically: true, encoding: .utf8)
        #expect(watcher.check() == .unchanged)

        try policyText("third").write(to: file, atomically: true, encoding: .utf8)
        #expect(watcher.check() == .reloaded(name: "third"))
        let reloads = events.events.filter { $0.kind == .reload }.map { $0.ok ?? false }
        #expect(reloads == [true, false, true])
        let refused = events.events.first { $0.kind == .reload && $0.ok == false }
        #expect(refused?.reason?.contains("no refresh plugin is set") == true)
    }

    @Test func aForcedCheckReloadsEvenUnchanged() throws {
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("watcher-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: folder) }
        let file = folder.appendingPathComponent("policy.yaml")
        try policyText("only").write(to: file, atomically: true, encoding: .utf8)
        let engine = try makeEngine(file, events: EventLog())
        let watcher = PolicyWatcher(engine: engine, url: file, settle: .zero)
        #expect(watcher.check(force: true) == .reloaded(name: "only"))
        try FileManager.default.removeItem(at: file)
        guard case .unreadable = watcher.check(force: true) else {
            Issue.record("a missing file was not reported")
            return
        }
        #expect(engine.policy.name == "only")
    }

    @Test func sighupReloadsAlsoAfterARestart() async throws {
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("watcher-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: folder) }
        let file = folder.appendingPathComponent("policy.yaml")
        try policyText("before-signal").write(to: file, atomically: true, encoding: .utf8)
        let engine = try makeEngine(file, events: EventLog())
        // Polling every hour: only the signal can make this reload within the test.
        let watcher = PolicyWatcher(engine: engine, url: file, interval: .seconds(3600))
        // Stopped and started again: the signal must still arrive.
        watcher.start(onSIGHUP: true)
        watcher.stop()
        watcher.start(onSIGHUP: true)
        defer { watcher.stop() }
        try policyText("after-signal").write(to: file, atomically: true, encoding: .utf8)
        // The signal source becomes active asynchronously after `start`: signal until it is seen
        // (a bounded wait for an event, not a timing assertion).
        let deadline = ContinuousClock.now + .seconds(20)
        while engine.policy.name != "after-signal", ContinuousClock.now < deadline {
            kill(getpid(), SIGHUP)
            try await Task.sleep(for: .milliseconds(50))
        }
        #expect(engine.policy.name == "after-signal")
    }

    @Test func requestsInFlightFinishUnderThePolicyTheyStartedWith() async throws {
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("reload-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: folder) }
        let next = folder.appendingPathComponent("next.yaml")
        // The new policy has no logout rule: a 202 under it is delivered. (started-after goes out
        // after the 20 s cooldown that started-before's logout begins at 5 s.)
        try "policy: 1\nname: next\n".write(to: next, atomically: true, encoding: .utf8)
        let result = try await simulate(
            basePolicy,
            """
            requests:
              - id: started-before
                responses: [{ body: '{"status":202}', latency: 5s }]
              - id: started-after
                at: 30s
                responses: [{ body: '{"status":202}' }]
            reload:
              - { at: 1s, policy: \(next.path) }
            """)
        #expect(result.outcome("started-before")?.result == .loggedOut)
        #expect(result.outcome("started-after")?.result == .delivered)
        #expect(result.events.contains { $0.kind == .reload && $0.ok == true })
    }

    /// A file caught while it is being written is not loaded: 30 of the 54 line prefixes of
    /// policies/default.yaml are valid policies. Only a file that stayed the same (time, size,
    /// content) across `settle` is.
    @Test func aFileBeingWrittenIsLoadedOnlyOnceItHasSettled() throws {
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("watcher-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: folder) }
        let file = folder.appendingPathComponent("policy.yaml")
        try policyText("first").write(to: file, atomically: true, encoding: .utf8)
        let events = EventLog()
        let engine = try makeEngine(file, events: events)
        let clock = VirtualClock()
        let watcher = PolicyWatcher(engine: engine, url: file, settle: .milliseconds(500), clock: clock)

        // A writer in progress: every prefix seen is different from the last one seen.
        let full = policyText("second") + "retry: { max-retries: 2 }\n"
        let lines = full.split(separator: "\n", omittingEmptySubsequences: false)
        for count in 3..<lines.count {
            try lines.prefix(count).joined(separator: "\n").write(to: file, atomically: false, encoding: .utf8)
            #expect(watcher.check() == .settling)
            clock.advance(to: clock.now + .milliseconds(200))
        }
        try full.write(to: file, atomically: false, encoding: .utf8)
        #expect(watcher.check() == .settling)
        clock.advance(to: clock.now + .milliseconds(499))
        #expect(watcher.check() == .settling, "not yet settled")
        #expect(engine.policy.name == "first")
        clock.advance(to: clock.now + .milliseconds(1))
        #expect(watcher.check() == .reloaded(name: "second"))
        #expect(events.events.filter { $0.kind == .reload }.count == 1, "no prefix was ever loaded")
    }
}
