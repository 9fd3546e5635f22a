import Foundation
import Testing

@testable import PolicyCLI
@testable import ResponsePolicy
@testable import ResponsePolicyTesting

/// `policy replay` through the built binary: the engine's own events replayed with the policy that
/// made them come out as recorded; HAR files in the shapes browsers and proxies write; `--against`
/// shows where two policies differ; a malformed recording is an error at its line and column; no
/// token, cookie or secret of the recording reaches the output.
@Suite(.serialized)
struct ReplayCommandTests {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent()

    static let policy = """
        policy: 1
        name: replay-test
        classify: { code: body.status }
        rules:
          - { name: token-expired, when: { code: [1401] }, then: refresh }
          - { name: forced-logout, when: { code: [202] }, then: logout }
          - { name: transient, when: { status: [503] }, then: retry }
        refresh:
          use: oauth2
          with: { token-url: "https://auth.example.com/oauth/token", client-id: app }
        retry: { initial: 100ms, max-delay: 1s }

        """

    /// A HAR as Chrome's developer tools export it (pages, `_initiator`, `_resourceType`, a base64
    /// body, cookies, an `Authorization` header, a token answer with tokens in it), two requests
    /// meeting 1401, one token call, their re-sends, and a 503 retried.
    static let chromeHAR = #"""
        {"log": {"version": "1.2", "creator": {"name": "WebInspector", "version": "537.36"},
          "pages": [{"startedDateTime": "2026-01-01T10:00:00.000Z", "id": "page_1", "title": "app", "pageTimings": {}}],
          "entries": [
            {"_initiator": {"type": "script"}, "_resourceType": "fetch", "cache": {}, "pageref": "page_1",
             "startedDateTime": "2026-01-01T10:00:00.100Z", "time": 20.5,
             "request": {"method": "GET", "url": "https://api.example.com/profile?session=QUERY-SECRET", "httpVersion": "HTTP/1.1",
               "headers": [{"name": "Authorization", "value": "Bearer SECRET-OLD-TOKEN"}, {"name": "Cookie", "value": "sid=COOKIE-SECRET"}],
               "queryString": [], "cookies": [{"name": "sid", "value": "COOKIE-SECRET"}], "headersSize": -1, "bodySize": 0},
             "response": {"status": 200, "statusText": "OK", "httpVersion": "HTTP/1.1",
               "headers": [{"name": "Set-Cookie", "value": "sid=SET-COOKIE-SECRET"}, {"name": "Content-Type", "value": "application/json"}],
               "cookies": [], "content": {"size": 15, "mimeType": "application/json", "text": "eyJzdGF0dXMiOjE0MDF9", "encoding": "base64"},
               "redirectURL": "", "headersSize": -1, "bodySize": -1, "_transferSize": 100},
             "serverIPAddress": "127.0.0.1", "timings": {"blocked": 1, "dns": -1, "ssl": -1, "connect": -1, "send": 0, "wait": 19, "receive": 0.5}},
            {"startedDateTime": "2026-01-01T10:00:00.105Z", "time": 20,
             "request": {"method": "GET", "url": "https://api.example.com/orders", "httpVersion": "HTTP/1.1",
               "headers": [{"name": "Authorization", "value": "Bearer SECRET-OLD-TOKEN"}], "queryString": [], "cookies": [], "headersSize": -1, "bodySize": 0},
             "response": {"status": 200, "statusText": "OK", "httpVersion": "HTTP/1.1", "headers": [], "cookies": [],
               "content": {"size": 15, "mimeType": "application/json", "text": "{\"status\":1401}"}, "redirectURL": "", "headersSize": -1, "bodySize": -1},
             "timings": {"send": 0, "wait": 20, "receive": 0}},
            {"startedDateTime": "2026-01-01T10:00:00.121Z", "time": 30,
             "request": {"method": "POST", "url": "https://auth.example.com/oauth/token", "httpVersion": "HTTP/1.1",
               "headers": [], "queryString": [], "cookies": [], "headersSize": -1, "bodySize": 40,
               "postData": {"mimeType": "application/x-www-form-urlencoded", "text": "grant_type=refresh_token&refresh_token=SECRET-REFRESH"}},
             "response": {"status": 200, "statusText": "OK", "httpVersion": "HTTP/1.1", "headers": [], "cookies": [],
               "content": {"size": 80, "mimeType": "application/json", "text": "{\"access_token\":\"SECRET-NEW-TOKEN\",\"refresh_token\":\"SECRET-NEW-REFRESH\",\"expires_in\":3600}"},
               "redirectURL": "", "headersSize": -1, "bodySize": -1},
             "timings": {"send": 0, "wait": 30, "receive": 0}},
            {"startedDateTime": "2026-01-01T10:00:00.152Z", "time": 10,
             "request": {"method": "GET", "url": "https://api.example.com/profile?session=QUERY-SECRET", "httpVersion": "HTTP/1.1",
               "headers": [{"name": "Authorization", "value": "Bearer SECRET-NEW-TOKEN"}], "queryString": [], "cookies": [], "headersSize": -1, "bodySize": 0},
             "response": {"status": 200, "statusText": "OK", "httpVersion": "HTTP/1.1", "headers": [], "cookies": [],
               "content": {"size": 12, "mimeType": "application/json", "text": "{\"status\":0}"}, "redirectURL": "", "headersSize": -1, "bodySize": -1},
             "timings": {"send": 0, "wait": 10, "receive": 0}},
            {"startedDateTime": "2026-01-01T10:00:00.153Z", "time": 10,
             "request": {"method": "GET", "url": "https://api.example.com/orders", "httpVersion": "HTTP/1.1",
               "headers": [{"name": "Authorization", "value": "Bearer SECRET-NEW-TOKEN"}], "queryString": [], "cookies": [], "headersSize": -1, "bodySize": 0},
             "response": {"status": 200, "statusText": "OK", "httpVersion": "HTTP/1.1", "headers": [], "cookies": [],
               "content": {"size": 12, "mimeType": "application/json", "text": "{\"status\":0}"}, "redirectURL": "", "headersSize": -1, "bodySize": -1},
             "timings": {"send": 0, "wait": 10, "receive": 0}},
            {"startedDateTime": "2026-01-01T10:00:01.000Z", "time": 5,
             "request": {"method": "GET", "url": "https://api.example.com/busy", "httpVersion": "HTTP/1.1", "headers": [], "queryString": [], "cookies": [], "headersSize": -1, "bodySize": 0},
             "response": {"status": 503, "statusText": "Unavailable", "httpVersion": "HTTP/1.1", "headers": [], "cookies": [],
               "content": {"size": 0, "mimeType": "text/plain"}, "redirectURL": "", "headersSize": -1, "bodySize": -1},
             "timings": {"send": 0, "wait": 5, "receive": 0}},
            {"startedDateTime": "2026-01-01T10:00:01.106Z", "time": 5,
             "request": {"method": "GET", "url": "https://api.example.com/busy", "httpVersion": "HTTP/1.1", "headers": [], "queryString": [], "cookies": [], "headersSize": -1, "bodySize": 0},
             "response": {"status": 200, "statusText": "OK", "httpVersion": "HTTP/1.1", "headers": [], "cookies": [],
               "content": {"size": 12, "mimeType": "application/json", "text": "{\"status\":0}"}, "redirectURL": "", "headersSize": -1, "bodySize": -1},
             "timings": {"send": 0, "wait": 5, "receive": 0}},
            {"startedDateTime": "2026-01-01T10:00:01.500Z", "time": 0,
             "request": {"method": "GET", "url": "data:image/png;base64,AAAA", "httpVersion": "", "headers": [], "queryString": [], "cookies": [], "headersSize": -1, "bodySize": 0},
             "response": {"status": 200, "statusText": "", "httpVersion": "", "headers": [], "cookies": [], "content": {"size": 0, "mimeType": "image/png"}, "redirectURL": "", "headersSize": -1, "bodySize": -1},
             "timings": {}}
          ]}}
        """#

    static let secrets = [
        "SECRET-OLD-TOKEN", "COOKIE-SECRET", "SET-COOKIE-SECRET", "SECRET-REFRESH", "SECRET-NEW-TOKEN",
        "SECRET-NEW-REFRESH", "QUERY-SECRET",
    ]

    func folder() throws -> TemporaryDirectory {
        let dir = try TemporaryDirectory()
        try dir.write("policy.yaml", Self.policy)
        try dir.write("chrome.har", Self.chromeHAR)
        // The same policy that never refreshes: a 1401 ends the session.
        try dir.write(
            "strict.yaml",
            Self.policy.replacingOccurrences(
                of: "when: { code: [1401] }, then: refresh", with: "when: { code: [1401] }, then: logout"))
        return dir
    }

    @Test func aDevToolsHARComesOutAsRecordedWithNoSecretInTheOutput() async throws {
        let dir = try folder()
        for format in ["text", "json"] {
            let run = try await runPolicy(["replay", "policy.yaml", "chrome.har", "--format", format], in: dir.url)
            #expect(run.status == 0, "\(run.stdout)\(run.stderr)")
            for secret in Self.secrets {
                #expect(
                    !run.stdout.contains(secret) && !run.stderr.contains(secret), "\(secret) in the \(format) output")
            }
            if format == "json" {
                #expect(
                    run.stdoutLines.suffix(2) == [
                        #"{"event":"recording","entries":8,"requests":3,"token-calls":1,"logout-calls":0,"skipped":1,"not-as-recorded":0}"#,
                        #"{"event":"summary","requests":3,"delivered":3,"failed":0,"logged-out":0,"refreshes":1,"logouts":0,"attempts":6}"#,
                    ])
            } else {
                #expect(run.stdout.contains("3 of 3 requests came out as recorded"))
            }
        }
    }

    @Test func againstAStricterPolicyShowsEachRequestThatDiffers() async throws {
        let dir = try folder()
        let run = try await runPolicy(
            ["replay", "policy.yaml", "chrome.har", "--against", "strict.yaml", "--format", "json"], in: dir.url)
        #expect(run.status == 1, "\(run.stderr)")
        let differences = run.stdoutLines.filter { $0.contains("\"event\":\"difference\"") }
        // The two that met 1401, and the 503 after them: refused during the logout's cooldown.
        #expect(differences.count == 3, "\(run.stdout)")
        #expect(
            differences.allSatisfy { $0.contains("\"old\":{\"result\":\"delivered\",\"status\":200,\"code\":\"0\"") })
        #expect(differences.allSatisfy { $0.contains("\"new\":{\"result\":\"logged-out\"") })
        #expect(run.stdout.contains(#""path":"/profile""#) && !run.stdout.contains("QUERY-SECRET"))
        #expect(run.stdoutLines.last?.contains(#""policy":"new""#) == true)
        let same = try await runPolicy(
            ["replay", "policy.yaml", "chrome.har", "--against", "policy.yaml"], in: dir.url)
        #expect(same.status == 0, "\(same.stdout)")
        #expect(same.stdout.contains("0 of 3 requests differ between the policies"))
    }

    @Test func flagsAnswerRefreshesInsteadOfTheRecording() async throws {
        let dir = try folder()
        let run = try await runPolicy(["replay", "policy.yaml", "chrome.har", "--refresh", "fail"], in: dir.url)
        // The recording's re-sends never happen: both requests end with the failed refresh's logout,
        // and the 503 later is refused during its cooldown.
        #expect(run.status == 1)
        #expect(run.stdout.contains("refresh failed"), "\(run.stdout)")
        #expect(run.stdout.contains("0 of 3 requests came out as recorded"), "\(run.stdout)")
    }

    /// The engine's own events, replayed with the policy that made them: every shipped simulation
    /// (one process) comes out as its run did, with the same refresh calls and attempts.
    @Test(arguments: [
        "01-refresh-storm", "04-max-per-request", "05-refresh-failure", "09-forced-logout", "11-retry-after",
    ])
    func theEnginesOwnEventsComeOutAsTheyHappened(_ name: String) async throws {
        let dir = try TemporaryDirectory()
        let script = Self.root.appendingPathComponent("examples/simulations/\(name).yaml").path
        let simulated = try await runPolicy(["simulate", "--script", script, "--format", "json"])
        #expect(simulated.status == 0)
        try dir.write("events.jsonl", simulated.stdout)
        let policyPath = try #require(SimulateCommand.scriptPolicy(script)?.path)
        let run = try await runPolicy([
            "replay", policyPath, dir.url.appendingPathComponent("events.jsonl").path, "--format", "json",
        ])
        #expect(run.status == 0, "\(name): \(run.stdout.suffix(1500))\(run.stderr)")
        let original = try #require(simulated.stdoutLines.last)
        let replayed = try #require(run.stdoutLines.last)
        // The requests the script sent, and each refresh and attempt again.
        #expect(replayed == original, "\(name)")
    }

    struct Malformed: Sendable, CustomTestStringConvertible {
        var name: String
        var text: String
        var error: String
        var testDescription: String { name }
    }

    static let malformed: [Malformed] = [
        Malformed(
            name: "truncated", text: "{\"log\": {\"entries\": [\n  {\"startedDateTime\": \"2026",
            error: "r.har:2:23: error: the file ends inside a string"),
        Malformed(
            name: "not JSON", text: "log:\n  entries: []\n",
            error: "r.har:1:1: error: not a HAR file: expected a JSON object with 'log'"),
        Malformed(
            name: "no log", text: "{\"entries\": []}", error: "r.har:1:16: error: not a HAR file: no 'log' object"),
        Malformed(
            name: "missing comma",
            text: "{\"log\": {\"entries\": [{\"startedDateTime\": \"2026-01-01T00:00:00Z\" \"time\": 1}]}}",
            error: "r.har:1:65: error: expected ',' or '}' after an object member"),
        Malformed(
            name: "no start", text: "{\"log\": {\"entries\": [\n {\"time\": 1}]}}",
            error: "r.har:2:2: error: entry 1: no 'startedDateTime'"),
        Malformed(
            name: "bad date", text: "{\"log\": {\"entries\": [\n {\"startedDateTime\": \"yesterday\"}]}}",
            error: "r.har:2:2: error: entry 1: 'startedDateTime' is not an ISO 8601 date and time"),
        Malformed(
            name: "out of order",
            text: """
                {"log": {"entries": [
                 {"startedDateTime": "2026-01-01T10:00:30Z", "request": {"method": "GET", "url": "https://a.example/x"}, "response": {"status": 200}},
                 {"startedDateTime": "2026-01-01T10:00:00Z", "request": {"method": "GET", "url": "https://a.example/x"}, "response": {"status": 200}}
                ]}}
                """,
            error:
                "r.har:3:2: error: entry 2 starts 30s before an entry listed earlier; entries must be in time order (within 5s)"
        ),
    ]

    @Test(arguments: malformed)
    func aMalformedRecordingIsAnErrorAtItsPlace(_ scenario: Malformed) async throws {
        let dir = try folder()
        try dir.write("r.har", scenario.text)
        let run = try await runPolicy(["replay", "policy.yaml", "r.har"], in: dir.url)
        #expect(run.status == 65, "\(run.stdout)\(run.stderr)")
        #expect(run.stderr.contains(scenario.error), "\(run.stderr)")
    }

    @Test func aMalformedEventLineIsAnErrorAtItsLineAndColumn() async throws {
        let dir = try folder()
        try dir.write(
            "events.jsonl",
            "policy: a note on stderr\n{\"t\":0,\"request\":\"a\",\"event\":\"send\",\"attempt\":1}\n{\"t\":0.05,\"request\":\"a\" \"event\"}\n"
        )
        let run = try await runPolicy(["replay", "policy.yaml", "events.jsonl"], in: dir.url)
        #expect(run.status == 65)
        #expect(
            run.stderr.contains("events.jsonl:3:25: error: expected ',' or '}' after an object member"), "\(run.stderr)"
        )
    }

    @Test func aHugeBodyIsCutAndAnEntryAtATimeIsRead() async throws {
        // A 4 MiB response body is cut at 1 MiB and has no code, as the engine reads none from a
        // body past its scan limit; a 512 KiB one is kept whole and its code is read. The replay
        // goes on past both.
        let dir = try folder()
        func entry(_ path: String, padding: Int) -> String {
            let pad = String(repeating: "x", count: padding)
            return """
                 {"startedDateTime": "2026-01-01T10:00:00Z", "time": 5, "request": {"method": "GET", "url": "https://a.example/\(path)"},
                  "response": {"status": 200, "content": {"text": "{\\"status\\":0,\\"pad\\":\\"\(pad)\\"}"}}}
                """
        }
        let text = """
            {"log": {"entries": [
            \(entry("big", padding: 4 << 20)),
            \(entry("half", padding: 512 << 10))
            ]}}
            """
        try dir.write("big.har", text)
        let run = try await runPolicy(["replay", "policy.yaml", "big.har", "--format", "json"], in: dir.url)
        #expect(run.status == 0, "\(run.stderr)")
        let outcomes = run.stdout.split(separator: "\n").filter { $0.contains(#""event":"outcome""#) }
        #expect(outcomes.count == 2, "\(run.stdout.prefix(2000))")
        #expect(outcomes.contains { $0.contains(#""status":200,"result":"delivered""#) }, "\(outcomes)")
        #expect(outcomes.contains { $0.contains(#""status":200,"code":"0","result":"delivered""#) }, "\(outcomes)")
    }

    /// Playwright's HAR adds `ssl` to `time` on top of `connect` (HAR 1.2 counts it inside), and
    /// over plain HTTP its `ssl` is the connect phase plus a millisecond. A 1401 answered after the
    /// refresh ended is sent again at once: by `time` its answer ends 6 ms after the re-send began,
    /// by its phases 1 ms before. The re-send is its request's second attempt, not a request of its
    /// own (which replays as a request refreshing twice and logged out). A CI run's Chromium
    /// recording met it under load.
    @Test func aReSendRightAfterAnAnswerWhoseTimeCountsTheConnectTwiceContinuesItsRequest() async throws {
        let dir = try folder()
        // `time` as Playwright adds it up: every phase above 0, `ssl` included.
        func entry(_ path: String, at milliseconds: Int, token: String, status: Int, time: Double, timings: String)
            -> String
        {
            """
             {"startedDateTime": "2026-01-01T10:00:00.\(String(format: "%03d", milliseconds))Z", "time": \(time),
              "request": {"method": "GET", "url": "http://127.0.0.1:8080/api/\(path)",
                "headers": [{"name": "Authorization", "value": "Bearer \(token)"}]},
              "response": {"status": 200, "content": {"text": "{\\"status\\":\(status)}"}},
              "timings": {\(timings)}}
            """
        }
        let token = """
             {"startedDateTime": "2026-01-01T10:00:00.011Z", "time": 20,
              "request": {"method": "POST", "url": "http://127.0.0.1:8080/oauth/token",
                "postData": {"text": "grant_type=refresh_token&refresh_token=SECRET-REFRESH"}},
              "response": {"status": 200, "content": {"text": "{\\"access_token\\":\\"SECRET-NEW-TOKEN\\",\\"expires_in\\":3600}"}},
              "timings": {"dns": -1, "connect": -1, "ssl": -1, "send": 0, "wait": 20, "receive": 0}}
            """
        let entries = [
            entry(
                "a", at: 0, token: "SECRET-OLD-TOKEN", status: 1401, time: 10,
                timings: #""dns": -1, "send": 0, "wait": 10"#),
            // Queued behind a new connection: 5 ms to connect, "ssl" 6, its answer at 46 ms.
            entry(
                "b", at: 0, token: "SECRET-OLD-TOKEN", status: 1401, time: 52,
                timings: #""dns": 0.01, "connect": 5, "ssl": 6, "send": 0, "wait": 40, "receive": 0.99"#),
            token,
            entry("a", at: 32, token: "SECRET-NEW-TOKEN", status: 0, time: 5, timings: #""send": 0, "wait": 5"#),
            entry("b", at: 47, token: "SECRET-NEW-TOKEN", status: 0, time: 5, timings: #""send": 0, "wait": 5"#),
        ]
        try dir.write("playwright.har", "{\"log\": {\"entries\": [\n" + entries.joined(separator: ",\n") + "\n]}}")
        let run = try await runPolicy(["replay", "policy.yaml", "playwright.har", "--format", "json"], in: dir.url)
        #expect(run.status == 0, "\(run.stdout)\(run.stderr)")
        #expect(
            run.stdoutLines.suffix(2) == [
                #"{"event":"recording","entries":5,"requests":2,"token-calls":1,"logout-calls":0,"skipped":0,"not-as-recorded":0}"#,
                #"{"event":"summary","requests":2,"delivered":2,"failed":0,"logged-out":0,"refreshes":1,"logouts":0,"attempts":4}"#,
            ], "\(run.stdout)")
        #expect(!run.stdout.contains("SECRET"))
        // By its phases the 1401 took at least 46 ms; 52 by its `time`.
        let timed = """
            {"time": 52.0, "timings": {"dns": 0.01, "connect": 5, "ssl": 6, "send": 0, "wait": 40, "receive": 0.99}}
            """
        let reader = JSONStreamReader(bytes: Array(timed.utf8), file: "t", line: 1)
        let value = try reader.readValue(stringLimit: 100, maxMembers: 10)
        #expect(abs(HARRecording.shortestDuration(of: value) - 0.046) < 1e-9)
    }

    @Test func theShippedRecordingsComeOutAsRecorded() async throws {
        for name in ["storm-1401", "logout-202"] {
            let run = try await runPolicy([
                "replay", Self.root.appendingPathComponent("examples/replay/policy.yaml").path,
                Self.root.appendingPathComponent("examples/replay/\(name).har").path,
            ])
            #expect(run.status == 0, "\(name): \(run.stdout.suffix(1000))")
            for token in ["access-1", "refresh-0", "refresh-1", "Bearer"] {
                #expect(!run.stdout.contains(token), "\(name) shows '\(token)'")
            }
        }
    }

    @Test func harDatesInEveryShapeRecordersWrite() {
        #expect(HARRecording.parseDate("1970-01-01T00:00:00Z") == 0)
        #expect(HARRecording.parseDate("2026-01-01T10:00:00.250Z") == 1_767_261_600.25)
        #expect(HARRecording.parseDate("2026-01-01T11:00:00.250+01:00") == 1_767_261_600.25)
        #expect(HARRecording.parseDate("2026-01-01T10:00:00.250000+00:00") == 1_767_261_600.25)
        #expect(HARRecording.parseDate("2026-01-01T05:30:00-0430") == 1_767_261_600)
        #expect(HARRecording.parseDate("2026-13-01T00:00:00Z") == nil)
        #expect(HARRecording.parseDate("yesterday") == nil)
    }

    @Test func aCodeGoesBackWhereThePolicyReadsIt() {
        #expect(EventLogRecording.body(code: "1401", at: "status") == #"{"status":1401}"#)
        #expect(EventLogRecording.body(code: "E1", at: "errors.0.code") == #"{"errors":[{"code":"E1"}]}"#)
        #expect(EventLogRecording.body(code: "x\"y", at: "a.1") == #"{"a":[null,"x\"y"]}"#)
    }
}
