import Foundation
import Testing

@testable import ResponsePolicy

/// Events as a host's logs see them: level, method and path, wall-clock time, and the `log`
/// observer's formats.
struct PolicyLogTests {
    static let policy = """
        policy: 1
        name: t
        rules: [{ name: unauthorized, when: { status: [401] }, then: refresh }]
        refresh: { use: oauth2, with: { token-url: "https://a.example.com/t", client-id: app } }
        """

    @Test func eventsCarryTheRequestsMethodAndPathWithoutItsQueryAndTheWallClockTime() async throws {
        let transport = RecordingTransport { request, _ in
            request.headers["Authorization"] == "Bearer token-1" ? response("ok") : response("", status: 401)
        }
        let rig = try SimulatedEngine(Self.policy, transport: transport, refresh: CountingRefresh())
        let url = try #require(URL(string: "https://api.example.com/orders/7?access_token=SECRET#frag"))
        _ = try await rig.run { engine in try await engine.send(HTTPRequest(method: "DELETE", url: url)) }
        let events = rig.events.events
        #expect(events.map(\.kind) == [.send, .response, .refreshStart, .refreshEnd, .send, .response, .outcome])
        for event in events {
            #expect(event.method == "DELETE")
            #expect(event.path == "/orders/7")
            #expect(event.date == VirtualClock.epoch.addingTimeInterval(event.time.seconds))
            #expect(!event.logLine(.json).contains("SECRET"))
            #expect(!event.logLine(.logfmt).contains("SECRET"))
        }
    }

    @Test func eventsOutsideARequestHaveNoMethodOrPath() throws {
        let events = EventLog()
        var options = PolicyEngine.Options()
        options.observers = [events]
        options.environment = [:]
        let policy = try Policy.load(
            yaml: Self.policy.replacingOccurrences(
                of: "client-id: app", with: "client-id: app, client-secret-env: NOPE"))
        let engine = PolicyEngine(
            policy: policy, transport: RecordingTransport { _, _ in response("") }, options: options)
        #expect(engine.problems.count == 1)
        let problem = try #require(events.events.first)
        #expect(problem.kind == .problem)
        #expect(problem.level == .error)
        #expect(problem.method == nil && problem.path == nil && problem.date != nil)
    }

    @Test func logLinesInBothFormats() {
        var event = PolicyEvent(.refreshEnd, time: .milliseconds(50), request: "r1")
        event.method = "GET"
        event.path = "/profile"
        event.date = Date(timeIntervalSince1970: 1_767_225_600.05)
        event.ok = false
        event.reason = "the token endpoint answered 400 (invalid_grant)"
        #expect(
            event.logLine(.json)
                == #"{"time":"2026-01-01T00:00:00.050Z","level":"warning","t":0.05,"event":"refresh-end","request":"r1","method":"GET","path":"/profile","ok":false,"reason":"the token endpoint answered 400 (invalid_grant)"}"#
        )
        #expect(
            event.logLine(.logfmt)
                == #"time=2026-01-01T00:00:00.050Z level=warning t=0.05 event=refresh-end request=r1 method=GET path=/profile ok=false reason="the token endpoint answered 400 (invalid_grant)""#
        )
        // The simulation's format is unchanged: no time, level, method or path.
        #expect(
            event.jsonLine
                == #"{"t":0.05,"request":"r1","event":"refresh-end","ok":false,"reason":"the token endpoint answered 400 (invalid_grant)"}"#
        )
    }

    struct LevelCase: Sendable, CustomTestStringConvertible {
        var event: PolicyEvent
        var level: PolicyEvent.Level
        var testDescription: String { "\(event.kind.rawValue) → \(level.rawValue)" }

        init(_ kind: PolicyEvent.Kind, ok: Bool? = nil, result: PolicyEvent.Result? = nil, _ level: PolicyEvent.Level) {
            event = PolicyEvent(kind, time: .zero)
            event.ok = ok
            event.result = result
            self.level = level
        }
    }

    static let levels: [LevelCase] = [
        LevelCase(.send, .debug), LevelCase(.response, .debug), LevelCase(.wait, .debug),
        LevelCase(.cancel, .info), LevelCase(.refreshStart, .info), LevelCase(.refreshEnd, ok: true, .info),
        LevelCase(.refreshEnd, ok: false, .warning), LevelCase(.reload, ok: true, .info),
        LevelCase(.reload, ok: false, .error), LevelCase(.logout, .warning), LevelCase(.problem, .error),
        LevelCase(.outcome, result: .delivered, .info), LevelCase(.outcome, result: .cancelled, .info),
        LevelCase(.outcome, result: .failed, .warning), LevelCase(.outcome, result: .loggedOut, .warning),
    ]

    @Test(arguments: levels)
    func eachEventHasItsLevel(_ testCase: LevelCase) {
        #expect(testCase.event.level == testCase.level)
    }

    @Test func theLogPluginTakesFormatAndLevelFromThePolicy() throws {
        let policy = try Policy.load(
            yaml: "policy: 1\nname: t\nobserve: [{ use: log, with: { format: logfmt, level: warning } }]\n")
        #expect(PluginRegistry().problems(in: policy).isEmpty)
        let lines = Locked<[String]>([])
        let observer = LogObserver(level: .warning, format: .logfmt) { line in lines.withLock { $0.append(line) } }
        for kind in [PolicyEvent.Kind.send, .refreshStart, .logout, .problem] {
            observer.observe(PolicyEvent(kind, time: .seconds(1)))
        }
        #expect(lines.withLock { $0 } == ["level=warning t=1 event=logout", "level=error t=1 event=problem"])
    }

    @Test func theLogPluginsOptionsAreCheckedByLint() {
        let found = findings("policy: 1\nname: t\nobserve: [{ use: log, with: { format: jsno, level: verbose } }]\n")
        #expect(
            found.map(\.description) == [
                "test.yaml:3:39: error: 'format' must be one of 'json', 'logfmt', not 'jsno'; did you mean 'json'? [invalid-value]",
                "test.yaml:3:52: error: 'level' must be one of 'debug', 'info', 'warning', 'error', not 'verbose' [invalid-value]",
            ])
    }
}
