import Foundation
import ResponsePolicy
import ResponsePolicyURLSession
import Testing

/// What `AuthlibTests`, `DjangoOAuthToolkitTests` and `GlewlwydTests` run: the built `policy fetch` of an API,
/// 64 requests at once, through the `oauth2` refresh plugin against a real authorization server.
struct OAuth2Fetch {
    /// The policy's `name:`, and a prefix for the temporary folder.
    var name: String
    var tokenURL: URL
    var grant: String
    var client: String
    var auth: String
    /// Further plugin options, one `key: value` line each (`client-auth-encoding: raw`).
    var options: [String] = []
    /// The variables the plugin reads its secrets from: the client secret's, and for the
    /// password grant the user's and the password's.
    var secretVariable: String
    var userVariable: String
    var passwordVariable: String
    /// The policy's `dispatch:` line, if any (the default, `auto`, otherwise).
    var dispatch: String?

    /// `policy fetch` of `api` `count` times, 64 at once; a `refresh_token` grant starts from
    /// `refreshToken` (stored with a stale access token); `transport` is `--transport`'s value.
    ///
    /// The servers issue 1 s tokens, so on a loaded machine one attempt can outlive a token whole.
    /// That logged a session out once in CI (`AuthlibTests.tokenCallsOverURLSessionSurviveResetsAtReuse`:
    /// 4 refreshes in 4 s, all answered 200, then "logged out by rule 'unauthorized'"): a request
    /// whose fresh token expired in flight twice used up `max-per-request: 1`, and `on-exhausted:
    /// logout` followed. The engine no longer counts a refusal of a token whose lifetime ended on
    /// the way (`RefreshSimulationTests.aTokenExpiredInFlightIsNotCountedAgainstMaxPerRequest`),
    /// but it times a lifetime from the answer's arrival, and the server from its issue: a token
    /// refused in between still counts. These suites test the plugin against real servers, not
    /// that margin, so a request here may wait for 3 refreshes and fails, rather than logging
    /// out, past them.
    func run(
        _ api: URL, count: Int, refreshToken: String?, transport: String?, environment: [String: String]
    ) async throws -> PolicyRun {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("\(name)-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        var lines = [
            "token-url: \(tokenURL.absoluteString)", "grant: \(grant)", "client-id: \(client)",
            "client-secret-env: \(secretVariable)", "client-auth: \(auth)",
        ]
        lines += options
        if grant == "password" { lines += ["username-env: \(userVariable)", "password-env: \(passwordVariable)"] }
        let policy = """
            policy: 1
            name: \(name)
            rules:
              - { name: unauthorized, when: { status: [401] }, then: refresh }
              - { name: transient, when: { status: [502, 503, 504], error: [timeout, connection] }, then: retry }
            refresh:
              use: oauth2
              max-per-request: 3
              on-exhausted: fail
              with:
            \(lines.map { "    " + $0 + "\n" }.joined())retry: { initial: 50ms, max-delay: 500ms, attempt-timeout: 5s }
            \(dispatch ?? "")

            """
        let policyFile = directory.appendingPathComponent("policy.yaml")
        try Data(policy.utf8).write(to: policyFile)
        var arguments = [
            "fetch", "--policy", policyFile.path, "--concurrency", "64", "--count", "\(count)", api.absoluteString,
        ]
        if let transport { arguments.insert(contentsOf: ["--transport", transport], at: 1) }
        if grant == "refresh_token" {
            let credentials = directory.appendingPathComponent("credentials.json")
            try Data(#"{"access_token": "stale", "refresh_token": "\#(refreshToken ?? "")"}"#.utf8).write(
                to: credentials)
            try FileManager.default.setAttributes([.posixPermissions: 0o600], ofItemAtPath: credentials.path)
            arguments.insert(contentsOf: ["--credentials", credentials.path], at: 1)
        }
        return try await runPolicy(arguments, environment: environment)
    }
}

extension PolicyRun {
    /// The line `policy fetch` ends with (`N delivered, N failed, N logged out; …`).
    var summary: String { stdout.split(separator: "\n").last.map(String.init) ?? "" }

    /// Expects a run that exited 0 with all `count` requests delivered and nobody logged out.
    func expectEverythingDelivered(_ count: Int, sourceLocation: SourceLocation = #_sourceLocation) {
        #expect(status == 0, "\(summary)\n\(stderr.suffix(2000))", sourceLocation: sourceLocation)
        #expect(
            summary.contains("\(count) delivered, 0 failed, 0 logged out"), "\(summary)", sourceLocation: sourceLocation
        )
        #expect(summary.contains("0 logouts"), "\(summary)", sourceLocation: sourceLocation)
    }
}

/// One scenario of the suites against real authorization servers: a grant, a client and how it
/// authenticates, and the transport `policy fetch` uses.
struct OAuth2Scenario: Sendable, CustomTestStringConvertible {
    var grant: String
    var client: String
    var secret: String
    var auth: String
    /// `client-auth-encoding:`, `form` (the plugin's default) or `raw`.
    var encoding: String = "form"
    /// `--transport`'s value; `nil` for `policy fetch`'s default.
    var transport: String?

    var testDescription: String {
        "\(grant) as \(client) (\(auth), \(encoding)) over \(transport ?? "the default transport")"
    }

    /// A token call made directly to `url`, the client authenticating as the scenario says.
    func tokenCall(_ url: URL, form: String) async throws -> HTTPResponse {
        var body = form
        var headers: HTTPHeaders = ["Content-Type": "application/x-www-form-urlencoded"]
        if auth == "client_secret_post" {
            body +=
                "&client_id=\(client)&client_secret="
                + (secret.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? "")
        } else {
            headers.set("Authorization", "Basic " + Data("\(client):\(secret)".utf8).base64EncodedString())
        }
        return try await URLSessionTransport(timeout: .seconds(10)).send(
            HTTPRequest(method: "POST", url: url, headers: headers, body: Data(body.utf8)))
    }

    /// A refresh token from the server's password grant (alice, wonderland), issued to the
    /// scenario's client, to start a refresh_token run from; `form` adds fields (a scope).
    func passwordGrantRefreshToken(_ url: URL, form: String = "") async throws -> String {
        let response = try await tokenCall(url, form: "grant_type=password&username=alice&password=wonderland" + form)
        let object = try JSONSerialization.jsonObject(with: response.body) as? [String: Any]
        guard let token = object?["refresh_token"] as? String else {
            throw FixtureServer.Failure(description: "no refresh token from the password grant: \(response.status)")
        }
        return token
    }

    /// `policy fetch` of `api` `count` times, 64 at once, through the `oauth2` plugin with the
    /// scenario's grant, client and transport; the secrets in variables named `<prefix>_SECRET`,
    /// `<prefix>_USER` and `<prefix>_PASSWORD`.
    func fetch(
        _ api: URL, name: String, tokenURL: URL, prefix: String, count: Int, refreshToken: String?,
        options: [String] = [], dispatch: String? = nil
    ) async throws -> PolicyRun {
        let fetch = OAuth2Fetch(
            name: name, tokenURL: tokenURL, grant: grant, client: client, auth: auth, options: options,
            secretVariable: "\(prefix)_SECRET", userVariable: "\(prefix)_USER", passwordVariable: "\(prefix)_PASSWORD",
            dispatch: dispatch)
        return try await fetch.run(
            api, count: count, refreshToken: refreshToken, transport: transport,
            environment: ["\(prefix)_SECRET": secret, "\(prefix)_USER": "alice", "\(prefix)_PASSWORD": "wonderland"])
    }
}

/// What the real servers' fixtures count alike in `/_stats`.
protocol TokenServerStats: Decodable, Sendable {
    var tokenCalls: Int { get }
    /// Tokens the server issued.
    var issued: Int { get }
    /// Refresh tokens presented again after they were spent.
    var refreshReused: Int { get }
    /// Token calls by grant type, token answers by status, API answers by status.
    var grants: [String: Int] { get }
    var tokenAnswers: [String: Int] { get }
    var api: [String: Int] { get }
}

extension OAuth2Scenario {
    /// Runs `fetch` (`count` requests through a server whose tokens live 1 s), then expects of
    /// the run and the server's `/_stats`: every request delivered once, nobody logged out, no
    /// refresh token presented twice, every token call answered 200 and made for a token, each by
    /// the scenario's own grant, and at most two tokens a second (refreshed ahead at half their
    /// lifetime) plus the first and one in flight at the end. Returns the stats.
    func expectManyExpiries<Stats: TokenServerStats>(
        _ server: FixtureServer, _ type: Stats.Type, count: Int, suite: String,
        fetch: () async throws -> PolicyRun
    ) async throws -> Stats {
        let started = ContinuousClock.now
        let run = try await fetch()
        let elapsed = ContinuousClock.now - started
        let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
        let stats = try await server.stats(Stats.self)
        run.expectEverythingDelivered(count)
        #expect(stats.refreshReused == 0, "a refresh token was presented twice: \(stats)")
        #expect(stats.tokenAnswers.keys.sorted() == ["200"], "every token call succeeded: \(stats)")
        #expect(stats.api["200"] == count, "every request delivered once: \(stats)")
        // The first token: the sign-in, or the password grant the test took the first refresh
        // token from.
        #expect(stats.issued <= 2 * Int(seconds.rounded(.up)) + 2, "\(stats.issued) tokens in \(seconds) s")
        #expect(stats.issued >= 2, "the run outlived a token: \(stats)")
        #expect(stats.tokenCalls == stats.issued, "no token call but for a token: \(stats)")
        // The password grant signs in again at each expiry (as documented); the others never
        // sign in again by password.
        let own = grant == "refresh_token" ? stats.tokenCalls - 1 : stats.tokenCalls
        #expect(stats.grants[grant] == own, "\(stats)")
        print("\(suite) \(testDescription): \(count) requests in \(seconds) s, \(stats)")
        return stats
    }
}
