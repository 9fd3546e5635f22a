import Foundation
import ResponsePolicy
import TestGate
import Testing

@testable import ResponsePolicyURLSession

/// The `oauth2` plugin against a third authorization server nobody here wrote, and the first not
/// in Python: glewlwyd, a C OAuth2/OpenID Connect server, as Debian packages it
/// (`Fixtures/glewlwyd_server.py`: glewlwyd's own token endpoint, its OpenID Connect plugin with
/// one-use refresh tokens, access tokens living 1 s, secrets hashed as it stores them, a fresh
/// SQLite database from the package's init script), through the built `policy fetch` with 64
/// requests at once. What the Authlib and django-oauth-toolkit suites ask: one token call per
/// expiry, nobody logged out, everything delivered, no refresh token presented twice; a definitive
/// answer (a spent refresh token, a wrong secret) ends the session once, with the status named.
/// Where glewlwyd differs: its error answers have empty bodies (no RFC 6749 §5.2 `error`), so the
/// reason names the status and no code glewlwyd did not send; it does not form-decode a Basic
/// secret (a secret with a space is sent `client-auth-encoding: raw`); and it grants nothing
/// without a `scope`.
///
/// Needs glewlwyd from Debian (`.ci/run` installs it). Without it the tests are skipped locally,
/// with the command that installs it; under CI (`CI` set) they fail.
@Suite(.measuresRealTime(filter: "GlewlwydTests"), .loadGate(.realTime), .serialized)
struct GlewlwydTests {
    /// glewlwyd's binary and the package's SQLite init script, which the fixture starts from.
    static let installed: Bool = {
        let paths = (ProcessInfo.processInfo.environment["PATH"] ?? "").split(separator: ":").map(String.init)
        let binary = (paths + ["/usr/bin"]).contains {
            FileManager.default.isExecutableFile(atPath: "\($0)/glewlwyd")
        }
        return binary
            && FileManager.default.fileExists(atPath: "/usr/share/dbconfig-common/data/glewlwyd/install/sqlite3")
    }()

    static var runs: Bool { installed || ProcessInfo.processInfo.environment["CI"] != nil }

    static let needsGlewlwyd = Comment(
        rawValue: "needs glewlwyd from Debian: DEBIAN_FRONTEND=noninteractive apt-get install -y -qq glewlwyd")

    struct Stats: TokenServerStats {
        var tokenCalls: Int
        var issued: Int
        var refreshReused: Int
        var grants: [String: Int]
        var clientAuth: [String: Int]
        var tokenAnswers: [String: Int]
        var api: [String: Int]

        enum CodingKeys: String, CodingKey {
            case tokenCalls = "token_calls", issued, refreshReused = "refresh_reused", grants
            case clientAuth = "client_auth", tokenAnswers = "token_answers", api
        }
    }

    typealias Scenario = OAuth2Scenario

    static let healthy: [Scenario] = [
        Scenario(grant: "refresh_token", client: "basic", secret: "basic-secret", auth: "client_secret_basic"),
        Scenario(grant: "refresh_token", client: "post", secret: "post-secret", auth: "client_secret_post"),
        Scenario(
            grant: "refresh_token", client: "basic", secret: "basic-secret", auth: "client_secret_basic",
            transport: "urlsession"),
        Scenario(grant: "password", client: "basic", secret: "basic-secret", auth: "client_secret_basic"),
        // A space in the secret: glewlwyd takes the Basic secret as it comes, so it is sent raw.
        Scenario(
            grant: "password", client: "spaced", secret: "secret with space", auth: "client_secret_basic",
            encoding: "raw"),
        Scenario(grant: "client_credentials", client: "service", secret: "service-secret", auth: "client_secret_basic"),
    ]

    @Test(.enabled(if: runs, Self.needsGlewlwyd), arguments: healthy)
    func manyExpiriesAtConcurrency64(_ scenario: Scenario) async throws {
        try Self.requireGlewlwyd()
        try await withFixtureServer("glewlwyd_server", arguments: ["1"]) { server in
            let count = 10_000
            let run = { try await fetch(server, scenario, count: count) }
            let stats = try await scenario.expectManyExpiries(
                server, Stats.self, count: count, suite: "GlewlwydTests", fetch: run)
            // Every token call authenticated the client as the scenario says.
            let counted = scenario.auth == "client_secret_post" ? "post" : "basic"
            #expect(stats.clientAuth == [counted: stats.tokenCalls], "\(stats)")
        }
    }

    /// A refresh token another client (or process) already spent: glewlwyd answers 400 with an
    /// empty body, and the session ends once, with the status, after one token call. The reason
    /// names no OAuth error code: glewlwyd sent none.
    @Test(.enabled(if: runs, Self.needsGlewlwyd))
    func aSpentRefreshTokenEndsTheSessionOnceWithTheReason() async throws {
        try Self.requireGlewlwyd()
        try await withFixtureServer("glewlwyd_server", arguments: ["1"]) { server in
            let scenario = Scenario(
                grant: "refresh_token", client: "basic", secret: "basic-secret", auth: "client_secret_basic")
            let spent = try await refreshToken(server, scenario)
            let rotated = try await tokenCall(
                server, scenario, form: "grant_type=refresh_token&refresh_token=\(spent)")
            #expect(rotated.status == 200, "the test spent it")
            let renewed = try JSONSerialization.jsonObject(with: rotated.body) as? [String: Any]
            let next = renewed?["refresh_token"] as? String
            #expect(next != nil && next != spent, "glewlwyd rotated the refresh token")
            let before = try await server.stats(Stats.self)
            let run = try await fetch(server, scenario, count: 64, refreshToken: spent)
            let after = try await server.stats(Stats.self)
            let summary = run.summary
            #expect(run.status == 1, "\(summary)")
            #expect(summary.contains("1 logout,"), "\(summary)")
            #expect(summary.contains("0 delivered"), "\(summary)")
            #expect(after.tokenCalls - before.tokenCalls == 1, "a definitive answer is not asked again: \(after)")
            #expect(after.tokenAnswers["400"] == 1, "glewlwyd refused the spent token: \(after)")
            #expect(
                run.stdout.contains("the token endpoint answered 400"), "the reason: \(run.stdout.suffix(2000))")
            #expect(!run.stdout.contains("invalid_"), "no error code glewlwyd did not send")
            #expect(!run.stdout.contains(spent) && !run.stderr.contains(spent), "the refresh token is never printed")
        }
    }

    /// A wrong client secret: glewlwyd answers 403 (client credentials) or 400 (the refresh grant,
    /// client_secret_post), both with empty bodies: one token call, one logout with the status,
    /// nothing sent to the API, and the secret never printed. A secret with a space sent
    /// form-encoded (the plugin's default) is a wrong secret to glewlwyd.
    @Test(
        .enabled(if: runs, Self.needsGlewlwyd),
        arguments: [
            (
                Scenario(
                    grant: "client_credentials", client: "service", secret: "not-the-service-secret",
                    auth: "client_secret_basic"), 403
            ),
            (
                Scenario(
                    grant: "refresh_token", client: "post", secret: "not-the-post-secret", auth: "client_secret_post"),
                400
            ),
            (
                Scenario(
                    grant: "password", client: "spaced", secret: "secret with space", auth: "client_secret_basic"),
                400
            ),
        ])
    func aWrongSecretEndsTheSessionOnceWithTheReason(_ scenario: Scenario, status: Int) async throws {
        try Self.requireGlewlwyd()
        try await withFixtureServer("glewlwyd_server", arguments: ["1"]) { server in
            // The refresh grant starts from a live refresh token, taken with the right secret.
            var token: String?
            if scenario.grant == "refresh_token" {
                var right = scenario
                right.secret = "post-secret"
                token = try await refreshToken(server, right)
            }
            let before = try await server.stats(Stats.self)
            let run = try await fetch(server, scenario, count: 64, refreshToken: token)
            let stats = try await server.stats(Stats.self)
            let summary = run.summary
            #expect(run.status == 1, "\(summary)")
            #expect(summary.contains("1 logout,"), "\(summary)")
            #expect(
                stats.tokenCalls - before.tokenCalls == 1, "a sign-in that cannot succeed is not hammered: \(stats)")
            #expect(stats.tokenAnswers["\(status)"] == 1, "glewlwyd refused the secret with \(status): \(stats)")
            #expect(
                run.stdout.contains("the token endpoint answered \(status)"), "the reason: \(run.stdout.suffix(2000))")
            #expect(!run.stdout.contains("invalid_"), "no error code glewlwyd did not send")
            // The secret with a space, form-encoded: glewlwyd's bare 400 names no error, and the
            // reason says which option to try.
            #expect(
                run.stdout.contains("try 'client-auth-encoding: raw'") == (scenario.client == "spaced"),
                "the hint: \(run.stdout.suffix(2000))")
            #expect(stats.api["200"] == nil, "nothing delivered without a token: \(stats)")
            #expect(!run.stdout.contains(scenario.secret) && !run.stderr.contains(scenario.secret))
            if let token { #expect(!run.stdout.contains(token) && !run.stderr.contains(token)) }
        }
    }

    // MARK: - Helpers

    static func requireGlewlwyd() throws {
        guard installed else {
            throw FixtureServer.Failure(description: "CI is set but glewlwyd is missing: \(needsGlewlwyd.rawValue)")
        }
    }

    /// A token call made directly, as the scenario's client authenticates.
    func tokenCall(_ server: FixtureServer, _ scenario: Scenario, form: String) async throws -> HTTPResponse {
        try await scenario.tokenCall(server.url("/token"), form: form)
    }

    /// A refresh token from glewlwyd's password grant, to start a refresh_token run from.
    func refreshToken(_ server: FixtureServer, _ scenario: Scenario) async throws -> String {
        try await scenario.passwordGrantRefreshToken(server.url("/token"), form: "&scope=openid")
    }

    /// `policy fetch` of `/api/me` `count` times, 64 at once, with the scenario's plugin settings
    /// (and `scope: openid`: glewlwyd grants nothing without a scope).
    func fetch(
        _ server: FixtureServer, _ scenario: Scenario, count: Int, refreshToken given: String? = nil
    ) async throws -> PolicyRun {
        var token = given
        if scenario.grant == "refresh_token", token == nil { token = try await refreshToken(server, scenario) }
        var options = ["scope: openid"]
        if scenario.encoding != "form" { options.append("client-auth-encoding: \(scenario.encoding)") }
        return try await scenario.fetch(
            server.url("/api/me"), name: "glewlwyd", tokenURL: server.url("/token"), prefix: "GLEWLWYD_TEST",
            count: count, refreshToken: token, options: options)
    }
}
