import Foundation
import ResponsePolicy
import TestGate
import Testing

@testable import ResponsePolicyURLSession

/// The `oauth2` plugin against an authorization server nobody here wrote: Authlib's own grant
/// classes (`Fixtures/authlib_server.py`; rotation on, tokens living 1 s, idle keep-alive
/// connections reset at reuse), through the built `policy fetch` with 64 requests at once and no
/// `dispatch` limit. Issue 20's "done when": one token call per expiry, nobody logged out,
/// everything delivered, through transient token-endpoint answers; a definitive answer ends the
/// session once with its reason named.
///
/// Needs the venv `.ci/run` makes (`.build/authlib-venv`, Authlib and Flask from PyPI). Without
/// it the tests are skipped locally, with the command that makes it; under CI (`CI` set) they fail.
@Suite(.measuresRealTime(filter: "AuthlibTests"), .loadGate(.realTime), .serialized)
struct AuthlibTests {
    static let python: String? = {
        if let named = ProcessInfo.processInfo.environment["POLICY_AUTHLIB_PYTHON"] { return named }
        var directory = URL(fileURLWithPath: #filePath)
        while directory.path != "/" {
            directory.deleteLastPathComponent()
            let candidate = directory.appendingPathComponent(".build/authlib-venv/bin/python")
            if FileManager.default.isExecutableFile(atPath: candidate.path) { return candidate.path }
            if FileManager.default.fileExists(atPath: directory.appendingPathComponent("Package.swift").path) { break }
        }
        return nil
    }()

    static var runs: Bool { python != nil || ProcessInfo.processInfo.environment["CI"] != nil }

    /// What a skipped test says: the commands that make the venv it needs (as `.ci/run` does).
    static let needsAuthlib = Comment(
        rawValue: "needs Authlib and Flask in .build/authlib-venv: python3 -m venv .build/authlib-venv && "
            + ".build/authlib-venv/bin/pip install 'authlib>=1.3,<2' 'flask>=3,<4'")

    struct Stats: Decodable {
        var tokenCalls: Int
        var issued: Int
        var refreshReused: Int
        var transientAnswers: Int
        var resets: Int
        var tokenResets: Int
        var cut: Int

        enum CodingKeys: String, CodingKey {
            case tokenCalls = "token_calls", issued, refreshReused = "refresh_reused"
            case transientAnswers = "transient_answers", resets, tokenResets = "token_resets", cut
        }
    }

    typealias Scenario = OAuth2Scenario

    static let healthy: [Scenario] = [
        Scenario(grant: "refresh_token", client: "basic", secret: "basic-secret", auth: "client_secret_basic"),
        Scenario(grant: "refresh_token", client: "post", secret: "post-secret", auth: "client_secret_post"),
        Scenario(grant: "client_credentials", client: "basic", secret: "basic-secret", auth: "client_secret_basic"),
        Scenario(grant: "client_credentials", client: "post", secret: "post-secret", auth: "client_secret_post"),
        Scenario(grant: "password", client: "basic", secret: "basic-secret", auth: "client_secret_basic"),
        Scenario(
            grant: "password", client: "spaced", secret: "secret with space", auth: "client_secret_basic",
            encoding: "raw"),
    ]

    @Test(.enabled(if: runs, Self.needsAuthlib), arguments: healthy)
    func manyExpiriesAtConcurrency64(_ scenario: Scenario) async throws {
        let python = try Self.requirePython()
        try await withFixtureServer("authlib_server", python: python, arguments: ["1", "0.02"]) { server in
            // Every 4th token call answers 503 temporarily_unavailable (Retry-After: 0).
            try await control(server, ["transient_every": 4, "retry_after": 0])
            let count = 1500
            let started = ContinuousClock.now
            let run = try await fetch(server, scenario, count: count)
            let elapsed = (ContinuousClock.now - started).seconds
            let stats = try await server.stats(Stats.self)
            run.expectEverythingDelivered(count)
            #expect(stats.refreshReused == 0, "a refresh token was presented twice")
            // One token call per token: tokens live 1 s and are refreshed ahead at half their
            // lifetime, so at most two a second, plus the sign-in (or the password grant this test
            // got the first refresh token from) and one in flight at the end; the transient
            // answers' retries (every 4th call) come on top.
            let perToken = 2 * Int(elapsed.rounded(.up)) + 2
            #expect(stats.issued <= perToken, "\(stats.issued) tokens in \(elapsed)s")
            #expect(stats.tokenCalls <= stats.issued + stats.transientAnswers + 1)
            print("AuthlibTests \(scenario.testDescription): \(count) requests in \(elapsed)s, \(stats)")
        }
    }

    /// The same through `URLSessionTransport` (`--transport urlsession`), whose token calls go on
    /// kept-alive connections that the server resets when they were idle 20 ms: a token call whose
    /// body FoundationNetworking lost is sent again whole, never short (a short form would be
    /// `invalid_request`: a logout), and no refresh token is presented twice.
    @Test(.enabled(if: runs, Self.needsAuthlib))
    func tokenCallsOverURLSessionSurviveResetsAtReuse() async throws {
        let python = try Self.requirePython()
        try await withFixtureServer("authlib_server", python: python, arguments: ["1", "0.02"]) { server in
            let scenario = Scenario(
                grant: "refresh_token", client: "basic", secret: "basic-secret", auth: "client_secret_basic")
            // About two seconds of requests: four token calls or more, each on a connection idle
            // since the last one (reset at reuse).
            let count = 5000
            let run = try await fetch(server, scenario, count: count, transport: "urlsession")
            let stats = try await server.stats(Stats.self)
            run.expectEverythingDelivered(count)
            #expect(stats.refreshReused == 0, "a refresh token was presented twice")
            #expect(stats.issued >= 3, "the run refreshed: \(stats)")
            // Token calls met the reset, or the test proves nothing.
            #expect(stats.tokenResets >= 1, "no token call met a reset at reuse: \(stats)")
            print("AuthlibTests URLSession: \(stats)")
        }
    }

    @Test(.enabled(if: runs, Self.needsAuthlib))
    func invalidGrantEndsTheSessionOnceWithTheReason() async throws {
        let python = try Self.requirePython()
        try await withFixtureServer("authlib_server", python: python, arguments: ["1", "0"]) { server in
            let scenario = Scenario(
                grant: "refresh_token", client: "basic", secret: "basic-secret", auth: "client_secret_basic")
            let run = try await fetch(server, scenario, count: 64, refreshToken: "not-a-refresh-token")
            let summary = run.summary
            #expect(run.status == 1)
            #expect(summary.contains("1 logout,"), "\(summary)")
            #expect(summary.contains("0 delivered"), "\(summary)")
            #expect(run.stdout.contains("invalid_grant"), "the reason is named")
            let stats = try await server.stats(Stats.self)
            #expect(stats.tokenCalls == 1, "a definitive answer is not retried")
        }
    }

    @Test(.enabled(if: runs, Self.needsAuthlib))
    func aWrongSecretEndsTheSessionOnceWithTheReasonAndTheEncodingHint() async throws {
        let python = try Self.requirePython()
        try await withFixtureServer("authlib_server", python: python, arguments: ["1", "0"]) { server in
            // The right secret, form-encoded for Basic: Authlib decodes it with `unquote`, so the
            // space sent as '+' stays a '+': invalid_client, and the reason says what to try.
            let scenario = Scenario(
                grant: "client_credentials", client: "spaced", secret: "secret with space",
                auth: "client_secret_basic")
            let run = try await fetch(server, scenario, count: 64)
            let summary = run.summary
            #expect(run.status == 1)
            #expect(summary.contains("1 logout,"), "\(summary)")
            #expect(run.stdout.contains("invalid_client"), "the reason is named")
            #expect(run.stdout.contains("client-auth-encoding: raw"))
            #expect(!run.stdout.contains("refresh.limit"))
            #expect(!run.stdout.contains("secret with space") && !run.stderr.contains("secret with space"))
            let stats = try await server.stats(Stats.self)
            #expect(stats.tokenCalls == 1, "a sign-in that cannot succeed is not hammered")
        }
    }

    // MARK: - Helpers

    static func requirePython() throws -> String {
        guard let python else {
            throw FixtureServer.Failure(
                description: "CI is set but the Authlib venv is missing: \(needsAuthlib.rawValue)")
        }
        return python
    }

    func control(_ server: FixtureServer, _ settings: [String: Int]) async throws {
        let body = try JSONSerialization.data(withJSONObject: settings)
        let response = try await URLSessionTransport(timeout: .seconds(10)).send(
            HTTPRequest(method: "POST", url: server.url("/_control"), body: body))
        #expect(response.status == 200)
    }

    /// A refresh token from Authlib's password grant, to start a refresh_token run from.
    func refreshToken(_ server: FixtureServer, _ scenario: Scenario) async throws -> String {
        // Issued to the scenario's client, as it authenticates (a refresh token is bound to it):
        // Authlib wants its id in the form with Basic credentials too.
        let id = scenario.auth == "client_secret_post" ? "" : "&client_id=\(scenario.client)"
        return try await scenario.passwordGrantRefreshToken(server.url("/oauth/token"), form: id)
    }

    /// `policy fetch` of `/api/me` `count` times, 64 at once, with the scenario's plugin settings.
    func fetch(
        _ server: FixtureServer, _ scenario: Scenario, count: Int, refreshToken given: String? = nil,
        transport: String? = nil
    ) async throws -> PolicyRun {
        var scenario = scenario
        if let transport { scenario.transport = transport }
        var token = given
        if scenario.grant == "refresh_token", token == nil { token = try await refreshToken(server, scenario) }
        return try await scenario.fetch(
            server.url("/api/me"), name: "authlib", tokenURL: server.url("/oauth/token"), prefix: "AUTHLIB_TEST",
            count: count, refreshToken: token, options: ["client-auth-encoding: \(scenario.encoding)"],
            dispatch: "dispatch: { max-in-flight-per-host: unlimited }")
    }
}

extension Duration {
    fileprivate var seconds: Double {
        Double(components.seconds) + Double(components.attoseconds) / 1e18
    }
}
