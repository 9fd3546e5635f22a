import Foundation
import ResponsePolicy
import TestGate
import Testing

@testable import ResponsePolicyURLSession

/// The `oauth2` plugin against a second authorization server nobody here wrote:
/// django-oauth-toolkit, Django's most used one (`Fixtures/dot_server.py`: the toolkit's own token
/// endpoint and its defaults, refresh tokens rotating, access tokens living 1 s, secrets hashed as
/// it stores them), through the built `policy fetch` with 64 requests at once. What
/// `AuthlibTests` asks of Authlib: one token call per expiry, nobody logged out, everything
/// delivered, no refresh token presented twice; a definitive answer (a spent refresh token, a
/// wrong secret) ends the session once, with the server's reason named. And where the two
/// servers differ: the toolkit reads a Basic secret with `unquote_plus`, so a secret with a space
/// works form-encoded (the plugin's default), where Authlib needs `client-auth-encoding: raw`.
///
/// Needs Django and django-oauth-toolkit in the venv `.ci/run` makes (`.build/authlib-venv`).
/// Without them the tests are skipped locally, with the command that adds them; under CI (`CI`
/// set) they fail.
@Suite(.measuresRealTime(filter: "DjangoOAuthToolkitTests"), .loadGate(.realTime), .serialized)
struct DjangoOAuthToolkitTests {
    /// The venv's Python when it has the toolkit.
    static let python: String? = {
        guard let python = AuthlibTests.python else { return nil }
        let process = Process()
        process.executableURL = URL(fileURLWithPath: python)
        process.arguments = ["-c", "import django, oauth2_provider"]
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        guard (try? process.run()) != nil else { return nil }
        process.waitUntilExit()
        return process.terminationStatus == 0 ? python : nil
    }()

    static var runs: Bool { python != nil || ProcessInfo.processInfo.environment["CI"] != nil }

    static let needsToolkit = Comment(
        rawValue:
            "needs Django and django-oauth-toolkit in .build/authlib-venv: python3 -m venv .build/authlib-venv && "
            + ".build/authlib-venv/bin/pip install 'authlib>=1.3,<2' 'flask>=3,<4' 'django>=4.2,<6' "
            + "'django-oauth-toolkit>=2,<4'")

    struct Stats: TokenServerStats {
        var tokenCalls: Int
        var issued: Int
        var refreshReused: Int
        var grants: [String: Int]
        var tokenAnswers: [String: Int]
        var api: [String: Int]
        var resets: Int
        var tokenResets: Int
        var cut: Int

        enum CodingKeys: String, CodingKey {
            case tokenCalls = "token_calls", issued, refreshReused = "refresh_reused", grants
            case tokenAnswers = "token_answers", api, resets, tokenResets = "token_resets", cut
        }
    }

    typealias Scenario = OAuth2Scenario

    static let healthy: [Scenario] = [
        Scenario(grant: "refresh_token", client: "basic", secret: "basic-secret", auth: "client_secret_basic"),
        Scenario(grant: "refresh_token", client: "post", secret: "post-secret", auth: "client_secret_post"),
        Scenario(
            grant: "refresh_token", client: "basic", secret: "basic-secret", auth: "client_secret_basic",
            transport: "urlsession"),
        // A space in the secret, form-encoded (the default): the toolkit decodes it.
        Scenario(grant: "password", client: "spaced", secret: "secret with space", auth: "client_secret_basic"),
        Scenario(grant: "client_credentials", client: "service", secret: "service-secret", auth: "client_secret_basic"),
    ]

    @Test(.enabled(if: runs, Self.needsToolkit), arguments: healthy)
    func manyExpiriesAtConcurrency64(_ scenario: Scenario) async throws {
        let python = try Self.requirePython()
        try await withFixtureServer("dot_server", python: python, arguments: ["1"]) { server in
            let count = 1500
            let run = { try await fetch(server, scenario, count: count) }
            _ = try await scenario.expectManyExpiries(
                server, Stats.self, count: count, suite: "DjangoOAuthToolkitTests", fetch: run)
        }
    }

    /// Where keep-alive resets meet rotation: every connection idle for 20 ms is reset when it is
    /// reused, unanswered, and the toolkit's reuse protection is on (a spent refresh token
    /// presented again revokes its whole family, and the session with it). Over either transport,
    /// a request or token call lost to a reset is sent again whole, a token call never presents a
    /// spent token, everything is delivered and nobody is logged out.
    @Test(.enabled(if: runs, Self.needsToolkit), arguments: ["curl", "urlsession"])
    func resetsAtReuseUnderReuseProtection(_ transport: String) async throws {
        let python = try Self.requirePython()
        try await withFixtureServer("dot_server", python: python, arguments: ["1", "0.02", "1"]) { server in
            let scenario = Scenario(
                grant: "refresh_token", client: "basic", secret: "basic-secret", auth: "client_secret_basic",
                transport: transport)
            let count = 3000
            let run = try await fetch(server, scenario, count: count)
            let stats = try await server.stats(Stats.self)
            run.expectEverythingDelivered(count)
            #expect(stats.refreshReused == 0, "a refresh token was presented twice: \(stats)")
            #expect(stats.tokenAnswers.keys.sorted() == ["200"], "every token call the server read succeeded: \(stats)")
            #expect(stats.api["200"] == count, "every request delivered once: \(stats)")
            #expect(stats.issued >= 3, "the run refreshed: \(stats)")
            if transport == "curl" {
                // libcurl rewinds a body it sends again; FoundationNetworking sends a body-less copy
                // after a reset, which URLSessionTransport closes and sends again whole (the
                // server drops the short copy unread: `cut`, never a presentation).
                #expect(stats.cut == 0, "no body came short: \(stats)")
            }
            // Requests met the reset, or the test proves nothing.
            #expect(stats.resets >= 1, "no request met a reset at reuse: \(stats)")
            print("DjangoOAuthToolkitTests resets over \(transport): \(stats)")
        }
    }

    /// A refresh token another client (or process) already spent: the toolkit answers
    /// `invalid_grant`, and the session ends once, with the reason, after one token call.
    @Test(.enabled(if: runs, Self.needsToolkit))
    func aSpentRefreshTokenEndsTheSessionOnceWithTheReason() async throws {
        let python = try Self.requirePython()
        try await withFixtureServer("dot_server", python: python, arguments: ["1"]) { server in
            let scenario = Scenario(
                grant: "refresh_token", client: "basic", secret: "basic-secret", auth: "client_secret_basic")
            let spent = try await refreshToken(server, scenario)
            let rotated = try await tokenCall(
                server, scenario, form: "grant_type=refresh_token&refresh_token=\(spent)")
            #expect(rotated.status == 200, "the test spent it")
            let before = try await server.stats(Stats.self)
            let run = try await fetch(server, scenario, count: 64, refreshToken: spent)
            let after = try await server.stats(Stats.self)
            let summary = run.summary
            #expect(run.status == 1, "\(summary)")
            #expect(summary.contains("1 logout,"), "\(summary)")
            #expect(summary.contains("0 delivered"), "\(summary)")
            #expect(run.stdout.contains("invalid_grant"), "the reason is named")
            #expect(after.tokenCalls - before.tokenCalls == 1, "a definitive answer is not asked again: \(after)")
            #expect(!run.stdout.contains(spent) && !run.stderr.contains(spent), "the refresh token is never printed")
        }
    }

    /// A wrong client secret: `invalid_client` (401 from the toolkit), one token call, one logout
    /// with the reason, and the secret never printed.
    @Test(.enabled(if: runs, Self.needsToolkit))
    func aWrongSecretEndsTheSessionOnceWithTheReason() async throws {
        let python = try Self.requirePython()
        try await withFixtureServer("dot_server", python: python, arguments: ["1"]) { server in
            let scenario = Scenario(
                grant: "client_credentials", client: "service", secret: "not-the-service-secret",
                auth: "client_secret_basic")
            let run = try await fetch(server, scenario, count: 64)
            let stats = try await server.stats(Stats.self)
            let summary = run.summary
            #expect(run.status == 1, "\(summary)")
            #expect(summary.contains("1 logout,"), "\(summary)")
            #expect(run.stdout.contains("invalid_client"), "the reason is named")
            #expect(stats.tokenCalls == 1, "a sign-in that cannot succeed is not hammered: \(stats)")
            #expect(stats.api.isEmpty, "no request went out without a token: \(stats)")
            #expect(!run.stdout.contains(scenario.secret) && !run.stderr.contains(scenario.secret))
        }
    }

    // MARK: - Helpers

    static func requirePython() throws -> String {
        guard let python else {
            throw FixtureServer.Failure(
                description: "CI is set but the toolkit's venv is missing: \(needsToolkit.rawValue)")
        }
        return python
    }

    /// A token call made directly, as the scenario's client authenticates.
    func tokenCall(_ server: FixtureServer, _ scenario: Scenario, form: String) async throws -> HTTPResponse {
        try await scenario.tokenCall(server.url("/o/token/"), form: form)
    }

    /// A refresh token from the toolkit's password grant, to start a refresh_token run from.
    func refreshToken(_ server: FixtureServer, _ scenario: Scenario) async throws -> String {
        try await scenario.passwordGrantRefreshToken(server.url("/o/token/"))
    }

    /// `policy fetch` of `/api/me` `count` times, 64 at once, with the scenario's plugin settings.
    func fetch(
        _ server: FixtureServer, _ scenario: Scenario, count: Int, refreshToken given: String? = nil
    ) async throws -> PolicyRun {
        var token = given
        if scenario.grant == "refresh_token", token == nil { token = try await refreshToken(server, scenario) }
        return try await scenario.fetch(
            server.url("/api/me"), name: "django-oauth-toolkit", tokenURL: server.url("/o/token/"),
            prefix: "DOT_TEST", count: count, refreshToken: token)
    }
}
