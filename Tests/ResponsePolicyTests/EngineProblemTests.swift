import Foundation
import Testing

@testable import ResponsePolicy

/// What the engine reports instead of failing silently, and what hosts can wait for.
struct EngineProblemTests {
    struct BrokenStore: CredentialStore {
        struct Unreadable: Error {}
        func load() throws -> Credentials? { throw Unreadable() }
        func save(_ credentials: Credentials) throws { throw Unreadable() }
    }

    @Test func anUnreadableCredentialStoreIsReportedAtStart() throws {
        let events = EventLog()
        var options = PolicyEngine.Options()
        options.observers = [events]
        _ = PolicyEngine(
            policy: try Policy.load(yaml: "policy: 1\nname: t\n"),
            transport: RecordingTransport { _, _ in response("") },
            credentials: BrokenStore(), options: options)
        let problems = events.events.filter { $0.kind == .problem }.compactMap(\.reason)
        #expect(problems == ["the credential store could not be read (Unreadable); requests go out unsigned"])
    }

    @Test func aPluginThatCannotBeMadeIsReportedAtStartNotAtTheFirstRefresh() throws {
        let events = EventLog()
        var options = PolicyEngine.Options()
        options.observers = [events]
        options.environment = [:]
        let policy = try Policy.load(
            yaml: """
                policy: 1
                name: t
                rules: [{ when: { status: [401] }, then: refresh }]
                refresh:
                  use: oauth2
                  with: { token-url: "https://auth.example.com/token", client-id: app, client-secret-env: NOT_SET_ANYWHERE }
                """)
        _ = PolicyEngine(policy: policy, transport: RecordingTransport { _, _ in response("") }, options: options)
        let problems = events.events.filter { $0.kind == .problem }.compactMap(\.reason)
        #expect(problems.count == 1)
        #expect(problems.first?.contains("NOT_SET_ANYWHERE") == true)
    }

    @Test func aFailedSaveAfterARefreshIsReported() async throws {
        let transport = RecordingTransport { request, _ in
            request.headers["Authorization"] == "Bearer token-1" ? response("ok") : response("", status: 401)
        }
        let clock = VirtualClock()
        let scheduler = SimulationScheduler(clock: clock, externalWorkGracePeriod: .zero)
        let events = EventLog()
        var options = PolicyEngine.Options()
        options.clock = clock
        options.taskExecutor = scheduler.executor
        options.observers = [events]
        options.refreshPlugin = CountingRefresh()
        let engine = PolicyEngine(
            policy: try Policy.load(
                yaml: """
                    policy: 1
                    name: t
                    rules: [{ when: { status: [401] }, then: refresh }]
                    refresh: { use: oauth2, with: { token-url: "https://a.example.com/t", client-id: app } }
                    """),
            transport: transport, credentials: BrokenStore(), options: options)
        let status = try await scheduler.runDetached { try await engine.send(HTTPRequest(url: testURL)).status }
        #expect(status == 200)
        let problems = events.events.filter { $0.kind == .problem }.compactMap(\.reason)
        #expect(problems.contains("the credential store could not be written (Unreadable)"))
    }

    @Test func hostsCanWaitForLogoutCalls() async throws {
        final class SlowLogout: LogoutPlugin {
            let calls = Counter()
            func logout(_ context: LogoutContext) async {
                for _ in 0..<100 { await Task.yield() }
                calls.increment()
            }
        }
        let plugin = SlowLogout()
        var options = PolicyEngine.Options()
        options.logoutPlugin = plugin
        let engine = PolicyEngine(
            policy: try Policy.load(yaml: basePolicy),
            transport: RecordingTransport { _, _ in response("{\"status\":202}") },
            options: options)
        _ = try? await engine.send(HTTPRequest(url: testURL))
        await engine.waitForBackgroundWork()
        #expect(plugin.calls.value == 1)
        #expect(engine.debugSnapshot.backgroundWork == 0)
    }

    @Test func everyRefusalInOneCooldownReportsTheSameEnd() async throws {
        let engine = PolicyEngine(
            policy: try Policy.load(yaml: basePolicy),
            transport: RecordingTransport { _, _ in response("{\"status\":202}") })
        var ends: [Date] = []
        for _ in 0..<3 {
            do throws(PolicyEngineError) {
                _ = try await engine.send(HTTPRequest(url: testURL))
            } catch {
                if case .loggedOut(let until, _) = error { ends.append(until) }
            }
        }
        #expect(ends.count == 3)
        #expect(Set(ends).count == 1)
    }

    @Test(arguments: [("007", "007"), ("1e20", "1e20"), ("1.10", "1.10"), ("42", "42")])
    func pluginNumberOptionsKeepTheirText(_ written: String, _ expected: String) throws {
        let policy = try Policy.load(
            yaml: "policy: 1\nname: t\nauthorize: { use: header, with: { name: X-Token, prefix: \(written) } }\n")
        #expect(policy.authorize.options["prefix"]?.string == expected)
    }
}
