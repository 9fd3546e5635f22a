import Foundation
import ResponsePolicy
import TestGate
import Testing

@testable import ResponsePolicyURLSession

/// The token endpoint's answers read as the server meant them (SPEC "The refresh token is
/// irreplaceable"), through the built `policy fetch` against Authlib (`Fixtures/authlib_server.py`:
/// refresh tokens rotate, and a refresh token presented after it was spent is counted). Each
/// answer that used to lose a pair, burn a refresh token, lock an account or log a session out
/// that the server never ended:
/// - a 200 whose `expires_in` the engine cannot use: the pair is kept, nobody is logged out;
/// - a token type the authorizer does not send, or a token with a newline: the refresh fails, the
///   rotated refresh token is kept (the next call presents it, never the spent one);
/// - a 429 with `Retry-After: 30`: one token call, however many requests meet the trigger;
/// - a wrong password: one token call;
/// - a 401 with `error="insufficient_scope"`: delivered, no refresh;
/// - an outage of the token endpoint while the first token is refused: no logout.
@Suite(.measuresRealTime(filter: "AuthlibTokenAnswerTests"), .loadGate(.realTime), .serialized)
struct AuthlibTokenAnswerTests {
    struct Stats: Decodable {
        var tokenCalls: Int
        var issued: Int
        var refreshReused: Int
        var transientAnswers: Int
        var apiScope401: Int
        var lastRefreshToken: String?

        enum CodingKeys: String, CodingKey {
            case tokenCalls = "token_calls", issued, refreshReused = "refresh_reused"
            case transientAnswers = "transient_answers", apiScope401 = "api_scope_401"
            case lastRefreshToken = "last_refresh_token"
        }
    }

    /// A run of `policy fetch` and what it left in its credentials file.
    struct Run {
        var run: PolicyRun
        var credentials: [String: Any]
        var summary: String { run.stdout.split(separator: "\n").last.map(String.init) ?? "" }
    }

    static let secret = "basic-secret"

    /// The shipped rules for a plain-status API: insufficient_scope delivered, a 401 refreshed.
    static func policy(_ server: FixtureServer, grant: String = "refresh_token", refresh: String = "") -> String {
        var options = """
                token-url: \(server.url("/oauth/token").absoluteString)
                grant: \(grant)
                client-id: basic
                client-secret-env: AUTHLIB_TEST_SECRET

            """
        if grant == "password" {
            options += "    username-env: AUTHLIB_TEST_USER\n    password-env: AUTHLIB_TEST_PASSWORD\n"
        }
        return """
            policy: 1
            name: authlib-answers
            rules:
              - { name: missing-scope, when: { status: [401, 403], header: { WWW-Authenticate: "*insufficient_scope*" } }, then: deliver }
              - { name: unauthorized, when: { status: [401] }, then: refresh }
            refresh:
              use: oauth2
              with:
            \(options)\(refresh)retry: { initial: 50ms, max-delay: 500ms, attempt-timeout: 5s }
            dispatch: { max-in-flight-per-host: unlimited }

            """
    }

    func control(_ server: FixtureServer, _ settings: [String: Any]) async throws {
        let body = try JSONSerialization.data(withJSONObject: settings)
        let response = try await URLSessionTransport(timeout: .seconds(10)).send(
            HTTPRequest(method: "POST", url: server.url("/_control"), body: body))
        #expect(response.status == 200)
    }

    /// A refresh token from the password grant (and its access token), to start from.
    func pair(_ server: FixtureServer) async throws -> (access: String, refresh: String) {
        let form = "grant_type=password&username=alice&password=wonderland&client_id=basic"
        let headers: HTTPHeaders = [
            "Content-Type": "application/x-www-form-urlencoded",
            "Authorization": "Basic " + Data("basic:\(Self.secret)".utf8).base64EncodedString(),
        ]
        let response = try await URLSessionTransport(timeout: .seconds(10)).send(
            HTTPRequest(method: "POST", url: server.url("/oauth/token"), headers: headers, body: Data(form.utf8)))
        let object = try JSONSerialization.jsonObject(with: response.body) as? [String: Any]
        guard let access = object?["access_token"] as? String, let refresh = object?["refresh_token"] as? String else {
            throw FixtureServer.Failure(description: "no pair from the password grant: \(response.status)")
        }
        return (access, refresh)
    }

    /// `policy fetch` of `path` `count` times, `concurrency` at once, starting from `access` and
    /// `refresh` in a credentials file (none for a sign-in grant).
    func fetch(
        _ server: FixtureServer, policy: String, path: String = "/api/me", count: Int, concurrency: Int = 8,
        access: String? = nil, refresh: String? = nil, password: String = "wonderland", verbose: Bool = false
    ) async throws -> Run {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("authlib-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let policyFile = directory.appendingPathComponent("policy.yaml")
        try Data(policy.utf8).write(to: policyFile)
        var arguments = [
            "fetch", "--policy", policyFile.path, "--concurrency", "\(concurrency)", "--count", "\(count)",
        ]
        if verbose { arguments.append("--verbose") }
        let credentials = directory.appendingPathComponent("credentials.json")
        if let access {
            let object: [String: Any] = ["access_token": access, "refresh_token": refresh ?? ""]
            try JSONSerialization.data(withJSONObject: object).write(to: credentials)
            try FileManager.default.setAttributes([.posixPermissions: 0o600], ofItemAtPath: credentials.path)
            arguments += ["--credentials", credentials.path]
        }
        arguments.append(server.url(path).absoluteString)
        let run = try await runPolicy(
            arguments,
            environment: [
                "AUTHLIB_TEST_SECRET": Self.secret, "AUTHLIB_TEST_USER": "alice", "AUTHLIB_TEST_PASSWORD": password,
            ])
        var saved: [String: Any] = [:]
        if access != nil, let data = try? Data(contentsOf: credentials) {
            saved = (try? JSONSerialization.jsonObject(with: data) as? [String: Any]) ?? [:]
        }
        return Run(run: run, credentials: saved)
    }

    static var runs: Bool { AuthlibTests.runs }
    static let needsAuthlib = AuthlibTests.needsAuthlib

    @Test(
        .enabled(if: runs, Self.needsAuthlib),
        arguments: ["1e18", "-5", "\"soon\"", "4294967296", "31536000000"])
    func aPairWithAnUnusableExpiresInIsKept(_ expiresIn: String) async throws {
        let python = try AuthlibTests.requirePython()
        try await withFixtureServer("authlib_server", python: python, arguments: ["1", "0"]) { server in
            let (access, refresh) = try await pair(server)
            let value = try JSONSerialization.jsonObject(with: Data(expiresIn.utf8), options: .fragmentsAllowed)
            try await control(server, ["answer_overrides": ["expires_in": value]])
            try await Task.sleep(for: .milliseconds(1_100))  // the first access token expires at the server
            // Tokens live 1 s at the server; the client does not know (the lifetime is unknown), so
            // each expiry is a 401 and a refresh.
            let run = try await fetch(
                server, policy: Self.policy(server), count: 300, concurrency: 4, access: access, refresh: refresh,
                verbose: true)
            let stats = try await server.stats(Stats.self)
            #expect(run.run.status == 0, "\(run.summary)\n\(run.run.stderr.suffix(1500))")
            #expect(run.summary.contains("300 delivered, 0 failed, 0 logged out"), "\(run.summary)")
            #expect(run.summary.contains("0 logouts"), "\(run.summary)")
            #expect(stats.refreshReused == 0, "a refresh token was presented twice")
            #expect(stats.issued >= 2, "the stale token was refreshed")
            #expect(run.run.stderr.contains("is not a usable number of seconds"), "the odd lifetime is a problem event")
            // The pair kept is the one the server issued last.
            #expect(run.credentials["refresh_token"] as? String == stats.lastRefreshToken)
        }
    }

    @Test(
        .enabled(if: runs, Self.needsAuthlib),
        arguments: [["token_type": "mac"], ["access_token": "abc\r\nX-Injected: 1"]])
    func anUnusableTokenFailsTheRefreshAndKeepsTheRotatedRefreshToken(_ overrides: [String: String]) async throws {
        let python = try AuthlibTests.requirePython()
        try await withFixtureServer("authlib_server", python: python, arguments: ["1", "0"]) { server in
            let (access, refresh) = try await pair(server)
            try await control(server, ["answer_overrides": overrides])
            try await Task.sleep(for: .milliseconds(1_100))  // the access token expires at the server
            let first = try await fetch(
                server, policy: Self.policy(server), count: 20, access: access, refresh: refresh)
            var stats = try await server.stats(Stats.self)
            #expect(first.run.status == 1, "\(first.summary)")
            #expect(first.summary.contains("0 logouts"), "\(first.summary)")
            #expect(stats.tokenCalls == 2, "one call for the run (the password grant made the first)")
            // The server rotated: the refresh token it issued is the one saved.
            let kept = try #require(first.credentials["refresh_token"] as? String)
            #expect(kept == stats.lastRefreshToken && kept != refresh)
            // The next run presents the kept refresh token, never the spent one.
            try await control(server, ["answer_overrides": [String: String]()])
            let second = try await fetch(
                server, policy: Self.policy(server), count: 20, access: access, refresh: kept)
            stats = try await server.stats(Stats.self)
            #expect(second.run.status == 0, "\(second.summary)\n\(second.run.stderr.suffix(1500))")
            #expect(stats.refreshReused == 0, "a refresh token was presented twice")
        }
    }

    @Test(.enabled(if: runs, Self.needsAuthlib))
    func aRetryAfterOf30sMakesOneTokenCall() async throws {
        let python = try AuthlibTests.requirePython()
        try await withFixtureServer("authlib_server", python: python, arguments: ["1", "0"]) { server in
            let (access, refresh) = try await pair(server)
            try await Task.sleep(for: .milliseconds(1_100))
            try await control(server, ["transient_every": 1, "transient_status": 429, "retry_after": 30])
            let run = try await fetch(
                server, policy: Self.policy(server), count: 40, concurrency: 4, access: access, refresh: refresh)
            let stats = try await server.stats(Stats.self)
            #expect(run.run.status == 1)
            #expect(run.summary.contains("0 delivered, 40 failed, 0 logged out"), "\(run.summary)")
            #expect(stats.tokenCalls == 2, "the password grant's call and one refresh: no call before Retry-After ends")
            #expect(run.run.stdout.contains("Retry-After"), "the reason says why")
        }
    }

    @Test(.enabled(if: runs, Self.needsAuthlib))
    func aWrongPasswordMakesOneTokenCall() async throws {
        let python = try AuthlibTests.requirePython()
        try await withFixtureServer("authlib_server", python: python, arguments: ["1", "0"]) { server in
            let run = try await fetch(
                server, policy: Self.policy(server, grant: "password"), count: 40, password: "not-the-password")
            let stats = try await server.stats(Stats.self)
            #expect(run.run.status == 1)
            #expect(stats.tokenCalls == 1, "a wrong password is asked once: \(stats.tokenCalls) calls")
            #expect(run.run.stdout.contains("invalid_request") || run.run.stdout.contains("invalid_grant"))
            #expect(!(run.run.stdout + run.run.stderr).contains("not-the-password"))
        }
    }

    @Test(.enabled(if: runs, Self.needsAuthlib))
    func insufficientScopeIsDeliveredNotRefreshed() async throws {
        let python = try AuthlibTests.requirePython()
        try await withFixtureServer("authlib_server", python: python, arguments: ["30", "0"]) { server in
            let (access, refresh) = try await pair(server)
            let run = try await fetch(
                server, policy: Self.policy(server), path: "/api/admin", count: 40, access: access, refresh: refresh)
            let stats = try await server.stats(Stats.self)
            #expect(run.run.status == 0, "\(run.summary)")
            #expect(run.summary.contains("40 delivered, 0 failed, 0 logged out"), "\(run.summary)")
            #expect(run.summary.contains("0 refreshes, 0 logouts"), "\(run.summary)")
            #expect(stats.apiScope401 == 40)
            #expect(stats.tokenCalls == 1, "only the password grant that made the first pair")
        }
    }

    @Test(.enabled(if: runs, Self.needsAuthlib))
    func anOutageWhileTheFirstTokenIsRefusedNeverLogsOut() async throws {
        let python = try AuthlibTests.requirePython()
        try await withFixtureServer("authlib_server", python: python, arguments: ["1", "0"]) { server in
            let (access, refresh) = try await pair(server)
            try await Task.sleep(for: .milliseconds(1_100))
            // Six 503s: with refresh.timeout 1s each refresh makes two calls and fails; limit 2 in
            // 30s used to count those refreshes of the initial token and log the session out.
            try await control(server, ["transient_first": 6, "transient_status": 503, "retry_after": 0])
            let run = try await fetch(
                server,
                policy: Self.policy(
                    server, refresh: "  timeout: 1s\n  limit: { count: 2, per: 30s }\n  transient: { initial: 300ms }\n"
                ),
                count: 80, concurrency: 2, access: access, refresh: refresh)
            let stats = try await server.stats(Stats.self)
            #expect(run.summary.contains("0 logged out"), "\(run.summary)")
            #expect(run.summary.contains("0 logouts"), "\(run.summary)")
            #expect(!run.summary.contains(" 0 delivered"), "the refresh succeeded after the outage: \(run.summary)")
            #expect(stats.transientAnswers == 6)
            #expect(stats.refreshReused == 0, "a refresh token was presented twice")
        }
    }
}
