import Foundation
import ResponsePolicy
import Testing

@testable import ResponsePolicyURLSession

/// Redirects against two `test_server.py` processes on different ports of 127.0.0.1, so two
/// origins: `home` answers with a redirect, `elsewhere` records whatever reaches it. No
/// credential may reach `elsewhere`, whatever the authorizer and whatever the redirect status.
struct RedirectTests {
    static let statuses = [301, 302, 303, 307, 308]
    static let token = "tok-SECRET-4711"

    /// `authorize:` sections and where each puts the token.
    static let authorizers = [
        "{ use: bearer }",
        "{ use: header, with: { name: X-Auth-Token } }",
        "{ use: header, with: { name: Private-Token, prefix: 'Token ' } }",
        "{ use: query, with: { name: access_token } }",
    ]

    @Test(arguments: authorizers)
    func anAPIRedirectToAnotherOriginCarriesNoCredential(_ authorize: String) async throws {
        try await withTwoServers { home, elsewhere in
            let policy = try Policy.load(
                yaml: """
                    policy: 1
                    name: redirects
                    rules: []
                    authorize: \(authorize)
                    """, file: "redirects.yaml")
            let engine = PolicyEngine(
                policy: policy, transport: URLSessionTransport(timeout: .seconds(10)),
                credentials: MemoryCredentialStore(Credentials(accessToken: Self.token)))
            for status in Self.statuses {
                let target = elsewhere.url("/echo").absoluteString
                let start = home.url("/redirect?status=\(status)&to=\(formEncoded(target))")
                let response = try await engine.send(HTTPRequest(url: start))
                #expect(response.status == 200, "\(status) was followed")
            }
            // The token left for `home` (the authorizer did sign) and never for `elsewhere`.
            let sent = try await home.requests()
            #expect(sent.count == Self.statuses.count)
            #expect(sent.allSatisfy { $0.contains(Self.token) })
            let received = try await elsewhere.requests()
            #expect(received.count == Self.statuses.count)
            for request in received {
                #expect(!request.contains(Self.token), "\(request.description)")
            }
        }
    }

    @Test func aRedirectWithinTheOriginKeepsTheCredentials() async throws {
        try await withTwoServers { home, _ in
            let transport = URLSessionTransport(timeout: .seconds(10))
            for status in Self.statuses {
                var request = HTTPRequest(url: home.url("/redirect?status=\(status)&to=/echo"))
                request.headers.set("Authorization", "Bearer \(Self.token)")
                let response = try await transport.send(request)
                #expect(response.status == 200)
                #expect(String(decoding: response.body, as: UTF8.self).contains(Self.token))
            }
        }
    }

    @Test func everyCredentialHeaderIsDroppedAcrossOriginsAndHarmlessOnesKept() async throws {
        try await withTwoServers { home, elsewhere in
            let transport = URLSessionTransport(timeout: .seconds(10))
            let target = formEncoded(elsewhere.url("/echo").absoluteString)
            for status in [307, 308] {
                var request = HTTPRequest(
                    method: "PUT", url: home.url("/redirect?status=\(status)&to=\(target)"), body: Data("{}".utf8))
                for name in [
                    "Authorization", "Proxy-Authorization", "Cookie", "X-Api-Key", "X-Auth-Token", "Private-Token",
                    "X-Amz-Security-Token", "X-Custom-Session",
                ] {
                    request.headers.set(name, "\(name)-\(Self.token)")
                }
                request.headers.set("Accept", "application/json")
                request.headers.set("Content-Type", "application/json")
                let response = try await transport.send(request)
                #expect(response.status == 200)
            }
            let received = try await elsewhere.requests()
            #expect(received.map(\.method) == ["PUT", "PUT"], "307 and 308 keep the method")
            for request in received {
                #expect(!request.contains(Self.token))
                #expect(request.header("Accept") == "application/json")
                #expect(request.body == "{}")
            }
        }
    }

    @Test func postTurnsIntoGetOn301To303AndKeepsItsBodyOn307And308() async throws {
        try await withTwoServers { home, _ in
            let transport = URLSessionTransport(timeout: .seconds(10))
            for status in Self.statuses {
                let request = HTTPRequest(
                    method: "POST", url: home.url("/redirect?status=\(status)&to=/echo"), body: Data("x=1".utf8))
                _ = try await transport.send(request)
            }
            let echoed = try await home.requests().filter { $0.path == "/echo" }
            #expect(echoed.map(\.method) == ["GET", "GET", "GET", "POST", "POST"])
            #expect(echoed.map(\.body) == ["", "", "", "x=1", "x=1"])
        }
    }

    @Test func httpsToHTTPIsAnotherOriginSoADowngradeDropsCredentials() throws {
        let urls = try [
            "https://api.example.com/a", "http://api.example.com/a", "https://api.example.com:8443/a",
            "https://evil.example.com/a", "https://API.example.com:443/b",
        ].map { try #require(URL(string: $0)) }
        #expect(urls.map { RedirectRules.sameOrigin(urls[0], $0) } == [true, false, false, false, true])
        let headers: HTTPHeaders = ["Authorization": "Bearer x", "Accept": "*/*", "X-Whatever": "y"]
        #expect(Array(RedirectRules.headersSafeAcrossOrigins(headers)).map(\.name) == ["Accept"])
    }

    @Test func userInfoInALocationToAnotherOriginIsNotFollowed() throws {
        let request = HTTPRequest(url: try #require(URL(string: "https://api.example.com/a")))
        let response = HTTPResponse(status: 302, headers: ["Location": "https://user:pass@other.example.com/b?x=1"])
        let next = try #require(RedirectRules.redirect(from: request, response: response, original: request))
        #expect(next.url.absoluteString == "https://other.example.com/b?x=1")
        var none = request
        none.redirects = .none
        #expect(RedirectRules.redirect(from: none, response: response, original: none) == nil)
        let ftp = HTTPResponse(status: 302, headers: ["Location": "ftp://other.example.com/b"])
        #expect(RedirectRules.redirect(from: request, response: ftp, original: request) == nil)
    }

    @Test func aRedirectLoopEndsWithAConnectionError() async throws {
        try await withTwoServers { home, _ in
            let loop = home.url("/redirect?status=302&loop=1").absoluteString
            // A bound for a hang, not for speed: eleven round trips took over 10 s once, with two
            // `swift test` runs on the machine, and the call timed out before the redirect limit.
            let transport = URLSessionTransport(timeout: .seconds(60))
            let error = await #expect(throws: TransportError.self) {
                try await transport.send(HTTPRequest(url: try #require(URL(string: loop))))
            }
            #expect(error?.errorClass == .connection)
            #expect(error?.message.contains("more than 10 redirects") == true)
        }
    }

    // MARK: - Token and logout endpoints

    @Test(arguments: [RedirectPolicy.none, .sameOrigin])
    func anOAuth2TokenEndpointRedirectingElsewhereFailsTheRefreshAndSendsNothingThere(_ follow: RedirectPolicy)
        async throws
    {
        try await withTwoServers { home, elsewhere in
            let target = formEncoded(elsewhere.url("/oauth/token").absoluteString)
            for status in Self.statuses {
                var plugin = OAuth2Refresh(
                    tokenURL: home.url("/redirect?status=\(status)&to=\(target)"), clientID: "app",
                    clientSecret: "client-SECRET")
                plugin.followRedirects = follow
                let failure = try await refreshFailure(plugin)
                let expected =
                    follow == .none
                    ? "the token endpoint answered a redirect (\(status)), which is not followed; set 'follow-redirects: same-origin' to follow redirects within its origin"
                    : "the token endpoint answered a redirect (\(status)) to another origin, which is never followed"
                #expect(failure.reason == expected)
            }
            let got1 = try await elsewhere.requests()
            #expect(got1.isEmpty)
        }
    }

    @Test func anOAuth2TokenEndpointMayRedirectWithinItsOriginWhenThePolicySaysSo() async throws {
        try await withTwoServers { home, _ in
            for status in [307, 308] {
                var plugin = OAuth2Refresh(
                    tokenURL: home.url("/redirect?status=\(status)&to=/oauth/token"), clientID: "app")
                plugin.followRedirects = .sameOrigin
                let stats = try await home.stats()
                let refreshToken = try #require(stats.refreshToken)
                let credentials = try await plugin.refresh(
                    RefreshContext(
                        credentials: Credentials(accessToken: "old", refreshToken: refreshToken),
                        transport: URLSessionTransport(timeout: .seconds(10)), clock: SystemPolicyClock()))
                #expect(credentials.accessToken.hasPrefix("access-"))
                // And with the default, the same redirect is refused.
                plugin.followRedirects = .none
                _ = try await refreshFailure(plugin)
            }
        }
    }

    @Test(arguments: [RedirectPolicy.none, .sameOrigin])
    func anHTTPRefreshEndpointRedirectingElsewhereFailsTheRefreshAndSendsNothingThere(_ follow: RedirectPolicy)
        async throws
    {
        try await withTwoServers { home, elsewhere in
            let target = formEncoded(elsewhere.url("/echo").absoluteString)
            for status in Self.statuses {
                var plugin = try HTTPRefresh(
                    url: home.url("/redirect?status=\(status)&to=\(target)"),
                    headers: ["X-Api-Key": "key-SECRET"], token: "body.token")
                plugin.followRedirects = follow
                let failure = try await refreshFailure(plugin)
                #expect(failure.reason.contains("answered a redirect (\(status))"))
            }
            let got2 = try await elsewhere.requests()
            #expect(got2.isEmpty)
            let got3 = try await home.stats()
            #expect(got3.counters["redirect_calls"] == Self.statuses.count)
        }
    }

    @Test(arguments: [RedirectPolicy.none, .sameOrigin])
    func theHTTPLogoutPluginFollowsNoRedirectElsewhere(_ follow: RedirectPolicy) async throws {
        try await withTwoServers { home, elsewhere in
            let target = formEncoded(elsewhere.url("/logout").absoluteString)
            for status in Self.statuses {
                var plugin = HTTPLogout(url: home.url("/redirect?status=\(status)&to=\(target)"), timeout: .seconds(5))
                plugin.followRedirects = follow
                await plugin.logout(
                    LogoutContext(
                        requestID: "r1", reason: "forced-logout", credentials: Credentials(accessToken: Self.token),
                        transport: URLSessionTransport(timeout: .seconds(10))))
            }
            let got4 = try await elsewhere.requests()
            #expect(got4.isEmpty)
            let got5 = try await home.stats()
            #expect(got5.counters["redirect_calls"] == Self.statuses.count)
            // Within the origin, `same-origin` follows a 307 (which keeps the POST).
            var plugin = HTTPLogout(url: home.url("/redirect?status=307&to=/logout"))
            plugin.followRedirects = .sameOrigin
            await plugin.logout(
                LogoutContext(
                    requestID: nil, reason: "x", credentials: nil, transport: URLSessionTransport(timeout: .seconds(10))
                ))
            let got6 = try await home.stats()
            #expect(got6.counters["logout_calls"] == 1)
        }
    }

    @Test func followRedirectsIsCheckedByLint() throws {
        let yaml = """
            policy: 1
            name: x
            refresh:
              use: oauth2
              with: { token-url: "https://auth.example.com/token", client-id: app, follow-redirects: always }
            """
        let error = #expect(throws: PolicyError.self) { try Policy.load(yaml: yaml, file: "x.yaml") }
        #expect(
            error?.diagnostics.filter { $0.rule == "invalid-value" }.map(\.message) == [
                "'follow-redirects' must be one of 'same-origin', 'none', not 'always'"
            ])
        let good = yaml.replacingOccurrences(of: "always", with: "same-origin")
        #expect(throws: Never.self) { try Policy.load(yaml: good, file: "x.yaml") }
    }

    // MARK: - Helpers

    private func refreshFailure(
        _ plugin: some RefreshPlugin, sourceLocation: SourceLocation = #_sourceLocation
    ) async throws -> RefreshFailure {
        do {
            _ = try await plugin.refresh(
                RefreshContext(
                    credentials: Credentials(accessToken: "old", refreshToken: "refresh-0"),
                    transport: URLSessionTransport(timeout: .seconds(10)), clock: SystemPolicyClock()))
        } catch let failure as RefreshFailure {
            return failure
        }
        Issue.record("the refresh succeeded", sourceLocation: sourceLocation)
        throw TestServer.Failure(description: "no failure")
    }
}

/// One request as `/_requests` reports it.
struct ReceivedRequest: Decodable, CustomStringConvertible {
    var method: String
    var path: String
    var query: String
    var headers: [[String]]
    var body: String

    func contains(_ text: String) -> Bool {
        query.contains(text) || body.contains(text) || headers.contains { $0.joined(separator: ": ").contains(text) }
    }

    func header(_ name: String) -> String? {
        headers.first { $0.first?.lowercased() == name.lowercased() }?.last
    }

    var description: String { "\(method) \(path)?\(query) \(headers)" }
}

extension TestServer {
    func requests() async throws -> [ReceivedRequest] {
        let response = try await URLSessionTransport(timeout: .seconds(10)).send(HTTPRequest(url: url("/_requests")))
        return try JSONDecoder().decode([ReceivedRequest].self, from: response.body)
    }
}

/// Runs `body` with two servers, two origins on 127.0.0.1.
func withTwoServers(_ body: (TestServer, TestServer) async throws -> Void) async throws {
    try await withTestServer { home in
        try await withTestServer { elsewhere in try await body(home, elsewhere) }
    }
}

func formEncoded(_ text: String) -> String {
    text.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? text
}
