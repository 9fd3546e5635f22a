import Foundation
import Testing

@testable import ResponsePolicy

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// Unit tests of the built-in network plugins (`oauth2`, `http` refresh, `http` logout) and the
/// `file` store, over an in-memory transport. The same plugins run against a real server in
/// `ResponsePolicyURLSessionTests/EngineIntegrationTests`.
struct NetworkPluginTests {
    static let tokenURL = URL(string: "https://auth.example.com/oauth/token") ?? URL(fileURLWithPath: "/")
    static let refreshURL = URL(string: "https://api.example.com/auth/refresh") ?? URL(fileURLWithPath: "/")
    static let epoch = VirtualClock.epoch

    // MARK: - Form encoding

    struct FormCase: Sendable, CustomTestStringConvertible {
        var text: String
        var encoded: String
        var testDescription: String { text.debugDescription }
    }

    @Test(arguments: [
        FormCase(text: "abcXYZ019", encoded: "abcXYZ019"),
        FormCase(text: "*-._", encoded: "*-._"),
        FormCase(text: "a b", encoded: "a+b"),
        FormCase(text: "a+b", encoded: "a%2Bb"),
        FormCase(text: "k=v&x", encoded: "k%3Dv%26x"),
        FormCase(text: "/?#[]@!$'(),;:~%", encoded: "%2F%3F%23%5B%5D%40%21%24%27%28%29%2C%3B%3A%7E%25"),
        FormCase(text: "é€", encoded: "%C3%A9%E2%82%AC"),
        FormCase(text: "line\nbreak", encoded: "line%0Abreak"),
    ])
    func formEncodingFollowsTheURLStandard(_ testCase: FormCase) {
        #expect(FormEncoding.encode(testCase.text) == testCase.encoded)
    }

    // MARK: - oauth2

    @Test func oauth2PostsTheRefreshTokenGrantFormEncoded() async throws {
        let transport = FakeTransport([.json(200, #"{"access_token":"new","token_type":"Bearer"}"#)])
        let plugin = OAuth2Refresh(tokenURL: Self.tokenURL, clientID: "my app", scope: "read write")
        _ = try await plugin.refresh(context(Credentials(accessToken: "old", refreshToken: "r+t/=&1"), transport))

        let sent = try #require(transport.requests.first)
        #expect(transport.requests.count == 1)
        #expect(sent.method == "POST")
        #expect(sent.url == Self.tokenURL)
        #expect(sent.headers["Content-Type"] == "application/x-www-form-urlencoded")
        #expect(sent.headers["Accept"] == "application/json")
        #expect(sent.headers["Authorization"] == nil, "a public client sends no Authorization")
        #expect(
            String(decoding: sent.body ?? Data(), as: UTF8.self)
                == "grant_type=refresh_token&refresh_token=r%2Bt%2F%3D%261&client_id=my+app&scope=read+write")
    }

    @Test func oauth2SendsTheClientSecretWithHTTPBasicNotInTheBody() async throws {
        let transport = FakeTransport([.json(200, #"{"access_token":"new"}"#)])
        let plugin = OAuth2Refresh(tokenURL: Self.tokenURL, clientID: "app:1", clientSecret: "p@ss word")
        _ = try await plugin.refresh(context(Credentials(accessToken: "old", refreshToken: "rt"), transport))

        let sent = try #require(transport.requests.first)
        // RFC 6749 §2.3.1: client id and secret are form-encoded, then joined by ':' and base64-encoded.
        let expected = "Basic " + Data("app%3A1:p%40ss+word".utf8).base64EncodedString()
        #expect(sent.headers["Authorization"] == expected)
        let body = String(decoding: sent.body ?? Data(), as: UTF8.self)
        #expect(body == "grant_type=refresh_token&refresh_token=rt&client_id=app%3A1")
        #expect(!body.contains("client_secret"))
    }

    @Test func oauth2ReadsTokensAndComputesExpiryOnTheEngineClock() async throws {
        let transport = FakeTransport([
            .json(200, #"{"access_token":"a2","token_type":"Bearer","expires_in":3600,"refresh_token":"r2"}"#)
        ])
        let plugin = OAuth2Refresh(tokenURL: Self.tokenURL, clientID: "app")
        let fresh = try await plugin.refresh(context(Credentials(accessToken: "a1", refreshToken: "r1"), transport))
        #expect(fresh == Credentials(accessToken: "a2", refreshToken: "r2", expiresAt: Self.epoch + 3600))
    }

    struct AnswerCase: Sendable, CustomTestStringConvertible {
        var name: String
        var body: String
        var expected: Credentials
        var testDescription: String { name }
    }

    @Test(arguments: [
        AnswerCase(
            name: "no refresh_token keeps the old one", body: #"{"access_token":"a2","token_type":"bearer"}"#,
            expected: Credentials(accessToken: "a2", refreshToken: "r1")),
        AnswerCase(
            name: "null refresh_token keeps the old one", body: #"{"access_token":"a2","refresh_token":null}"#,
            expected: Credentials(accessToken: "a2", refreshToken: "r1")),
        AnswerCase(
            name: "a rotated refresh_token replaces it", body: #"{"access_token":"a2","refresh_token":"r2"}"#,
            expected: Credentials(accessToken: "a2", refreshToken: "r2")),
        AnswerCase(
            name: "expires_in as a quoted number", body: #"{"access_token":"a2","expires_in":"120"}"#,
            expected: Credentials(accessToken: "a2", refreshToken: "r1", expiresAt: VirtualClock.epoch + 120)),
        AnswerCase(
            name: "unknown fields are ignored", body: #"{"access_token":"a2","id_token":"x","scope":"s"}"#,
            expected: Credentials(accessToken: "a2", refreshToken: "r1")),
    ])
    func oauth2Answers(_ testCase: AnswerCase) async throws {
        let transport = FakeTransport([.json(200, testCase.body)])
        let plugin = OAuth2Refresh(tokenURL: Self.tokenURL, clientID: "app")
        let fresh = try await plugin.refresh(context(Credentials(accessToken: "a1", refreshToken: "r1"), transport))
        #expect(fresh == testCase.expected)
    }

    struct FailureCase: Sendable, CustomTestStringConvertible {
        var name: String
        var status: Int
        var body: String
        var reason: String
        var testDescription: String { name }
    }

    @Test(arguments: [
        FailureCase(
            name: "invalid_grant", status: 400,
            body: #"{"error":"invalid_grant","error_description":"refresh token r1 was revoked"}"#,
            reason: "the token endpoint answered 400 (invalid_grant)"),
        FailureCase(
            name: "invalid_client", status: 401, body: #"{"error":"invalid_client"}"#,
            reason: "the token endpoint answered 401 (invalid_client)"),
        FailureCase(
            name: "a server error without JSON", status: 503, body: "busy",
            reason: "the token endpoint answered 503"),
        FailureCase(
            name: "an implausible error code is not shown", status: 400, body: #"{"error":"r1 <script>"}"#,
            reason: "the token endpoint answered 400"),
        FailureCase(
            name: "malformed JSON", status: 200, body: #"{"access_token":"#,
            reason: "the token endpoint's answer is not a JSON object"),
        FailureCase(
            name: "no access_token", status: 200, body: #"{"token_type":"Bearer"}"#,
            reason: "the token endpoint's answer has no 'access_token'"),
    ])
    func oauth2FailuresCarryTheResponse(_ testCase: FailureCase) async throws {
        let answer = HTTPResponse(status: testCase.status, body: Data(testCase.body.utf8))
        let transport = FakeTransport([.response(answer)])
        let plugin = OAuth2Refresh(tokenURL: Self.tokenURL, clientID: "app")
        let failure = await #expect(throws: RefreshFailure.self) {
            try await plugin.refresh(context(Credentials(accessToken: "a1", refreshToken: "r1"), transport))
        }
        #expect(failure == RefreshFailure(testCase.reason, response: answer))
    }

    /// Basic credentials that form-encoding changes, refused: the reason says which option to try
    /// (never the secret). A refusal names `invalid_client`, is a 401, or is a 400 or 403 naming no
    /// error at all (glewlwyd's empty answers); another error (`invalid_grant`) or a 5xx is not about
    /// the credentials, and a secret the encoding leaves alone needs no hint.
    @Test(arguments: [
        (400, "", "p@ss word", true), (403, "", "p@ss word", true), (401, "", "p@ss word", true),
        (400, #"{"error":"invalid_client"}"#, "p@ss word", true),
        (400, #"{"error":"invalid_grant"}"#, "p@ss word", false), (503, "", "p@ss word", false),
        (400, "", "plain-secret", false),
    ])
    func oauth2HintsAtTheEncodingWhenBasicCredentialsAreRefused(
        _ status: Int, _ body: String, _ secret: String, _ hinted: Bool
    ) async throws {
        let answer = HTTPResponse(status: status, body: Data(body.utf8))
        let plugin = OAuth2Refresh(tokenURL: Self.tokenURL, clientID: "app", clientSecret: secret)
        let failure = await #expect(throws: RefreshFailure.self) {
            try await plugin.refresh(
                context(Credentials(accessToken: "a1", refreshToken: "r1"), FakeTransport([.response(answer)])))
        }
        let reason = failure?.reason ?? ""
        #expect(reason.hasPrefix("the token endpoint answered \(status)"), "\(reason)")
        #expect(reason.contains("try 'client-auth-encoding: raw'") == hinted, "\(reason)")
        #expect(!reason.contains(secret) && !reason.contains("p%40ss"), "\(reason)")
    }

    struct OddCase: Sendable, CustomTestStringConvertible {
        var name: String
        var body: String
        var expected: Credentials
        var report: String?
        var testDescription: String { name }
    }

    /// A 2xx answer with an access token is a pair the server issued (with rotation, the old
    /// refresh token is spent): kept whatever else in it is odd, the oddity reported (SPEC "The
    /// refresh token is irreplaceable").
    @Test(arguments: [
        OddCase(
            name: "expires_in a word", body: #"{"access_token":"a2","refresh_token":"r2","expires_in":"soon"}"#,
            expected: Credentials(accessToken: "a2", refreshToken: "r2"),
            report:
                "the token endpoint's 'expires_in' (a text of 4 characters) is not a usable number of seconds; the new"
                + " token's lifetime is unknown, so it is used until the server refuses it"),
        OddCase(
            name: "expires_in 2^32", body: #"{"access_token":"a2","refresh_token":"r2","expires_in":4294967296}"#,
            expected: Credentials(accessToken: "a2", refreshToken: "r2"),
            report:
                "the token endpoint's 'expires_in' (4294967296) is not a usable number of seconds; the new token's"
                + " lifetime is unknown, so it is used until the server refuses it"),
        OddCase(
            name: "expires_in negative", body: #"{"access_token":"a2","refresh_token":"r2","expires_in":-5}"#,
            expected: Credentials(accessToken: "a2", refreshToken: "r2"),
            report:
                "the token endpoint's 'expires_in' (-5) is not a usable number of seconds; the new token's lifetime is"
                + " unknown, so it is used until the server refuses it"),
        OddCase(
            name: "expires_in 1e18", body: #"{"access_token":"a2","refresh_token":"r2","expires_in":1e18}"#,
            expected: Credentials(accessToken: "a2", refreshToken: "r2"), report: nil),
        OddCase(
            name: "refresh_token not a text", body: #"{"access_token":"a2","refresh_token":7}"#,
            expected: Credentials(accessToken: "a2", refreshToken: "r1"),
            report: "the token endpoint's 'refresh_token' is not a text; the refresh token held is kept"),
    ])
    func oauth2KeepsThePairOfAnOddAnswer(_ testCase: OddCase) async throws {
        let transport = FakeTransport([.json(200, testCase.body)])
        let plugin = OAuth2Refresh(tokenURL: Self.tokenURL, clientID: "app")
        let reports = Locked<[String]>([])
        let fresh = try await plugin.refresh(
            RefreshContext(
                credentials: Credentials(accessToken: "a1", refreshToken: "r1"), transport: transport,
                clock: VirtualClock(), report: { text in reports.withLock { $0.append(text) } }))
        #expect(fresh == testCase.expected)
        let said = reports.withLock { $0 }
        if let report = testCase.report {
            #expect(said == [report])
        } else {
            #expect(said.count == 1 && said[0].contains("is not a usable number of seconds"), "\(said)")
        }
    }

    /// A token type the authorizer does not send is refused (RFC 6749 §7.1), and the pair that came
    /// with it is handed back to be kept; the authorizer's own type (any case) is accepted.
    @Test func oauth2RefusesATokenTypeTheAuthorizerDoesNotSendAndKeepsThePair() async throws {
        let plugin = OAuth2Refresh(tokenURL: Self.tokenURL, clientID: "app")
        let body = #"{"access_token":"a2","refresh_token":"r2","token_type":"mac"}"#
        let failure = await #expect(throws: RefreshFailure.self) {
            try await plugin.refresh(
                context(Credentials(accessToken: "a1", refreshToken: "r1"), FakeTransport([.json(200, body)])))
        }
        #expect(failure?.keeping == Credentials(accessToken: "a2", refreshToken: "r2"))
        #expect(failure?.isDefinitive == false)
        #expect(failure?.reason.contains("of type 'mac'") == true, "\(failure?.reason ?? "")")
        let mac = try await plugin.refresh(
            RefreshContext(
                credentials: Credentials(accessToken: "a1", refreshToken: "r1"),
                transport: FakeTransport([.json(200, body)]), clock: VirtualClock(), tokenType: "MAC"))
        #expect(mac == Credentials(accessToken: "a2", refreshToken: "r2"))
        let bearer = try await plugin.refresh(
            context(
                Credentials(accessToken: "a1", refreshToken: "r1"),
                FakeTransport([.json(200, #"{"access_token":"a3","token_type":"bEaReR"}"#)])))
        #expect(bearer == Credentials(accessToken: "a3", refreshToken: "r1"))
    }

    /// A server that puts a token where a type or a lifetime belongs does not see it in a reason or
    /// a report, short and word-like as it may be; an ordinary odd type is still named (found by
    /// the fuzzer: a 10-letter `token_type` beside 13-character tokens).
    @Test func aTokenInTheTypeOrTheLifetimeIsNotQuoted() async throws {
        let plugin = OAuth2Refresh(tokenURL: Self.tokenURL, clientID: "app")
        let presented = Credentials(accessToken: "old-9f3e2d", refreshToken: "rt7c5b1e9a")
        func failure(_ body: String) async -> String {
            do {
                _ = try await plugin.refresh(context(presented, FakeTransport([.json(200, body)])))
                return "no failure"
            } catch {
                return (error as? RefreshFailure)?.reason ?? "\(error)"
            }
        }
        let named = await failure(#"{"access_token":"at-0123456789","token_type":"Bearfailer"}"#)
        #expect(named.contains("of type 'Bearfailer'"), "an odd type that is no token is named: \(named)")
        for body in [
            #"{"access_token":"tok7731aa","token_type":"tok7731aa"}"#,  // the access token itself
            #"{"access_token":"x","refresh_token":"rt99z1","token_type":"rt99z1"}"#,  // the rotated one
            #"{"access_token":"x","id_token":"idt4242","token_type":"idt4242x"}"#,  // contains another token
            #"{"access_token":"x","token_type":"rt7c5b1e9a"}"#,  // the refresh token presented
            #"{"access_token":"x","token_type":"old-9f3e"}"#,  // part of the access token presented
        ] {
            let reason = await failure(body)
            #expect(reason.contains("of type a text of"), "\(body): \(reason)")
            for token in ["tok7731aa", "rt99z1", "idt4242", "rt7c5b1e9a", "old-9f3e"] {
                #expect(!reason.contains(token), "\(body): \(reason)")
            }
        }
        let reports = Locked<[String]>([])
        _ = try await plugin.refresh(
            RefreshContext(
                credentials: presented,
                transport: FakeTransport([.json(200, #"{"access_token":"t-88123456","expires_in":"-88123456"}"#)]),
                clock: VirtualClock(), report: { text in reports.withLock { $0.append(text) } }))
        let said = reports.withLock { $0 }
        #expect(
            said.count == 1 && !said[0].contains("88123456") && said[0].contains("a text of 9 characters"), "\(said)")
    }

    @Test func oauth2WithoutARefreshTokenFailsWithoutACall() async throws {
        let transport = FakeTransport([])
        let plugin = OAuth2Refresh(tokenURL: Self.tokenURL, clientID: "app")
        let failure = await #expect(throws: RefreshFailure.self) {
            try await plugin.refresh(context(Credentials(accessToken: "a1"), transport))
        }
        #expect(failure == RefreshFailure("there is no refresh token to use"))
        #expect(transport.requests.isEmpty)
    }

    @Test func oauth2UnreachableEndpointIsAFailureWithoutResponse() async throws {
        let transport = FakeTransport([.error(TransportError(.connection, "POST https://auth.example.com/oauth/token"))]
        )
        let plugin = OAuth2Refresh(tokenURL: Self.tokenURL, clientID: "app")
        let failure = await #expect(throws: RefreshFailure.self) {
            try await plugin.refresh(context(Credentials(accessToken: "a1", refreshToken: "r1"), transport))
        }
        #expect(
            failure
                == RefreshFailure(
                    "the token endpoint could not be reached "
                        + "(connection error: POST https://auth.example.com/oauth/token)", kind: .transient
                ))
    }

    @Test func oauth2FactoryReadsTheSecretFromTheNamedEnvironmentVariable() async throws {
        let options: [String: PluginOption] = [
            "token-url": .string(Self.tokenURL.absoluteString), "client-id": .string("app"),
            "client-secret-env": .string("APP_SECRET"), "scope": .string("read"),
        ]
        let plugin = try OAuth2Refresh(configuration: configuration("oauth2", options, ["APP_SECRET": "s3"]))
        #expect(plugin.clientSecret == "s3")
        #expect(plugin.scope == "read")
        #expect(
            plugin.description
                == "OAuth2Refresh(https://auth.example.com/oauth/token, client 'app', client secret <redacted>)")

        let missing = #expect(throws: PluginError.self) {
            try OAuth2Refresh(configuration: configuration("oauth2", options, [:]))
        }
        #expect(
            missing?.description
                == "refresh plugin 'oauth2': the environment variable 'APP_SECRET' named by 'client-secret-env' "
                + "is not set"
        )
        let badURL = #expect(throws: PluginError.self) {
            try OAuth2Refresh(
                configuration: configuration("oauth2", ["token-url": .string("ftp://x"), "client-id": .string("a")]))
        }
        #expect(badURL?.reason == "the option 'token-url' is not an http(s) URL")
    }

    @Test func httpRefreshTakesHeaderSecretsFromTheEnvironment() async throws {
        let options: [String: PluginOption] = [
            "url": .string(Self.refreshURL.absoluteString), "token": .string("body.token"),
            "headers": .map([
                "X-Api-Key": .string("{env:API_KEY}"), "X-Both": .string("k={env:API_KEY};r={refresh_token}"),
            ]),
        ]
        let plugin = try HTTPRefresh(configuration: configuration("http", options, ["API_KEY": "k3y"]))
        let request = try plugin.request(for: Credentials(accessToken: "a", refreshToken: "r1"))
        #expect(request.headers["X-Api-Key"] == "k3y")
        #expect(request.headers["X-Both"] == "k=k3y;r=r1")

        let missing = #expect(throws: PluginError.self) {
            try HTTPRefresh(configuration: configuration("http", options, [:]))
        }
        // Headers are resolved in name order, so 'X-Api-Key' is the one reported.
        #expect(
            missing?.description
                == "refresh plugin 'http': the environment variable 'API_KEY' named by the header 'X-Api-Key' is not set"
        )
    }

    /// Plants a refresh token and a client secret, makes every failure the plugin has, and checks
    /// that no reason, description or engine error shows either.
    @Test func oauth2NeverShowsTokensOrTheSecret() async throws {
        let refreshToken = "PLANTED-REFRESH-8c1f"
        let secret = "PLANTED-SECRET-52aa"
        let echo = #"{"error":"invalid_grant","error_description":"PLANTED-REFRESH-8c1f PLANTED-SECRET-52aa"}"#
        let answers: [FakeTransport.Answer] = [
            .json(400, echo), .json(200, #"{"nope":"PLANTED-REFRESH-8c1f"}"#), .json(200, "PLANTED-SECRET-52aa"),
            .json(200, #"{"access_token":"x","expires_in":"PLANTED-SECRET-52aa"}"#),
            .json(200, #"{"access_token":"x","token_type":"PLANTED-SECRET-52aa"}"#),
            .error(TransportError(.timeout, "POST https://auth.example.com/oauth/token: no complete response")),
        ]
        let plugin = OAuth2Refresh(tokenURL: Self.tokenURL, clientID: "app", clientSecret: secret)
        for answer in answers {
            let transport = FakeTransport([answer])
            let reports = Locked<[String]>([])
            do {
                // An odd lifetime keeps the pair: what it reports shows no secret either.
                _ = try await plugin.refresh(
                    RefreshContext(
                        credentials: Credentials(accessToken: "a", refreshToken: refreshToken), transport: transport,
                        clock: VirtualClock(), report: { text in reports.withLock { $0.append(text) } }))
                let said = reports.withLock { $0 }
                #expect(!said.isEmpty, "expected a failure or a report for \(answer)")
                for text in said {
                    #expect(!text.contains(refreshToken))
                    #expect(!text.contains(secret))
                }
            } catch let failure as RefreshFailure {
                for text in [
                    failure.reason, "\(failure)", String(reflecting: failure.response as Any),
                    PolicyEngineError.refreshFailed(reason: failure.reason).description,
                ] {
                    #expect(!text.contains(refreshToken))
                    #expect(!text.contains(secret))
                }
            }
        }
        var dumped = ""
        dump(plugin, to: &dumped)
        for text in ["\(plugin)", String(reflecting: plugin), dumped] {
            #expect(!text.contains(secret))
        }
    }

    // MARK: - http refresh

    @Test func httpRefreshPostsTheConfiguredJSONBodyAndHeaders() async throws {
        let transport = FakeTransport([.json(200, #"{"data":{"token":"a2","refresh":"r2","ttl":60}}"#)])
        let plugin = try HTTPRefresh(
            configuration: configuration(
                "http",
                [
                    "url": .string(Self.refreshURL.absoluteString),
                    "body": .map([
                        "refreshToken": .string("{refresh_token}"), "device": .string("ios \"x\""),
                        "remember": .bool(true), "version": .number("2"), "ratio": .number("1.5"),
                        "old": .string("prefix-{access_token}-{unknown}"),
                    ]),
                    "headers": .map(["X-Client": .string("mobile"), "X-Old-Token": .string("{access_token}")]),
                    "token": .string("body.data.token"),
                    "refresh-token": .string("body.data.refresh"),
                    "expires-in": .string("body.data.ttl"),
                ]))
        let fresh = try await plugin.refresh(context(Credentials(accessToken: "a1", refreshToken: "r1"), transport))
        #expect(fresh == Credentials(accessToken: "a2", refreshToken: "r2", expiresAt: Self.epoch + 60))

        let sent = try #require(transport.requests.first)
        #expect(sent.method == "POST")
        #expect(sent.url == Self.refreshURL)
        #expect(
            sent.headers.fields.map { "\($0.name): \($0.value)" } == [
                "Content-Type: application/json", "Accept: application/json", "X-Client: mobile", "X-Old-Token: a1",
            ])
        #expect(
            String(decoding: sent.body ?? Data(), as: UTF8.self)
                == #"{"device":"ios \"x\"","old":"prefix-a1-{unknown}","ratio":1.5,"refreshToken":"r1","#
                + #""remember":true,"#
                + #""version":2}"#)
    }

    @Test func httpRefreshDefaultsToSendingTheRefreshTokenAndReadsHeaders() async throws {
        let answer = HTTPResponse(status: 200, headers: ["X-New-Token": "a2"], body: Data("{}".utf8))
        let transport = FakeTransport([.response(answer)])
        let plugin = try HTTPRefresh(
            configuration: configuration(
                "http", ["url": .string(Self.refreshURL.absoluteString), "token": .string("header.X-New-Token")]))
        let fresh = try await plugin.refresh(context(Credentials(accessToken: "a1", refreshToken: "r1"), transport))
        #expect(fresh == Credentials(accessToken: "a2", refreshToken: "r1"))
        #expect(String(decoding: transport.requests.first?.body ?? Data(), as: UTF8.self) == #"{"refresh_token":"r1"}"#)
    }

    @Test func httpRefreshFailures() async throws {
        let plugin = try HTTPRefresh(
            configuration: configuration(
                "http", ["url": .string(Self.refreshURL.absoluteString), "token": .string("body.data.token")]))
        let rejected = HTTPResponse(status: 403, body: Data(#"{"status":202}"#.utf8))
        var failure = await #expect(throws: RefreshFailure.self) {
            try await plugin.refresh(
                self.context(Credentials(accessToken: "a", refreshToken: "r"), FakeTransport([.response(rejected)])))
        }
        #expect(failure == RefreshFailure("the refresh endpoint answered 403", response: rejected))

        let empty = HTTPResponse(status: 200, body: Data(#"{"data":{}}"#.utf8))
        failure = await #expect(throws: RefreshFailure.self) {
            try await plugin.refresh(
                self.context(Credentials(accessToken: "a", refreshToken: "r"), FakeTransport([.response(empty)])))
        }
        #expect(
            failure
                == RefreshFailure("the refresh endpoint's answer has no token at 'body.data.token'", response: empty))

        let transport = FakeTransport([])
        failure = await #expect(throws: RefreshFailure.self) {
            try await plugin.refresh(self.context(Credentials(accessToken: "a"), transport))
        }
        #expect(failure == RefreshFailure("there is no refresh token to send"))
        #expect(transport.requests.isEmpty)

        let badPath = #expect(throws: PluginError.self) {
            try HTTPRefresh(
                configuration: configuration(
                    "http", ["url": .string("https://x.example"), "token": .string("data.token")]))
        }
        #expect(badPath?.reason == "the option 'token' must be body.<path> or header.<Name>")
    }

    @Test func httpRefreshPublicInitializerChecksPaths() throws {
        let plugin = try HTTPRefresh(url: Self.refreshURL, token: "body.token", expiresIn: "header.X-TTL")
        #expect(plugin.body == ["refresh_token": .string("{refresh_token}")])
        let error = #expect(throws: PluginError.self) {
            try HTTPRefresh(url: Self.refreshURL, token: "body.token", refreshToken: "token")
        }
        #expect(
            error?.description
                == "refresh plugin 'http': the option 'refresh-token' must be body.<path> or header.<Name>")
    }

    // MARK: - http logout

    @Test func httpLogoutPostsTheReason() async throws {
        let transport = FakeTransport([.json(200, "{}")])
        let url = try #require(URL(string: "https://api.example.com/logout"))
        let plugin = try HTTPLogout(
            configuration: configuration("http", ["url": .string(url.absoluteString), "timeout": .string("2s")]))
        #expect(plugin.timeout == .seconds(2))
        await plugin.logout(
            LogoutContext(requestID: "r1", reason: "forced-logout", credentials: nil, transport: transport))
        let sent = try #require(transport.requests.first)
        #expect(sent.method == "POST")
        #expect(sent.url == url)
        #expect(sent.headers["Authorization"] == nil)
        #expect(String(decoding: sent.body ?? Data(), as: UTF8.self) == #"{"reason":"forced-logout"}"#)
        #expect(
            try HTTPLogout(configuration: configuration("http", ["url": .string(url.absoluteString)])).timeout
                == .seconds(5))
    }

    @Test func httpLogoutGivesUpAtItsTimeoutAndCancelsTheCall() async throws {
        let transport = HangingTransport()
        let url = try #require(URL(string: "https://api.example.com/logout"))
        let plugin = HTTPLogout(url: url, timeout: .seconds(5))
        let clock = VirtualClock()
        let call = Task {
            await plugin.logout(
                LogoutContext(requestID: nil, reason: "refresh", credentials: nil, transport: transport, clock: clock))
        }
        // The timeout waits on the engine's clock: nothing ends the call until it passes 5 s.
        while clock.pendingTimers == 0 { await Task.yield() }
        clock.advance(to: .milliseconds(4_999))
        #expect(clock.pendingTimers == 1)
        clock.advance(to: .seconds(5))
        await call.value
        #expect(transport.cancelled.withLock { $0 } == 1, "the hanging call was cancelled, not left running")
    }

    // MARK: - registry

    @Test func registryMakesTheNetworkPluginsFromPolicyOptions() throws {
        let registry = PluginRegistry()
        let transport = FakeTransport([])
        let oauth2 = try registry.make(
            registry.refresh,
            PluginReference(
                kind: .refresh, name: "oauth2",
                options: ["token-url": .string(Self.tokenURL.absoluteString), "client-id": .string("app")]),
            transport: transport, environment: [:])
        #expect(oauth2 is OAuth2Refresh)
        let http = try registry.make(
            registry.refresh,
            PluginReference(
                kind: .refresh, name: "http",
                options: ["url": .string(Self.refreshURL.absoluteString), "token": .string("body.token")]),
            transport: transport, environment: [:])
        #expect(http is HTTPRefresh)
        let logout = try registry.make(
            registry.logout,
            PluginReference(kind: .logout, name: "http", options: ["url": .string("https://api.example.com/logout")]),
            transport: transport, environment: [:])
        #expect(logout is HTTPLogout)
        let store = try registry.make(
            registry.store, PluginReference(kind: .store, name: "file", options: ["path": .string("~/creds.json")]),
            transport: transport, environment: [:])
        #expect((store as? FileCredentialStore)?.path == NSString(string: "~/creds.json").expandingTildeInPath)
        #expect(registry.catalog.isBuiltin(.refresh, "oauth2"))
    }

    // MARK: - file store

    @Test func fileStoreRoundTripsAndWritesMode0600() throws {
        try withTemporaryDirectory { directory in
            let path = directory + "/credentials.json"
            let store = FileCredentialStore(path: path)
            #expect(try store.load() == nil, "a missing file is no credentials, not an error")
            let credentials = Credentials(
                accessToken: "a\"1\\", refreshToken: "r1", expiresAt: Date(timeIntervalSince1970: 1_767_225_600))
            try store.save(credentials)
            #expect(try store.load() == credentials)
            #expect(try mode(path) == 0o600)
            #expect(
                try String(contentsOfFile: path, encoding: .utf8)
                    == "{\n  \"access_token\": \"a\\\"1\\\\\",\n  \"refresh_token\": \"r1\",\n"
                    + "  \"expires_at\": \"2026-01-01T00:00:00Z\"\n}\n")
            try store.save(Credentials(accessToken: "a2"))
            #expect(try String(contentsOfFile: path, encoding: .utf8) == "{\n  \"access_token\": \"a2\"\n}\n")
            #expect(try leftovers(directory) == ["credentials.json"])
        }
    }

    @Test func fileStoreReplacesAWorldReadableFileWithA0600One() throws {
        try withTemporaryDirectory { directory in
            let path = directory + "/credentials.json"
            try Data(#"{"access_token":"a1"}"#.utf8).write(to: URL(fileURLWithPath: path))
            chmod(path, 0o644)
            try FileCredentialStore(path: path).save(Credentials(accessToken: "a2"))
            #expect(try mode(path) == 0o600)
        }
    }

    @Test func fileStoreFollowsASymbolicLink() throws {
        try withTemporaryDirectory { directory in
            let target = directory + "/real.json"
            let link = directory + "/link.json"
            try FileManager.default.createSymbolicLink(atPath: link, withDestinationPath: target)
            try FileCredentialStore(path: link).save(Credentials(accessToken: "a1"))
            #expect(try FileManager.default.destinationOfSymbolicLink(atPath: link) == target)
            #expect(try FileCredentialStore(path: target).load() == Credentials(accessToken: "a1"))
        }
    }

    struct LoadCase: Sendable, CustomTestStringConvertible {
        var name: String
        var json: String
        var expected: Credentials
        var testDescription: String { name }
    }

    @Test(arguments: [
        LoadCase(name: "access token only", json: #"{"access_token":"a"}"#, expected: Credentials(accessToken: "a")),
        LoadCase(
            name: "nulls", json: #"{"access_token":"a","refresh_token":null,"expires_at":null}"#,
            expected: Credentials(accessToken: "a")),
        LoadCase(
            name: "unknown keys", json: #"{"access_token":"a","token_type":"Bearer","user":{"id":1}}"#,
            expected: Credentials(accessToken: "a")),
        LoadCase(
            name: "fractional seconds", json: #"{"access_token":"a","expires_at":"2026-01-01T00:00:00.500Z"}"#,
            expected: Credentials(accessToken: "a", expiresAt: Date(timeIntervalSince1970: 1_767_225_600.5))),
        LoadCase(
            name: "an offset", json: #"{"access_token":"a","expires_at":"2026-01-01T02:00:00+02:00"}"#,
            expected: Credentials(accessToken: "a", expiresAt: Date(timeIntervalSince1970: 1_767_225_600))),
        LoadCase(
            name: "lower-case t and z", json: #"{"access_token":"a","expires_at":"2026-01-01t00:00:00z"}"#,
            expected: Credentials(accessToken: "a", expiresAt: Date(timeIntervalSince1970: 1_767_225_600))),
    ])
    func fileStoreLoadsTolerantly(_ testCase: LoadCase) throws {
        try withTemporaryDirectory { directory in
            let path = directory + "/c.json"
            try Data(testCase.json.utf8).write(to: URL(fileURLWithPath: path))
            #expect(try FileCredentialStore(path: path).load() == testCase.expected)
        }
    }

    @Test(arguments: [
        (#"{"access_token":"TOKEN-abc","refresh_token":"TOKEN-def""#, "it is not valid JSON"),
        (#"["TOKEN-abc"]"#, "it is not a JSON object"),
        (#"{"refresh_token":"TOKEN-def"}"#, "'access_token' is missing"),
        (#"{"access_token":["TOKEN-abc"]}"#, "'access_token' is not a non-empty text"),
        (#"{"access_token":"TOKEN-abc","refresh_token":{"v":"TOKEN-def"}}"#, "'refresh_token' is not a text"),
        (
            #"{"access_token":"TOKEN-abc","expires_at":"TOKEN-def"}"#,
            "'expires_at' is not an RFC 3339 date-time like 2025-01-31T12:00:00Z"
        ),
    ])
    func fileStoreMalformedFilesAreClearErrorsWithoutContents(_ json: String, _ reason: String) throws {
        try withTemporaryDirectory { directory in
            let path = directory + "/c.json"
            try Data(json.utf8).write(to: URL(fileURLWithPath: path))
            let error = #expect(throws: CredentialStoreError.self) { try FileCredentialStore(path: path).load() }
            #expect(error == .malformed(path: path, reason: reason))
            let description = error.map(String.init(describing:)) ?? ""
            #expect(description == "the credentials file '\(path)' is malformed: \(reason)")
            #expect(!description.contains("TOKEN-"))
        }
    }

    @Test func fileStoreReportsAnUnwritableDirectory() throws {
        try withTemporaryDirectory { directory in
            let path = directory + "/missing/c.json"
            let error = #expect(throws: CredentialStoreError.self) {
                try FileCredentialStore(path: path).save(Credentials(accessToken: "TOKEN-abc"))
            }
            #expect(
                error
                    == .unwritable(
                        path: path,
                        reason: "cannot create a temporary file in '\(directory)/missing': No such file or directory"))
        }
    }

    /// Two writers that share nothing (as two processes would) and a reader, all at once: every
    /// load sees one whole file, and no temporary file is left.
    @Test func fileStoreConcurrentWritersNeverTearTheFile() async throws {
        try await withTemporaryDirectory { directory in
            let path = directory + "/c.json"
            try FileCredentialStore(path: path).save(Credentials(accessToken: "start"))
            let rounds = 200
            // Long tokens make a torn write likely to show if the store were not atomic.
            let writers = ["A", "B"].map { name in
                detachedThread {
                    let store = FileCredentialStore(path: path)
                    for round in 0..<rounds {
                        let token = name + String(repeating: name, count: 4096) + "\(round)"
                        try store.save(Credentials(accessToken: token, refreshToken: "r-\(name)-\(round)"))
                    }
                }
            }
            let reader = detachedThread {
                let store = FileCredentialStore(path: path)
                for _ in 0..<(rounds * 2) {
                    let loaded = try #require(try store.load())
                    let name = String(loaded.accessToken.prefix(1))
                    #expect(loaded.accessToken == "start" || loaded.refreshToken?.hasPrefix("r-\(name)-") == true)
                }
            }
            for thread in writers + [reader] { try await thread.value }
            let final = try #require(try FileCredentialStore(path: path).load())
            #expect(final.refreshToken == "r-A-\(rounds - 1)" || final.refreshToken == "r-B-\(rounds - 1)")
            #expect(try mode(path) == 0o600)
            #expect(try leftovers(directory) == ["c.json"])
        }
    }

    // MARK: - Helpers

    func context(_ credentials: Credentials?, _ transport: any Transport) -> RefreshContext {
        RefreshContext(credentials: credentials, transport: transport, clock: VirtualClock())
    }

    func configuration(
        _ name: String, _ options: [String: PluginOption], _ environment: [String: String] = [:]
    ) -> PluginConfiguration {
        PluginConfiguration(name: name, options: options, transport: FakeTransport([]), environment: environment)
    }

    func mode(_ path: String) throws -> Int {
        let attributes = try FileManager.default.attributesOfItem(atPath: path)
        return (attributes[.posixPermissions] as? NSNumber)?.intValue ?? -1
    }

    func leftovers(_ directory: String) throws -> [String] {
        try FileManager.default.contentsOfDirectory(atPath: directory).sorted()
    }
}

/// Runs `body` with a fresh temporary directory, removed afterwards.
private func withTemporaryDirectory<T>(_ body: (String) async throws -> T) async throws -> T {
    let directory = FileManager.default.temporaryDirectory.appendingPathComponent("rp-\(UUID().uuidString)").path
    try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(atPath: directory) }
    return try await body(directory)
}

private func withTemporaryDirectory<T>(_ body: (String) throws -> T) throws -> T {
    let directory = FileManager.default.temporaryDirectory.appendingPathComponent("rp-\(UUID().uuidString)").path
    try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(atPath: directory) }
    return try body(directory)
}

/// Runs blocking `body` on a thread of its own (not the cooperative pool, which it would block).
private func detachedThread(_ body: @escaping @Sendable () throws -> Void) -> Task<Void, any Error> {
    Task {
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
            let thread = Thread {
                continuation.resume(with: Result { try body() })
            }
            thread.start()
        }
    }
}

/// Answers requests from a script, in order, and records them.
private final class FakeTransport: Transport {
    enum Answer: Sendable {
        case response(HTTPResponse)
        case error(TransportError)

        static func json(_ status: Int, _ body: String) -> Answer {
            .response(
                HTTPResponse(status: status, headers: ["Content-Type": "application/json"], body: Data(body.utf8)))
        }
    }

    private struct State {
        var answers: [Answer]
        var requests: [HTTPRequest] = []
    }

    private let state: Locked<State>

    init(_ answers: [Answer]) { state = Locked(State(answers: answers)) }

    var requests: [HTTPRequest] { state.withLock { $0.requests } }

    func send(_ request: HTTPRequest) async throws -> HTTPResponse {
        let answer = state.withLock { state -> Answer? in
            state.requests.append(request)
            return state.answers.isEmpty ? nil : state.answers.removeFirst()
        }
        switch answer {
        case .response(let response)?: return response
        case .error(let error)?: throw error
        case nil: throw TransportError(.connection, "the fake transport has no answer left")
        }
    }
}

/// Never answers; counts the calls cancelled.
private final class HangingTransport: Transport {
    let cancelled = Locked(0)

    func send(_ request: HTTPRequest) async throws -> HTTPResponse {
        do {
            try await Task.sleep(for: .seconds(3600))
        } catch {
            cancelled.withLock { $0 += 1 }
            throw CancellationError()
        }
        throw TransportError(.timeout)
    }
}
