import Foundation
import Testing

@testable import ResponsePolicy

/// Plants known secrets — an access token, a refresh token, a client secret from the environment,
/// the tokens a refresh rotates in, a token the caller put in its own Authorization header — and
/// checks that none of them shows in what the library says: events (JSON lines and fields), the
/// `log` observer's lines, `PolicyEngineError` and `RefreshFailure` texts, `Credentials`, and the
/// diagnostics of a policy that wrongly holds a secret. Each test also checks that the secrets did
/// travel where they must (the transport saw them), so a test cannot pass by planting nothing.
struct SecretRedactionTests {
    // MARK: - Through the engine

    /// How the policy signs requests; the access token lands in a header or in the URL.
    enum Signing: String, Sendable, CaseIterable, CustomTestStringConvertible {
        case bearer, header, query
        var testDescription: String { rawValue }

        var policy: String {
            switch self {
            case .bearer: return "authorize: { use: bearer }"
            case .header: return "authorize: { use: header, with: { name: X-Auth-Token } }"
            case .query: return "authorize: { use: query, with: { name: access_token } }"
            }
        }
    }

    @Test(arguments: Signing.allCases)
    func noOutcomeOfARequestShowsATokenOrTheClientSecret(_ signing: Signing) async throws {
        let rig = try RedactionRig(signing: signing, tokenEndpoint: .rotates)
        let results = try await rig.run(["/expired", "/forbidden", "/busy", "/drop", "/revoked"])

        // The outcomes are the ones meant, each carrying a response or error full of secrets.
        #expect(results.map(\.kind) == ["delivered", "failed", "retriesExhausted", "retriesExhausted", "loggedOut"])
        let forbidden = try #require(results[1].response)
        #expect(String(decoding: forbidden.body, as: UTF8.self).contains(Planted.rotatedAccess))
        #expect(results[1].error?.description == "rule 'forbidden' failed the request (\(forbidden))")
        #expect(forbidden.description == "HTTP 403 (\(forbidden.body.count) bytes)")
        let busy = try #require(results[2].response)
        #expect(results[2].error?.description == "retries exhausted; last response HTTP 503 (\(busy.body.count) bytes)")
        #expect(
            results[3].error
                == .retriesExhausted(lastResponse: nil, lastError: TransportError(.connection, "connection reset")))
        // After the refresh (answered at t=0.1) the session runs on the rotated tokens.
        let stored = try rig.store.load()
        #expect(stored?.accessToken == Planted.rotatedAccess)
        #expect(stored?.refreshToken == Planted.rotatedRefresh)
        #expect(stored?.expiresAt.map { ($0.timeIntervalSince(VirtualClock.epoch) * 1000).rounded() } == 3_600_100)

        rig.expectSecretsTravelled(signing: signing)
        rig.expectNoSecretInEventsOrLogs()
        for result in results {
            Self.expectNoSecret(in: result.texts, result.kind)
        }
    }

    @Test(arguments: Signing.allCases)
    func aRejectedRefreshShowsNoTokenOrTheClientSecret(_ signing: Signing) async throws {
        let rig = try RedactionRig(signing: signing, tokenEndpoint: .rejects)
        let results = try await rig.run(["/expired"])
        #expect(results.map(\.error) == [.refreshFailed(reason: "the token endpoint answered 400 (invalid_grant)")])
        let refreshEnd = rig.events.events.filter { $0.kind == .refreshEnd }.map(\.jsonLine)
        #expect(
            refreshEnd == [
                #"{"t":0.1,"request":"c1","event":"refresh-end","status":400,"ok":false,"#
                    + #""reason":"the token endpoint answered 400 (invalid_grant)"}"#
            ])
        rig.expectSecretsTravelled(signing: signing)
        rig.expectNoSecretInEventsOrLogs()
        Self.expectNoSecret(in: results[0].texts, "refreshFailed")
    }

    /// Errors from host code — a refresh plugin throwing its own error type, a store that cannot
    /// save — may say anything: events name their type only.
    @Test(arguments: [false, true])
    func hostErrorsCarryingTokensAreNamedByTheirTypeOnly(_ refreshFails: Bool) async throws {
        struct LeakyError: Error, CustomStringConvertible {
            var description: String { "leaky: \(Planted.accessToken) \(Planted.refreshToken)" }
        }
        final class LeakyStore: CredentialStore {
            func load() throws -> Credentials? {
                Credentials(accessToken: Planted.accessToken, refreshToken: Planted.refreshToken)
            }
            func save(_ credentials: Credentials) throws { throw LeakyError() }
        }
        struct LeakyRefresh: RefreshPlugin {
            var fails: Bool
            func refresh(_ context: RefreshContext) async throws -> Credentials {
                if fails { throw LeakyError() }
                return Credentials(accessToken: Planted.rotatedAccess, refreshToken: Planted.rotatedRefresh)
            }
        }
        let clock = VirtualClock()
        let scheduler = SimulationScheduler(clock: clock, externalWorkGracePeriod: .zero)
        let events = EventLog()
        let lines = Locked<[String]>([])
        var options = PolicyEngine.Options()
        options.clock = clock
        options.taskExecutor = scheduler.executor
        options.refreshPlugin = LeakyRefresh(fails: refreshFails)
        options.observers = [events, LogObserver(debug: true, write: { line in lines.withLock { $0.append(line) } })]
        let transport = RecordingTransport { request, _ in
            request.headers["Authorization"] == "Bearer \(Planted.rotatedAccess)"
                ? response(#"{"status":0}"#) : response(#"{"status":1401}"#)
        }
        let engine = PolicyEngine(
            policy: try Policy.load(yaml: basePolicy + "\n  on-failure: fail\n"), transport: transport,
            credentials: LeakyStore(), options: options)
        let result = try await scheduler.runDetached { () -> Outcome in
            do throws(PolicyEngineError) {
                return Outcome(.success(try await engine.send(HTTPRequest(url: testURL, id: "h1"))))
            } catch {
                return Outcome(.failure(error))
            }
        }
        let reasons = events.events.compactMap { event in event.reason.map { "\(event.kind.rawValue): \($0)" } }
        if refreshFails {
            // Another error than RefreshFailure is transient: retried within refresh.timeout.
            let reason =
                "the refresh plugin failed (LeakyError); transient trouble outlasted refresh.timeout (10s, 5 calls)"
            #expect(result.error == .refreshFailed(reason: reason))
            #expect(reasons.contains("refresh-end: \(reason)"), "\(reasons)")
        } else {
            #expect(result.kind == "delivered")
            #expect(reasons.contains("problem: the credential store could not be written (LeakyError)"), "\(reasons)")
        }
        Self.expectNoSecret(in: events.events.map(\.jsonLine) + lines.withLock { $0 } + result.texts, "host errors")
    }

    // MARK: - Errors made directly

    /// Every `PolicyEngineError` case, those with a response given one whose headers and body
    /// carry every secret.
    static let errors: [PolicyEngineError] = [
        .loggedOut(until: VirtualClock.epoch, reason: .rule("forced-logout", response: Planted.response)),
        .loggedOut(until: VirtualClock.epoch, reason: .refreshFailed("invalid_grant", response: Planted.response)),
        .loggedOut(until: VirtualClock.epoch, reason: .host("the user signed out")),
        .retriesExhausted(lastResponse: Planted.response, lastError: nil),
        .retriesExhausted(lastResponse: Planted.response, lastError: TransportError(.timeout)),
        .retriesExhausted(lastResponse: nil, lastError: TransportError(.connection, "reset")),
        .retriesExhausted(lastResponse: nil, lastError: nil),
        .failed(response: Planted.response, rule: "forbidden"),
        .refreshFailed(reason: "the token endpoint answered 400 (invalid_grant)"),
        .cancelled,
        .deadlineExceeded,
        .transport(TransportError(.tls, "certificate expired")),
    ]

    @Test(arguments: errors)
    func engineErrorsNeverShowTheResponseTheyCarry(_ error: PolicyEngineError) {
        Self.expectNoSecret(in: Outcome(error: error).texts, "\(error)")
        #expect(String(reflecting: error) == error.description)
    }

    @Test func aResponseDescribesItselfByStatusAndSizeOnly() {
        let response = Planted.response
        #expect("\(response)" == "HTTP 401 (\(response.body.count) bytes)")
        #expect(String(reflecting: response) == "\(response)")
        #expect("\([response])" == "[\(response)]")
        #expect("\(Optional(response) as Any)" == "Optional(\(response))")
    }

    // MARK: - Credentials

    @Test func credentialsNeverShowTheirTokens() {
        let credentials = Credentials(
            accessToken: Planted.accessToken, refreshToken: Planted.refreshToken,
            expiresAt: VirtualClock.epoch.addingTimeInterval(60))
        let shown = "Credentials(access token <redacted>, refresh token <redacted>, expires 2026-01-01T00:01:00Z)"
        #expect(credentials.description == shown)
        #expect(credentials.debugDescription == shown)
        #expect("\(credentials)" == shown)
        #expect(String(reflecting: credentials) == shown)
        #expect("\([credentials])" == "[\(shown)]")
        #expect("\(Optional(credentials) as Any)" == "Optional(\(shown))")
        #expect(
            Credentials(accessToken: Planted.accessToken).description == "Credentials(access token <redacted>)")
        var dumped = ""
        dump(credentials, to: &dumped)
        Self.expectNoSecret(in: [dumped], "dump(credentials)")
    }

    // MARK: - Refresh plugins

    /// What a token endpoint can answer; every answer echoes what it was sent.
    enum EndpointAnswer: String, Sendable, CaseIterable, CustomTestStringConvertible {
        case serverError = "500 echoing the request"
        case noToken = "200 without a token"
        case badLifetime = "200 with a lifetime that is a secret"
        case notJSON = "200 that is not JSON"
        case oauthErrorIsASecret = "400 whose OAuth error code is a token"
        case unreachable = "no answer"
        var testDescription: String { rawValue }
    }

    @Test(arguments: EndpointAnswer.allCases)
    func refreshFailuresOfBothBuiltInPluginsShowNoSecret(_ answer: EndpointAnswer) async throws {
        let oauth2 = OAuth2Refresh(tokenURL: RedactionRig.tokenURL, clientID: "app", clientSecret: Planted.clientSecret)
        let http = try HTTPRefresh(
            url: RedactionRig.tokenURL,
            body: ["refreshToken": .string("{refresh_token}"), "old": .string("{access_token}")],
            headers: ["X-Old-Token": "{access_token}"], token: "body.data.token", expiresIn: "body.data.ttl")
        let plugins: [(String, any RefreshPlugin)] = [("oauth2", oauth2), ("http", http)]
        for (name, plugin) in plugins {
            let transport = RecordingTransport { request, _ in try Self.answer(answer, to: request) }
            let reports = Locked<[String]>([])
            let context = RefreshContext(
                credentials: Credentials(accessToken: Planted.accessToken, refreshToken: Planted.refreshToken),
                transport: transport, clock: VirtualClock(), report: { text in reports.withLock { $0.append(text) } })
            do {
                let fresh = try await plugin.refresh(context)
                // A token whose lifetime is odd is kept (the server issued it); what is reported
                // about the lifetime shows no secret.
                let said = reports.withLock { $0 }
                #expect(answer == .badLifetime && !said.isEmpty, "\(name) accepted \(answer): \(fresh)")
                Self.expectNoSecret(in: said, "\(name): \(answer)")
            } catch let failure as RefreshFailure {
                var texts = [failure.reason, failure.description, "\(failure)", String(reflecting: failure)]
                texts += Outcome(error: .refreshFailed(reason: failure.reason)).texts
                if let response = failure.response { texts += ["\(response)", String(reflecting: response)] }
                Self.expectNoSecret(in: texts, "\(name): \(answer)")
            }
            let sent = transport.requests.map(RedactionRig.wireText).joined()
            #expect(sent.contains(Planted.refreshToken), "\(name) sent the refresh token")
        }
    }

    /// Answers a token request as `answer` says, echoing the request (URL, headers, body) back.
    static func answer(_ answer: EndpointAnswer, to request: HTTPRequest) throws -> HTTPResponse {
        let echo = RedactionRig.wireText(request)
        let headers: HTTPHeaders = ["X-Echo": echo, "Content-Type": "application/json"]
        switch answer {
        case .serverError: return HTTPResponse(status: 500, headers: headers, body: Data(echo.utf8))
        case .noToken:
            return HTTPResponse(
                status: 200, headers: headers, body: Data(#"{"echo":\#(PolicyEvent.quote(echo))}"#.utf8))
        case .badLifetime:
            let body =
                #"{"access_token":"x","expires_in":"\#(Planted.refreshToken)","#
                + #""data":{"token":"x","ttl":"\#(Planted.refreshToken)"}}"#
            return HTTPResponse(status: 200, headers: headers, body: Data(body.utf8))
        case .notJSON: return HTTPResponse(status: 200, headers: headers, body: Data(echo.utf8))
        case .oauthErrorIsASecret:
            let body = #"{"error":"\#(Planted.refreshToken)","error_description":\#(PolicyEvent.quote(echo))}"#
            return HTTPResponse(status: 400, headers: headers, body: Data(body.utf8))
        case .unreachable: throw TransportError(.connection, "POST https://auth.example.com/token: connection refused")
        }
    }

    // MARK: - A secret in the policy

    /// Ways to write the forbidden `client-secret:` option; `column` is where its key starts.
    struct SecretInPolicy: Sendable, CustomTestStringConvertible {
        var name: String
        var yaml: String
        var line: Int
        var column: Int
        var testDescription: String { name }
    }

    static let secretPolicies = [
        SecretInPolicy(
            name: "block style",
            yaml: policyHeader + """
                refresh:
                  use: oauth2
                  with:
                    token-url: https://auth.example.com/token
                    client-id: app
                    client-secret: \(Planted.clientSecret)
                """, line: 12, column: 5),
        SecretInPolicy(
            name: "flow style",
            yaml: policyHeader + """
                refresh: { use: oauth2, with: { token-url: "https://auth.example.com/token", client-id: app, \
                client-secret: "\(Planted.clientSecret)" } }
                """, line: 7, column: 94),
        SecretInPolicy(
            name: "folded over two lines",
            yaml: policyHeader + """
                refresh:
                  use: oauth2
                  with:
                    token-url: https://auth.example.com/token
                    client-id: app
                    client-secret: >-
                      \(Planted.clientSecret)
                      \(Planted.refreshToken)
                """, line: 12, column: 5),
        SecretInPolicy(
            name: "through an anchor",
            yaml: """
                x-secrets: &secret \(Planted.clientSecret)
                """ + "\n" + policyHeader + """
                    refresh:
                      use: oauth2
                      with: { token-url: "https://auth.example.com/token", client-id: app, client-secret: *secret }
                    """, line: 10, column: 72),
        SecretInPolicy(
            name: "in a route",
            yaml: policyHeader + """
                refresh:
                  use: oauth2
                  with: { token-url: "https://auth.example.com/token", client-id: app }
                routes:
                  - match: { path: "/admin/*" }
                    refresh:
                      use: oauth2
                      with:
                        token-url: https://auth.example.com/token
                        client-id: admin
                        client-secret: '\(Planted.clientSecret)'
                """, line: 17, column: 9),
    ]

    static let policyHeader = """
        policy: 1
        name: secret
        classify: { code: body.status }
        rules:
          - { name: expired, when: { code: [1401] }, then: refresh }
          - { name: unauthorized, when: { status: [401] }, then: refresh }

        """

    static let secretMessage =
        "'client-secret' would put a secret in the policy file; store it in an environment variable and name that "
        + "with 'client-secret-env'"

    @Test(arguments: secretPolicies)
    func aPolicyWithASecretIsRefusedWithoutEchoingIt(_ testCase: SecretInPolicy) throws {
        let error = #expect(throws: PolicyError.self) {
            try Policy.load(yaml: testCase.yaml, file: "secret.yaml")
        }
        let diagnostics = error?.diagnostics ?? []
        let secretFindings = diagnostics.filter { $0.rule == "secret-in-policy" }
        #expect(
            secretFindings.map(\.description) == [
                "secret.yaml:\(testCase.line):\(testCase.column): error: \(Self.secretMessage) [secret-in-policy]"
            ])
        var texts = diagnostics.map(\.description) + diagnostics.flatMap { $0.notes.map(\.message) }
        texts += [error?.description ?? "", String(reflecting: error as Any)]
        // The one-line rendering, as `policy lint` prints it on a pipe and as other commands do.
        let plain = DiagnosticRenderer(colour: false, showSource: false)
        texts += diagnostics.map { plain.render($0, source: testCase.yaml) }
        Self.expectNoSecret(in: texts, testCase.name)
        #expect(testCase.yaml.contains(Planted.clientSecret), "the secret was planted")
    }

    /// With source snippets (what `policy lint` shows on a terminal) a secret-in-policy finding
    /// shows no source line: that line holds the secret.
    @Test(arguments: secretPolicies)
    func theTerminalSnippetOfASecretInPolicyFinding(_ testCase: SecretInPolicy) throws {
        let diagnostics = findings(testCase.yaml).filter { $0.rule == "secret-in-policy" }
        let terminal = DiagnosticRenderer(colour: true, showSource: true)
        let rendered = diagnostics.map { terminal.render($0, source: testCase.yaml) }
        #expect(rendered.count == 1)
        Self.expectNoSecret(in: rendered, "snippet")
    }

    @Test func aReloadRefusedForASecretDoesNotEchoIt() async throws {
        let transport = RecordingTransport { _, _ in response(#"{"status":0}"#) }
        let sim = try SimulatedEngine(basePolicy, transport: transport)
        let logged = Locked<[String]>([])
        let engine = sim.engine
        let yaml = Self.secretPolicies[0].yaml
        let refused = #expect(throws: PolicyError.self) {
            try engine.reload(loading: { () throws(PolicyError) -> Policy in
                try Policy.load(yaml: yaml, file: "new.yaml")
            })
        }
        let reloads = sim.events.events.filter { $0.kind == .reload }
        for event in reloads { LogObserver(write: { line in logged.withLock { $0.append(line) } }).observe(event) }
        #expect(
            reloads.map(\.jsonLine) == [
                #"{"t":0,"event":"reload","ok":false,"reason":"12:5: \#(Self.secretMessage)"}"#
            ])
        Self.expectNoSecret(in: reloads.map(\.jsonLine) + logged.withLock { $0 } + ["\(refused as Any)"], "reload")
        #expect(engine.policy.name == "test", "the running policy stays")
    }

    /// A secret named by `client-secret-env` is read from the environment the engine is given
    /// and used, but never shown, also when the plugin cannot be made.
    @Test func aClientSecretFromTheEnvironmentIsUsedAndNeverShown() async throws {
        let rig = try RedactionRig(signing: .bearer, tokenEndpoint: .rotates)
        _ = try await rig.run(["/expired"])
        let basic = try #require(
            rig.transport.requests.first { $0.url == RedactionRig.tokenURL }?.headers["Authorization"])
        #expect(basic == "Basic " + Planted.basicCredentials)
        // Named but not set: the refresh fails with a reason naming the variable only.
        let unset = try RedactionRig(signing: .bearer, tokenEndpoint: .rotates, environment: [:])
        let results = try await unset.run(["/expired"])
        #expect(
            results.map(\.error) == [
                .refreshFailed(
                    reason: "refresh plugin 'oauth2': the environment variable 'APP_CLIENT_SECRET' named by "
                        + "'client-secret-env' is not set")
            ])
        unset.expectNoSecretInEventsOrLogs()
    }
}

extension SecretRedactionTests {
    // MARK: - The planted secrets

    enum Planted {
        static let accessToken = "PLANTED-ACCESS-7f3a"
        static let refreshToken = "PLANTED-REFRESH-91c2"
        static let clientSecret = "PLANTED-CLIENT-SECRET-4be0"
        static let rotatedAccess = "PLANTED-ROTATED-ACCESS-0d5e"
        static let rotatedRefresh = "PLANTED-ROTATED-REFRESH-c8a1"
        static let callerToken = "PLANTED-CALLER-66b9"

        /// `client_id:client_secret` as HTTP Basic sends it (RFC 6749 §2.3.1).
        static let basicCredentials = Data("app:\(clientSecret)".utf8).base64EncodedString()

        /// Every secret, and the encodings it travels in.
        static let all = [
            accessToken, refreshToken, clientSecret, rotatedAccess, rotatedRefresh, callerToken, basicCredentials,
            "PLANTED",
        ]

        /// A response whose headers and body carry every secret.
        static let response = HTTPResponse(
            status: 401,
            headers: [
                "Authorization": "Bearer \(accessToken)", "Set-Cookie": "refresh=\(refreshToken)",
                "X-Echo": "Basic \(basicCredentials) \(clientSecret)",
            ],
            body: Data(
                #"{"access_token":"\#(rotatedAccess)","refresh_token":"\#(rotatedRefresh)","x":"\#(callerToken)"}"#.utf8
            ))
    }

    /// Records an issue for every planted secret found in any of `texts`.
    static func expectNoSecret(in texts: [String], _ what: String, sourceLocation: SourceLocation = #_sourceLocation) {
        for text in texts {
            for secret in Planted.all where text.contains(secret) {
                Issue.record("\(what) shows '\(secret)': \(text)", sourceLocation: sourceLocation)
            }
        }
    }

    // MARK: - The rig

    /// What one `send` ended with, and every way a host might print it.
    struct Outcome: Sendable {
        var response: HTTPResponse?
        var error: PolicyEngineError?

        init(_ result: Result<HTTPResponse, PolicyEngineError>) {
            switch result {
            case .success(let delivered): response = delivered
            case .failure(let failure):
                error = failure
                switch failure {
                case .failed(let carried, _): response = carried
                case .retriesExhausted(let carried, _): response = carried
                default: break
                }
            }
        }

        init(error: PolicyEngineError) { self.init(.failure(error)) }

        /// `delivered`, or the error's case name.
        var kind: String {
            guard let error else { return "delivered" }
            switch error {
            case .loggedOut: return "loggedOut"
            case .retriesExhausted: return "retriesExhausted"
            case .failed: return "failed"
            case .refreshFailed: return "refreshFailed"
            case .cancelled: return "cancelled"
            case .deadlineExceeded: return "deadlineExceeded"
            case .transport: return "transport"
            }
        }

        /// The error as `print`, string interpolation, `String(reflecting:)` and Foundation show it.
        var texts: [String] {
            guard let error else { return [] }
            return [
                error.description, "\(error)", String(reflecting: error), error.localizedDescription, "\([error])",
                "\(Optional(error) as Any)",
            ]
        }
    }

    /// The engine with the real `oauth2` plugin (client secret from the given environment) on a
    /// virtual clock, over a server that echoes every credential it is sent back in its answers'
    /// headers and bodies; events go to an ``EventLog`` and to two `log` observers (info and debug)
    /// whose lines are kept.
    struct RedactionRig {
        enum TokenEndpoint { case rotates, rejects }

        static let tokenURL = URL(string: "https://auth.example.com/token") ?? testURL
        static let apiBase = "https://api.example.com"

        let clock = VirtualClock()
        let scheduler: SimulationScheduler
        let engine: PolicyEngine
        let transport: RecordingTransport
        let store: MemoryCredentialStore
        let events = EventLog()
        let logLines = Locked<[String]>([])

        init(
            signing: SecretRedactionTests.Signing, tokenEndpoint: TokenEndpoint,
            environment: [String: String] = ["APP_CLIENT_SECRET": Planted.clientSecret]
        ) throws {
            let policy = """
                policy: 1
                name: redaction
                classify: { code: body.status }
                rules:
                  - { name: token-expired, when: { code: [1401] }, then: refresh }
                  - { name: forced-logout, when: { code: [202] }, then: logout }
                  - { name: forbidden, when: { status: [403] }, then: fail }
                  - { name: transient, when: { status: [503], error: [connection] }, then: retry }
                \(signing.policy)
                refresh:
                  use: oauth2
                  with:
                    token-url: \(Self.tokenURL.absoluteString)
                    client-id: app
                    client-secret-env: APP_CLIENT_SECRET
                  on-failure: fail
                retry: { max-retries: 1, backoff: constant, initial: 100ms, on-exhausted: fail }
                logout: { cooldown: 1s }
                """
            scheduler = SimulationScheduler(clock: clock, externalWorkGracePeriod: .zero)
            transport = RecordingTransport { [clock] request, _ in
                try await clock.sleep(until: clock.now + .milliseconds(50))
                return try Self.serve(request, tokenEndpoint: tokenEndpoint)
            }
            store = MemoryCredentialStore(
                Credentials(accessToken: Planted.accessToken, refreshToken: Planted.refreshToken))
            var options = PolicyEngine.Options()
            options.clock = clock
            options.taskExecutor = scheduler.executor
            options.random = SeededRandomSource(seed: 7)
            options.environment = environment
            let lines = logLines
            let keep: @Sendable (String) -> Void = { line in lines.withLock { $0.append(line) } }
            options.observers = [events, LogObserver(debug: true, write: keep), LogObserver(debug: false, write: keep)]
            engine = PolicyEngine(
                policy: try Policy.load(yaml: policy), transport: transport, credentials: store, options: options)
        }

        /// Sends one GET per path, one after the other, each with the caller's own Authorization
        /// header (replaced by the `bearer` authorizer, kept by the others).
        func run(_ paths: [String]) async throws -> [Outcome] {
            let engine = engine
            let outcomes = try await scheduler.runDetached { () -> [Outcome] in
                var outcomes: [Outcome] = []
                for (index, path) in paths.enumerated() {
                    let url = URL(string: Self.apiBase + path) ?? testURL
                    let request = HTTPRequest(
                        url: url, headers: ["Authorization": "Bearer \(Planted.callerToken)"], id: "c\(index + 1)")
                    do throws(PolicyEngineError) {
                        outcomes.append(Outcome(.success(try await engine.send(request))))
                    } catch {
                        outcomes.append(Outcome(.failure(error)))
                    }
                }
                return outcomes
            }
            #expect(engine.debugSnapshot.leftovers == 0)
            return outcomes
        }

        /// The token endpoint, and an API that answers by path; both echo the request.
        static func serve(_ request: HTTPRequest, tokenEndpoint: TokenEndpoint) throws -> HTTPResponse {
            let echo = wireText(request)
            let headers: HTTPHeaders = ["X-Echo": echo, "Set-Cookie": "echo=\(echo)"]
            func json(_ status: Int, _ fields: String) -> HTTPResponse {
                HTTPResponse(
                    status: status, headers: headers, body: Data("{\(fields),\"echo\":\(PolicyEvent.quote(echo))}".utf8)
                )
            }
            if request.url == tokenURL {
                switch tokenEndpoint {
                case .rotates:
                    return json(
                        200,
                        #""access_token":"\#(Planted.rotatedAccess)","refresh_token":"\#(Planted.rotatedRefresh)","#
                            + #""token_type":"Bearer","expires_in":3600"#)
                case .rejects: return json(400, #""error":"invalid_grant","error_description":"dead token""#)
                }
            }
            switch request.path {
            case "/expired": return json(200, echo.contains(Planted.rotatedAccess) ? #""status":0"# : #""status":1401"#)
            case "/forbidden": return json(403, #""status":0"#)
            case "/busy": return json(503, #""status":0"#)
            case "/revoked": return json(200, #""status":202"#)
            default: throw TransportError(.connection, "connection reset")
            }
        }

        /// Everything of a request that can carry a credential: URL, headers, body.
        static func wireText(_ request: HTTPRequest) -> String {
            let headers = request.headers.fields.map { "\($0.name): \($0.value)" }.joined(separator: "; ")
            return "\(request.method) \(request.url.absoluteString) [\(headers)] "
                + String(decoding: request.body ?? Data(), as: UTF8.self)
        }

        /// The positive control: the secrets did reach the wire where they belong.
        func expectSecretsTravelled(
            signing: SecretRedactionTests.Signing, sourceLocation: SourceLocation = #_sourceLocation
        ) {
            let api = transport.requests.filter { $0.url != Self.tokenURL }
            let first = api.first.map(Self.wireText) ?? ""
            #expect(first.contains(Planted.accessToken), "signed with the access token", sourceLocation: sourceLocation)
            #expect(
                first.contains(Planted.callerToken) == (signing != .bearer),
                "the caller's header kept unless re-signed",
                sourceLocation: sourceLocation)
            let token = transport.requests.filter { $0.url == Self.tokenURL }.map(Self.wireText).joined()
            #expect(token.contains(Planted.refreshToken), "the refresh token was sent", sourceLocation: sourceLocation)
            #expect(
                token.contains(Planted.basicCredentials), "the client secret was sent", sourceLocation: sourceLocation)
        }

        func expectNoSecretInEventsOrLogs(sourceLocation: SourceLocation = #_sourceLocation) {
            let all = events.events
            #expect(!all.isEmpty, sourceLocation: sourceLocation)
            var texts = all.map(\.jsonLine) + all.map { String(describing: $0) } + all.map { String(reflecting: $0) }
            texts += all.flatMap { [$0.request, $0.code, $0.rule, $0.reason].compactMap { $0 } }
            texts += logLines.withLock { $0 }
            expectNoSecret(in: texts, "events and logs", sourceLocation: sourceLocation)
            if let credentials = try? store.load() {
                expectNoSecret(
                    in: [credentials.description, String(reflecting: credentials)], "credentials",
                    sourceLocation: sourceLocation)
            }
        }
    }
}
