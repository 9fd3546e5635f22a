import Foundation
import ResponsePolicy
import ResponsePolicyURLSession
import TestGate
import Testing

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// The real engine, `URLSessionTransport` and the built-in network plugins against
/// `Fixtures/test_server.py` on 127.0.0.1, one server per test. Waits are checked through the
/// engine's events, counts through the server's `/_stats`; the one assertion on elapsed time (the
/// storm's refresh starting within 50 ms) runs only when asked.
@Suite(.loadGate(.realTime))
struct EngineIntegrationTests {
    // MARK: - Refresh

    /// `status1401`: the server says "expired" with a business code in a 200 body; `http401`: with
    /// a 401 status. Both are refresh triggers in the test policy.
    @Test(arguments: ["status1401", "http401"])
    func thirtyTwoConcurrentExpiredRequestsMakeOneRefreshAndWriteTheRotatedTokensBack(_ expiredMode: String)
        async throws
    {
        try await withTestServer { server in
            // The token endpoint answers slowly so that every request meets the refresh in flight.
            try await server.control(["token_delay": 0.3, "expired_mode": expiredMode])
            try await withCredentialsFile(#"{"access_token":"stale","refresh_token":"refresh-0"}"#) { path in
                let events = EventLog()
                let engine = try makeEngine(server, credentials: FileCredentialStore(path: path), events: events)
                let results = await sendConcurrently(engine, server.url("/api/items"), count: 32)

                #expect(results.count == 32)
                for result in results {
                    let response = try result.get()
                    #expect(response.status == 200)
                    #expect(String(decoding: response.body, as: UTF8.self) == #"{"status": 0, "data": "ok"}"#)
                }
                let stats = try await server.stats()
                #expect(stats.counters["token_calls"] == 1)
                #expect(stats.counters["api_ok"] == 32)
                #expect(events.count(.refreshStart) == 1)
                #expect(events.outcomes == [PolicyEvent.Result.delivered: 32])

                let saved = try #require(try FileCredentialStore(path: path).load())
                #expect(saved.accessToken == "access-1")
                #expect(saved.refreshToken == "refresh-1")
                #expect(saved.expiresAt != nil)
                #expect(try fileMode(path) == 0o600)
            }
        }
    }

    /// The dispatcher's goal with the defaults (`dispatch: auto`, which reads URLSession's six
    /// connections per host): N requests at once on an expired token make one refresh; the
    /// server sees at most N + 12 requests (without the dispatcher it saw 2N); the refresh starts
    /// within 50 ms of the first trigger (it queued behind the storm inside URLSession for about
    /// 1.2 s). A smoke of 500: `policy-bench --only storm-http` runs 1,000 and 5,000.
    /// Bounds wall time (the refresh starts within 50 ms of the first trigger, among 500 requests
    /// at once), so it runs when asked (`.ci/run`'s real-time step).
    @Test(.measuresRealTime(filter: "EngineIntegrationTests/anExpiredStorm"))
    func anExpiredStormWithTheDefaultsMakesOneRefreshAndAtMostTwelveExtraAttempts() async throws {
        try await withTestServer { server in
            let count = 500
            let events = EventLog()
            let policy = try Policy.load(
                // The queue is part of a request's time, and a loaded machine is slow: the
                // attempt timeout is the default one (it starts when the attempt leaves).
                yaml: basePolicy(port: server.port, retry: "attempt-timeout: 10s")
                    .replacingOccurrences(of: "deadline: 30s", with: "deadline: 10m"), file: "test.yaml")
            #expect(policy.dispatch.maxInFlightPerHost == .auto)
            var options = PolicyEngine.Options()
            options.observers = [events]
            let engine = PolicyEngine(
                policy: policy, transport: URLSessionTransport(timeout: .seconds(10)),
                credentials: MemoryCredentialStore(Credentials(accessToken: "stale", refreshToken: "refresh-0")),
                options: options)
            let results = await sendConcurrently(engine, server.url("/api/items"), count: count)

            #expect(results.count == count)
            let failures = results.compactMap { result -> String? in
                guard case .failure(let error) = result else { return nil }
                return error.description
            }
            #expect(failures.isEmpty, "\(failures.count) failed, e.g. \(Set(failures))")
            let stats = try await server.stats()
            #expect(stats.counters["token_calls"] == 1)
            #expect((stats.counters["api_calls"] ?? .max) <= count + 12, "\(stats.counters)")
            #expect(stats.counters["api_ok"] == count)
            let all = events.all
            let firstTrigger = try #require(all.first { $0.kind == .response && $0.action == .refresh })
            let refreshStart = try #require(all.first { $0.kind == .refreshStart })
            let delay = refreshStart.time - firstTrigger.time
            #expect(delay < .milliseconds(50), "the refresh started \(delay) after the first trigger")
        }
    }

    @Test func aTokenAboutToExpireIsRefreshedBeforeTheRequestsGoOut() async throws {
        try await withTestServer { server in
            try await server.control(["token_delay": 0.2])
            let expired = Date().addingTimeInterval(-60)
            let store = MemoryCredentialStore(
                Credentials(accessToken: "access-0", refreshToken: "refresh-0", expiresAt: expired))
            let events = EventLog()
            let engine = try makeEngine(server, credentials: store, events: events, refresh: "ahead: 30s")
            let results = await sendConcurrently(engine, server.url("/api/items"), count: 8)

            #expect(try results.map { try $0.get().status } == Array(repeating: 200, count: 8))
            let stats = try await server.stats()
            #expect(stats.counters["token_calls"] == 1)
            #expect(stats.counters["api_expired"] == 0, "no request went out with the expiring token")
            #expect(stats.counters["api_ok"] == 8)
            #expect(try store.load()?.accessToken == "access-1")
        }
    }

    @Test func aRefreshAnsweredWithInvalidGrantLogsOut() async throws {
        try await withTestServer { server in
            try await server.control(["token_mode": "invalid_grant"])
            let store = MemoryCredentialStore(Credentials(accessToken: "stale", refreshToken: "refresh-0"))
            let events = EventLog()
            let engine = try makeEngine(server, credentials: store, events: events)

            let error = await #expect(throws: PolicyEngineError.self) {
                try await engine.send(HTTPRequest(url: server.url("/api/items")))
            }
            guard case .loggedOut = error else {
                Issue.record("expected a logout, got \(String(describing: error))")
                return
            }
            let refreshEnd = try #require(events.all.first { $0.kind == .refreshEnd })
            #expect(refreshEnd.ok == false)
            #expect(refreshEnd.status == 400)
            #expect(refreshEnd.reason == "the token endpoint answered 400 (invalid_grant)")
            // A failed refresh is no rule: the logout names no rule, only its reason.
            #expect(events.all.filter { $0.kind == .logout }.map(\.rule) == [nil])
            #expect(
                events.all.filter { $0.kind == .logout }.map(\.reason) == [
                    "refresh failed: the token endpoint answered 400 (invalid_grant)"
                ])
            #expect(events.outcomes == [.loggedOut: 1])
            let stats = try await server.stats()
            #expect(stats.counters["token_calls"] == 1)
            #expect(stats.counters["token_rejected"] == 1)
            #expect(try store.load()?.accessToken == "stale", "a failed refresh stores nothing")
        }
    }

    // MARK: - Logout

    @Test func aForcedLogoutEndsTheSessionAndLaterRequestsFailWithoutTheNetwork() async throws {
        try await withTestServer { server in
            try await server.control(["api_mode": "logout"])
            let events = EventLog()
            let engine = try makeEngine(
                server, credentials: MemoryCredentialStore(Credentials(accessToken: "access-0")), events: events)

            let first = await #expect(throws: PolicyEngineError.self) {
                try await engine.send(HTTPRequest(url: server.url("/api/items")))
            }
            guard case .loggedOut(let until, _) = first else {
                Issue.record("expected a logout, got \(String(describing: first))")
                return
            }
            #expect(until > Date())
            #expect(engine.isLoggedOut)
            #expect(events.all.filter { $0.kind == .logout }.map(\.rule) == ["forced-logout"])
            // The http logout plugin runs in the background, bounded by its timeout.
            try await server.waitForCounter("logout_calls", toReach: 1)

            let later = await #expect(throws: PolicyEngineError.self) {
                try await engine.send(HTTPRequest(url: server.url("/api/items")))
            }
            guard case .loggedOut(let laterUntil, _) = later else {
                Issue.record("expected a logout, got \(String(describing: later))")
                return
            }
            // The same cooldown end (the engine converts it to a wall date on each call).
            #expect(abs(laterUntil.timeIntervalSince(until)) < 0.5)
            #expect(events.outcomes == [.loggedOut: 2])
            #expect(events.count(.send) == 1, "the request during the cooldown was never sent")
            let stats = try await server.stats()
            #expect(stats.counters["api_calls"] == 1)
            #expect(stats.counters["logout_calls"] == 1)
        }
    }

    // MARK: - Retries

    @Test func a503WithRetryAfterIsRetriedAfterTheServersDelay() async throws {
        try await withTestServer { server in
            try await server.control(["flaky_count": 1, "retry_after": 1])
            let events = EventLog()
            let engine = try makeEngine(server, credentials: nil, events: events)

            let response = try await engine.send(HTTPRequest(url: server.url("/flaky/503")))
            #expect(response.status == 200)
            // The policy's own backoff is 50ms; the wait is the server's Retry-After.
            #expect(events.all.filter { $0.kind == .wait }.map(\.delay) == [.seconds(1)])
            #expect(events.all.filter { $0.kind == .response }.map(\.status) == [503, 200])
            #expect(try await server.stats().counters["flaky_calls"] == 2)
        }
    }

    @Test func aConnectionClosedMidResponseIsRetriedAsAConnectionError() async throws {
        try await withTestServer { server in
            try await server.control(["drop_count": 1])
            let events = EventLog()
            let engine = try makeEngine(server, credentials: nil, events: events)

            let response = try await engine.send(HTTPRequest(url: server.url("/drop")))
            #expect(response.status == 200)
            let responses = events.all.filter { $0.kind == .response }
            #expect(responses.map(\.error) == [.connection, nil])
            #expect(responses.map(\.rule) == ["transient", nil])
            #expect(events.outcomes == [.delivered: 1])
            #expect(try await server.stats().counters["drop_calls"] == 2)
        }
    }

    @Test func aStallingServerTimesOutEachAttempt() async throws {
        try await withTestServer { server in
            try await server.control(["stall_seconds": 1.5])
            let events = EventLog()
            let engine = try makeEngine(
                server, credentials: nil, events: events, retry: "max-retries: 1\n  attempt-timeout: 300ms")

            let error = await #expect(throws: PolicyEngineError.self) {
                try await engine.send(HTTPRequest(url: server.url("/stall")))
            }
            guard case .retriesExhausted(nil, let lastError?) = error else {
                Issue.record("expected retries exhausted on a timeout, got \(String(describing: error))")
                return
            }
            #expect(lastError.errorClass == .timeout)
            #expect(events.all.filter { $0.kind == .response }.map(\.error) == [.timeout, .timeout])
            #expect(events.outcomes == [.failed: 1])
        }
    }

    // MARK: - policy fetch

    @Test func fetchDeliversEveryRequestAndWritesTheRotatedTokensBack() async throws {
        try await withTestServer { server in
            try await server.control(["token_delay": 0.2])
            try await withCredentialsFile(#"{"access_token":"stale","refresh_token":"refresh-0"}"#, mode: 0o644) {
                path in
                let policy = try writePolicy(server, next: path)
                let run = try await runPolicy([
                    "fetch", "--policy", policy, "--credentials", path, "--count", "4", "--concurrency", "2",
                    server.url("/api/items").absoluteString,
                ])
                #expect(run.status == 0, "stderr: \(run.stderr)")
                // Like ssh with a key, a credentials file open to others is made 0600, and said so.
                #expect(
                    run.stderr
                        == "warning: the credentials file '\(path)' was open to others (mode 644); its mode is now 0600\n"
                )
                let lines = run.stdout.split(separator: "\n").map(String.init)
                #expect(lines.count == 5)
                let requestLines = lines.dropLast()
                #expect(
                    Set(requestLines.map { $0.split(separator: " ").first.map(String.init) ?? "" }) == [
                        "r1", "r2", "r3", "r4",
                    ])
                for line in requestLines {
                    #expect(matches(line, #"^r[1-4] 200 code=0 attempts=[12] [0-9]+ms delivered$"#), "\(line)")
                }
                #expect(
                    matches(
                        lines.last ?? "",
                        #"^summary: 4 requests: 4 delivered, 0 failed, 0 logged out; "#
                            + #"1 refresh, 0 logouts, [4-8] attempts; [0-9]+ms$"#
                    ),
                    "\(lines.last ?? "")")
                let saved = try #require(try FileCredentialStore(path: path).load())
                #expect(saved.accessToken == "access-1")
                #expect(saved.refreshToken == "refresh-1")
                #expect(try fileMode(path) == 0o600)
                #expect(try await server.stats().counters["token_calls"] == 1)
            }
        }
    }

    /// `--transport urlsession|curl` (curl by default on Linux): the same requests, the same
    /// refresh (its token POST through the transport's session calls), the same exit.
    @Test(arguments: ["urlsession", "curl", nil])
    func fetchSendsThroughEitherTransport(_ transport: String?) async throws {
        try await withTestServer { server in
            try await withCredentialsFile(#"{"access_token":"stale","refresh_token":"refresh-0"}"#) { path in
                let policy = try writePolicy(server, next: path)
                let run = try await runPolicy(
                    ["fetch", "--policy", policy, "--credentials", path, "--count", "6", "--concurrency", "3"]
                        + (transport.map { ["--transport", $0] } ?? []) + [server.url("/api/items").absoluteString])
                #expect(run.status == 0, "stderr: \(run.stderr)")
                #expect(run.stdout.hasSuffix("\n") && run.stdout.contains("6 delivered"), "\(run.stdout)")
                #expect(try FileCredentialStore(path: path).load()?.refreshToken == "refresh-1")
                #expect(try await server.stats().counters["token_calls"] == 1)
            }
        }
        let usage = try await runPolicy(["fetch", "--policy", "p.yaml", "--transport", "nghttp", "http://x/"])
        #expect(usage.status == 64)
        #expect(usage.stderr.hasPrefix("Error: Unknown transport 'nghttp'; use urlsession or curl"), "\(usage.stderr)")
    }

    @Test func fetchSaysPlainlyWhenTheSessionWasLoggedOutAndExitsOne() async throws {
        try await withTestServer { server in
            try await server.control(["api_mode": "logout"])
            try await withCredentialsFile(#"{"access_token":"access-0"}"#) { path in
                let policy = try writePolicy(server, next: path)
                let run = try await runPolicy([
                    "fetch", "--policy", policy, "--credentials", path, "--count", "2",
                    server.url("/api/items").absoluteString,
                ])
                #expect(run.status == 1)
                let lines = run.stdout.split(separator: "\n").map(String.init)
                #expect(lines.count == 3)
                let note = "logged out by rule 'forced-logout'; new requests fail until "
                #expect(lines.first?.hasPrefix("r1 200 code=202 attempts=1 ") == true, "\(lines)")
                #expect(lines.first?.contains("ms logged-out: " + note) == true, "\(lines)")
                #expect(lines.dropFirst().first?.hasPrefix("r2 - code=- attempts=0 ") == true, "\(lines)")
                #expect(
                    lines.last?.hasPrefix(
                        "summary: 2 requests: 0 delivered, 0 failed, 2 logged out; 0 refreshes, 1 logout, 1 attempt; ")
                        == true)
                #expect(run.stderr.hasPrefix("policy: " + note), "\(run.stderr)")
                let stats = try await server.stats()
                #expect(stats.counters["api_calls"] == 1)
                #expect(stats.counters["logout_calls"] == 1, "fetch waits for the http logout call before exiting")
            }
        }
    }

    /// Plants a refresh token and a client secret and checks that no output of a successful or a
    /// failed run, with every event printed, shows them or the tokens the server issues.
    @Test func fetchNeverPrintsTokensOrTheClientSecret() async throws {
        let refreshToken = "PLANTED-REFRESH-3b9e"
        let secret = "PLANTED-SECRET-d41c"
        let environment = ["POLICY_TEST_CLIENT_SECRET": secret]
        try await withTestServer { server in
            for tokenMode in ["normal", "invalid_grant"] {
                try await server.control([
                    "reset": true, "refresh_token": refreshToken, "token_mode": tokenMode, "client_id": "app",
                ])
                let credentials = #"{"access_token":"PLANTED-ACCESS-77","refresh_token":"\#(refreshToken)"}"#
                try await withCredentialsFile(credentials) { path in
                    let policy = try writePolicy(server, next: path, secretEnv: "POLICY_TEST_CLIENT_SECRET")
                    let run = try await runPolicy(
                        [
                            "fetch", "--verbose", "--policy", policy, "--credentials", path,
                            server.url("/api/items").absoluteString,
                        ],
                        environment: environment)
                    #expect(run.status == (tokenMode == "normal" ? 0 : 1), "\(run.stdout)\(run.stderr)")
                    let output = run.stdout + run.stderr
                    #expect(output.contains("\"event\":\"refresh-end\""), "--verbose printed the events")
                    for planted in [refreshToken, secret, "PLANTED-ACCESS-77", "access-1", "refresh-1"] {
                        #expect(!output.contains(planted), "'\(planted)' leaked in \(tokenMode) run")
                    }
                }
            }
        }
    }

    struct ExitCase: Sendable, CustomTestStringConvertible {
        var name: String
        var arguments: [String]
        var status: Int32
        var message: String
        var testDescription: String { name }
    }

    /// `POLICY` and `CREDENTIALS` are replaced by a valid policy and credentials file.
    @Test(arguments: [
        ExitCase(
            name: "no --policy", arguments: ["http://127.0.0.1:9/x"], status: 64,
            message: "Error: Missing expected option '--policy <file>'"),
        ExitCase(
            name: "no URL", arguments: ["--policy", "POLICY"], status: 64,
            message: "Error: Missing expected argument 'URL'"),
        ExitCase(
            name: "two URLs", arguments: ["--policy", "POLICY", "http://a.example/", "http://b.example/"], status: 64,
            message: "Error: Unexpected argument 'http://b.example/'"),
        ExitCase(
            name: "not an http URL", arguments: ["--policy", "POLICY", "ftp://a.example/"], status: 64,
            message: "Error: Invalid URL 'ftp://a.example/'; expected an http:// or https:// URL"),
        ExitCase(
            name: "count zero", arguments: ["--policy", "POLICY", "--count", "0", "http://a.example/"], status: 64,
            message: "Error: Invalid value '0' for '--count <m>'; expected a positive whole number"),
        ExitCase(
            name: "concurrency not a number",
            arguments: ["--policy", "POLICY", "--concurrency", "x", "http://a.example/"],
            status: 64, message: "Error: Invalid value 'x' for '--concurrency <n>'; expected a positive whole number"),
        ExitCase(
            name: "header without colon", arguments: ["--policy", "POLICY", "-H", "Accept json", "http://a.example/"],
            status: 64, message: "Error: Invalid header 'Accept': no ':' after its name; write -H 'Name: value'"),
        ExitCase(
            name: "GET with a body", arguments: ["--policy", "POLICY", "-X", "GET", "-d", "x", "http://a.example/"],
            status: 64, message: "Error: A GET request cannot have a body (-d); add -X POST or another method"),
        ExitCase(
            name: "unknown option", arguments: ["--policy", "POLICY", "--bogus", "http://a.example/"], status: 64,
            message: "Error: Unknown option '--bogus'"),
        ExitCase(
            name: "unreadable policy", arguments: ["--policy", "/nonexistent/p.yaml", "http://a.example/"], status: 66,
            message: "error: cannot read '/nonexistent/p.yaml'"),
        ExitCase(
            name: "missing credentials",
            arguments: ["--policy", "POLICY", "--credentials", "/nonexistent/c.json", "http://a.example/"],
            status: 66, message: "error: cannot read '/nonexistent/c.json': no such file or directory"),
        ExitCase(
            name: "malformed credentials",
            arguments: ["--policy", "POLICY", "--credentials", "CREDENTIALS", "http://a.example/"],
            status: 65, message: "error: the credentials file 'CREDENTIALS' is malformed: 'access_token' is missing"),
    ])
    func fetchExitCodes(_ testCase: ExitCase) async throws {
        try await withCredentialsFile(#"{"refresh_token":"PLANTED-REFRESH-1"}"#) { credentials in
            let policy = credentials + ".policy.yaml"
            try Data(basePolicy(port: 9).utf8).write(to: URL(fileURLWithPath: policy))
            let arguments = testCase.arguments.map { $0 == "POLICY" ? policy : $0 == "CREDENTIALS" ? credentials : $0 }
            let run = try await runPolicy(["fetch"] + arguments)
            #expect(run.status == testCase.status)
            let message = testCase.message.replacingOccurrences(of: "CREDENTIALS", with: credentials)
            #expect(run.stderr.hasPrefix(message), "\(run.stderr)")
            #expect(run.stdout == "")
            #expect(!run.stderr.contains("PLANTED"))
            if testCase.status == 64 {
                #expect(run.stderr.contains("Usage: policy fetch --policy FILE"))
                #expect(run.stderr.hasSuffix("See 'policy fetch --help' for more information.\n"))
            }
        }
    }

    @Test func fetchHelp() async throws {
        let run = try await runPolicy(["fetch", "--help"])
        #expect(run.status == 0)
        for section in [
            "OVERVIEW:", "USAGE: policy fetch --policy FILE", "ARGUMENTS:", "  URL ", "OPTIONS:",
            "--credentials <file>", "-H, --header <header>",
        ] {
            #expect(run.stdout.contains(section), "\(section)")
        }
        #expect(run.stderr == "")
    }
}

// MARK: - Helpers

/// The policy every test runs under, with the server's port; `refresh` and `retry` add or override
/// settings of those sections. Its timeouts are generous: `swift test` runs every suite at once on
/// two cores, where an answer can wait seconds for a thread of the pool while a timeout's timer
/// fires on its own; the tests that time out name their own.
private func basePolicy(port: Int, secretEnv: String? = nil, refresh: String = "", retry: String = "") -> String {
    """
    policy: 1
    name: integration
    classify:
      code: body.status
    rules:
      - name: token-expired
        when: { code: [1401] }
        then: refresh
      - name: forced-logout
        when: { code: [202] }
        then: logout
      - name: unauthorized
        when: { status: [401] }
        then: refresh
      - name: transient
        when: { status: [502, 503, 504], error: [timeout, connection] }
        then: retry
    refresh:
      use: oauth2
      with:
        token-url: "http://127.0.0.1:\(port)/oauth/token"
        client-id: app\(secretEnv.map { "\n    client-secret-env: \($0)" } ?? "")
      timeout: 30s
      \(refresh.isEmpty ? "share-window: 20s" : refresh)
    logout:
      use: http
      with: { url: "http://127.0.0.1:\(port)/logout", timeout: 2s }
      cooldown: 20s
    retry:
      backoff: constant
      initial: 50ms
      max-delay: 2s
      \(retry.isEmpty ? "attempt-timeout: 20s" : retry)
      deadline: 30s
    routes:
      - match: { path: "/oauth/*" }
        rules: []
    """
}

/// An engine over a real `URLSessionTransport`, its events recorded in `events`.
private func makeEngine(
    _ server: TestServer, credentials: (any CredentialStore)?, events: EventLog, refresh: String = "",
    retry: String = ""
) throws -> PolicyEngine {
    let policy = try Policy.load(
        yaml: basePolicy(port: server.port, refresh: refresh, retry: retry), file: "test.yaml")
    var options = PolicyEngine.Options()
    options.observers = [events]
    return PolicyEngine(
        policy: policy, transport: URLSessionTransport(timeout: .seconds(10)), credentials: credentials,
        options: options)
}

/// Writes the test policy next to `path` and returns its path.
private func writePolicy(_ server: TestServer, next path: String, secretEnv: String? = nil) throws -> String {
    let policyPath = path + ".policy.yaml"
    try Data(basePolicy(port: server.port, secretEnv: secretEnv).utf8)
        .write(to: URL(fileURLWithPath: policyPath))
    return policyPath
}

/// Sends `count` GET requests to `url` at once.
private func sendConcurrently(_ engine: PolicyEngine, _ url: URL, count: Int) async -> [Result<
    HTTPResponse, PolicyEngineError
>] {
    await withTaskGroup(of: Result<HTTPResponse, PolicyEngineError>.self) { group in
        for index in 1...count {
            group.addTask {
                do throws(PolicyEngineError) {
                    return .success(try await engine.send(HTTPRequest(url: url, id: "c\(index)")))
                } catch {
                    return .failure(error)
                }
            }
        }
        var results: [Result<HTTPResponse, PolicyEngineError>] = []
        for await result in group { results.append(result) }
        return results
    }
}

/// Records every engine event.
private final class EventLog: PolicyObserver {
    private let events = Locked<[PolicyEvent]>([])

    func observe(_ event: PolicyEvent) { events.withLock { $0.append(event) } }

    var all: [PolicyEvent] { events.withLock { $0 } }

    func count(_ kind: PolicyEvent.Kind) -> Int { all.filter { $0.kind == kind }.count }

    /// How many requests ended each way.
    var outcomes: [PolicyEvent.Result: Int] {
        all.reduce(into: [:]) { counts, event in
            if event.kind == .outcome, let result = event.result { counts[result, default: 0] += 1 }
        }
    }
}

/// Runs `body` with a credentials file holding `json` (mode `mode`) in a fresh directory.
private func withCredentialsFile(_ json: String, mode: mode_t = 0o600, _ body: (String) async throws -> Void)
    async throws
{
    let directory = FileManager.default.temporaryDirectory.appendingPathComponent("rp-it-\(UUID().uuidString)").path
    try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(atPath: directory) }
    let path = directory + "/credentials.json"
    try Data(json.utf8).write(to: URL(fileURLWithPath: path))
    chmod(path, mode)
    try await body(path)
}

private func fileMode(_ path: String) throws -> Int {
    let attributes = try FileManager.default.attributesOfItem(atPath: path)
    return (attributes[.posixPermissions] as? NSNumber)?.intValue ?? -1
}

private func matches(_ text: String, _ pattern: String) -> Bool {
    text.range(of: pattern, options: .regularExpression) != nil
}

// MARK: - The policy binary

struct PolicyRun: Sendable {
    var status: Int32
    var stdout: String
    var stderr: String
}

/// The built `policy` binary: next to this test bundle (same build configuration), else
/// `.build/debug/policy` under the repository root found from this file.
func policyBinary() throws -> URL {
    let besideBundle = Bundle.module.bundleURL.deletingLastPathComponent().appendingPathComponent("policy")
    if FileManager.default.isExecutableFile(atPath: besideBundle.path) { return besideBundle }
    var directory = URL(fileURLWithPath: #filePath)
    while directory.path != "/" {
        directory.deleteLastPathComponent()
        if FileManager.default.fileExists(atPath: directory.appendingPathComponent("Package.swift").path) {
            let binary = directory.appendingPathComponent(".build/debug/policy")
            if FileManager.default.isExecutableFile(atPath: binary.path) { return binary }
            break
        }
    }
    throw TestServer.Failure(description: "the policy binary is not built; run 'swift build' first")
}

/// Runs `policy arguments`, reading both pipes before waiting for the exit, on threads of their own:
/// neither the cooperative pool nor Dispatch's global queue (whose blocked threads stall Dispatch's
/// timers and signal sources for the whole test process) waits for the process.
func runPolicy(_ arguments: [String], environment: [String: String] = [:]) async throws -> PolicyRun {
    let binary = try policyBinary()
    return try await withCheckedThrowingContinuation { continuation in
        Thread.detachNewThread {
            continuation.resume(
                with: Result {
                    let process = Process()
                    process.executableURL = binary
                    process.arguments = arguments
                    process.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 }
                    let stdout = Pipe()
                    let stderr = Pipe()
                    process.standardOutput = stdout
                    process.standardError = stderr
                    process.standardInput = FileHandle.nullDevice
                    try process.run()
                    let errorData = Locked(Data())
                    let group = DispatchGroup()
                    group.enter()
                    Thread.detachNewThread {
                        let data = stderr.fileHandleForReading.readDataToEndOfFile()
                        errorData.withLock { $0 = data }
                        group.leave()
                    }
                    let outputData = stdout.fileHandleForReading.readDataToEndOfFile()
                    group.wait()
                    process.waitUntilExit()
                    return PolicyRun(
                        status: process.terminationStatus, stdout: String(decoding: outputData, as: UTF8.self),
                        stderr: String(decoding: errorData.withLock { $0 }, as: UTF8.self))
                })
        }
    }
}
