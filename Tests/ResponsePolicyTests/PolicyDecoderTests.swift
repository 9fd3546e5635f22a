import Foundation
import TestSupport
import Testing

@testable import ResponsePolicy

struct PolicyDecoderTests {
    let header = "policy: 1\nname: demo\n"

    @Test func defaultsMatchTheSpecification() throws {
        let policy = try validPolicy(header)
        #expect(policy.retry.maxRetries == 3)
        #expect(policy.retry.backoff == .exponential)
        #expect(policy.retry.initial == .seconds(1))
        #expect(policy.retry.multiplier == 2)
        #expect(policy.retry.maxDelay == .seconds(30))
        #expect(policy.retry.jitter == .none)
        #expect(policy.retry.honorRetryAfter)
        #expect(policy.retry.attemptTimeout == .seconds(10))
        #expect(policy.retry.methods == ["GET", "HEAD", "PUT", "DELETE", "OPTIONS"])
        #expect(policy.retry.idempotencyKey == "Idempotency-Key")
        #expect(policy.retry.onExhausted == .deliver)
        #expect(policy.retry.deadline == .seconds(120))
        #expect(policy.retry.budget == .init(ratio: 0.2, min: 100))
        #expect(policy.refresh.plugin == nil)
        #expect(policy.refresh.timeout == .seconds(10))
        #expect(policy.refresh.shareWindow == .zero)
        #expect(policy.refresh.maxPerRequest == 1)
        #expect(policy.refresh.onExhausted == .logout)
        #expect(policy.refresh.onFailure == .logout)
        #expect(policy.refresh.limit == .init(count: 5, per: .seconds(30)))
        #expect(policy.refresh.ahead == .seconds(30))
        #expect(policy.logout.plugin.name == "none")
        #expect(policy.logout.cancelInFlight)
        #expect(policy.logout.cooldown == .seconds(20))
        #expect(policy.authorize.name == "bearer")
        #expect(policy.store.name == "memory")
        #expect(policy.classify == nil)
        #expect(policy.rules.isEmpty && policy.routes.isEmpty && policy.observe.isEmpty)
    }

    @Test(arguments: [
        ("250ms", Duration.milliseconds(250)), ("1s", .seconds(1)), ("1.5s", .milliseconds(1500)),
        ("2m", .seconds(120)), ("1h", .seconds(3600)), ("0s", .zero),
    ])
    func durationsWithUnits(_ text: String, _ expected: Duration) throws {
        let policy = try validPolicy(
            header + "logout: { cooldown: \(text) }\nrules: [{ when: { status: [403] }, then: logout }]\n")
        #expect(policy.logout.cooldown == expected)
        #expect(expected.policyText == (text == "1.5s" ? "1.5s" : text))
    }

    @Test func bareNumberDurationSaysWhatToWrite() {
        #expect(
            renderedErrors(header + "logout:\n  cooldown: 20\n")
                == "test.yaml:4:13: error: 'cooldown' needs a unit; a bare number could be seconds or milliseconds: write 20s or 20ms [invalid-duration]"
        )
    }

    @Test func unknownKeysGetADidYouMeanHint() {
        #expect(
            rendered(header + "retyr: {}\n")
                == "test.yaml:3:1: error: unknown key 'retyr'; did you mean 'retry'? [unknown-key]")
        #expect(
            renderedErrors(header + "retry: { max-retires: 2 }\n")
                == "test.yaml:3:10: error: unknown key 'max-retires'; did you mean 'max-retries'? [unknown-key]")
    }

    @Test func xPrefixedTopLevelKeysAreIgnoredSoTheyCanHoldAnchors() throws {
        let policy = try validPolicy(
            header
                + "x-shared: &fast { max-retries: 1, backoff: constant }\nretry: *fast\nrules: [{ when: { status: [503] }, then: retry }]\n"
        )
        #expect(policy.retry.maxRetries == 1)
        #expect(policy.retry.backoff == .constant)
    }

    @Test func statusesCodesAndRanges() throws {
        let policy = try validPolicy(
            header + """
                classify: { code: body.status }
                rules:
                  - { name: a, when: { status: [502, "520-599"], code: [1401, "E42"] }, then: retry }
                """)
        #expect(policy.rules[0].when.statuses == [StatusRange(502), StatusRange(520, 599)])
        #expect(policy.rules[0].when.codes == ["1401", "E42"])
    }

    @Test func quotedAndPlainCodesAreTheSameCode() {
        let found = findings(
            header + """
                classify: { code: body.status }
                rules:
                  - { name: a, when: { code: [1401] }, then: fail }
                  - { name: b, when: { code: ["1401"] }, then: deliver }
                """)
        // Rule b is also wholly shadowed by rule a.
        #expect(found.map(\.rule) == ["shadowed-rule", "conflicting-codes"])
    }

    @Test func yaml11BooleansAreNotBooleans() {
        #expect(
            rendered(header + "logout: { cancel-in-flight: no }\nrules: [{ when: { status: [403] }, then: logout }]\n")
                == "test.yaml:3:29: error: 'cancel-in-flight' must be true or false; write false instead of 'no' [invalid-type]"
        )
    }

    @Test func ruleThenMappingOverridesItsSection() throws {
        let policy = try validPolicy(
            header + """
                retry: { max-retries: 3, initial: 1s }
                rules:
                  - { name: slow, when: { status: [503] }, then: { do: retry, max-retries: 5, backoff: constant, initial: 500ms } }
                  - { name: other, when: { status: [502] }, then: retry }
                """)
        let scope = policy.graph.scope(method: "GET", path: "/")
        #expect(scope.retry(for: policy.rules[0]).maxRetries == 5)
        #expect(scope.retry(for: policy.rules[0]).initial == .milliseconds(500))
        #expect(scope.retry(for: policy.rules[1]).maxRetries == 3)
    }

    @Test func routesMergeOverTheTopLevel() throws {
        let policy = try validPolicy(
            header + """
                retry: { max-retries: 3, initial: 2s }
                rules:
                  - { name: busy, when: { status: [503] }, then: { do: retry, backoff: constant } }
                routes:
                  - match: { path: "/oauth/*" }
                    rules: []
                  - match: { path: "/upload/*", method: [POST] }
                    retry: { max-retries: 0 }
                """)
        let oauth = policy.graph.scope(method: "GET", path: "/oauth/token")
        #expect(oauth.rules.isEmpty)
        let upload = policy.graph.scope(method: "POST", path: "/upload/a")
        #expect(upload.retry.maxRetries == 0)
        #expect(upload.retry.initial == .seconds(2))
        // The top-level rule's override is re-applied over the route's retry section.
        #expect(upload.retry(for: upload.rules[0]).maxRetries == 0)
        #expect(upload.retry(for: upload.rules[0]).backoff == .constant)
        #expect(policy.graph.scope(method: "GET", path: "/upload/a").id == "default")
    }

    @Test func pluginOptionsAreCheckedAgainstTheirSchema() {
        let text =
            header + """
                refresh:
                  use: oauth2
                  with: { token-url: "https://auth.example.com/token", client-idd: app }
                logout: { use: none }
                rules: [{ when: { status: [401], header: { WWW-Authenticate: '*invalid_token*' } }, then: refresh }]
                """
        #expect(
            rendered(text) == """
                test.yaml:5:3: error: refresh plugin 'oauth2' needs the option 'client-id' (sent as client_id) [missing-plugin-option]
                test.yaml:5:56: error: refresh plugin 'oauth2' has no option 'client-idd'; did you mean 'client-id'? [unknown-plugin-option]
                """)
    }

    /// Lint accepts a URL exactly when the plugin will (http or https with a host), and refuses
    /// one that carries a secret.
    @Test(
        arguments: [
            ("http://ab", "insecure-endpoint"),
            ("http://localhost:8080/token", nil),
            ("https://auth.example.com/token?realm=app", nil),
            ("HTTPS://AUTH.EXAMPLE.COM/t", nil),
            ("https://", "invalid-value"),
            ("ftp://auth.example.com/t", "invalid-value"),
            ("auth.example.com/token", "invalid-value"),
            ("https://app:hunter2@auth.example.com/t", "secret-in-policy"),
            ("https://auth.example.com/t?client_secret=hunter2", "secret-in-policy"),
            ("https://auth.example.com/t?x=1&api-key=hunter2", "secret-in-policy"),
        ] as [(String, String?)])
    func tokenURLsAreCheckedAsThePluginWillUseThem(url: String, rule: String?) {
        let text =
            header + "refresh: { use: oauth2, with: { token-url: \"\(url)\", client-id: app } }\n"
            + "logout: { use: none }\nrules: [{ when: { status: [401], header: { WWW-Authenticate: '*invalid_token*' } }, then: refresh }]\n"
        #expect(findings(text).map(\.rule) == (rule.map { [$0] } ?? []))
        if rule == nil {
            #expect(throws: Never.self) {
                try OAuth2Refresh(
                    configuration: PluginConfiguration(
                        name: "oauth2", options: ["token-url": .string(url), "client-id": .string("app")],
                        transport: RecordingTransport { _, _ in HTTPResponse(status: 200) }, environment: [:]))
            }
        }
        if rule == "secret-in-policy" {
            #expect(!rendered(text).contains("hunter2"), "the finding must not repeat the secret")
        }
    }

    @Test func credentialHeadersMustComeFromTheEnvironmentOrTheTokens() {
        func headers(_ map: String) -> String {
            header
                + "refresh: { use: http, with: { url: \"https://a.example.com/r\", token: body.token, headers: \(map) } }\n"
                + "logout: { use: none }\nrules: [{ when: { status: [401], header: { WWW-Authenticate: '*invalid_token*' } }, then: refresh }]\n"
        }
        #expect(findings(headers("{ X-Api-Key: hunter2 }")).map(\.rule) == ["secret-in-policy"])
        #expect(findings(headers("{ authorization: \"Basic aHVudGVyMg==\" }")).map(\.rule) == ["secret-in-policy"])
        #expect(!rendered(headers("{ X-Api-Key: hunter2 }")).contains("hunter2"))
        #expect(findings(headers("{ X-Api-Key: \"{env:API_KEY}\" }")).isEmpty)
        #expect(findings(headers("{ Authorization: \"Bearer {refresh_token}\", X-Client: mobile }")).isEmpty)
    }

    @Test func hostPluginsAreAcceptedOnceDeclared() {
        let text =
            header
            + "refresh: { use: my-sso, with: { realm: x } }\nlogout: { use: none }\nrules: [{ when: { status: [401], header: { WWW-Authenticate: '*invalid_token*' } }, then: refresh }]\n"
        #expect(findings(text).map(\.rule) == ["unknown-plugin"])
        var catalog = PluginCatalog()
        catalog.declare(.refresh, "my-sso")
        #expect(findings(text, catalog: catalog).isEmpty)
    }

    @Test func integerOverflowIsAPositionedError() {
        #expect(
            renderedErrors(header + "retry: { max-retries: 99999999999999999999999 }\n")
                == "test.yaml:3:23: error: 'max-retries' must be between 0 and 100, not 99999999999999999999999 [invalid-value]"
        )
    }

    @Test func everyProblemIsReportedNotJustTheFirst() {
        let found = findings(
            "policy: 1\nname: Bad Name\nretry: { max-retries: -1, backoff: progressive, jitter: lots }\nlogout: { cooldown: 5 }\n"
        )
        #expect(
            found.filter { $0.severity == .error }.map(\.rule)
                == ["invalid-name", "invalid-value", "invalid-value", "invalid-value", "invalid-duration"])
    }
}

struct EmbeddedDefaultPolicyTests {
    @Test func theEmbeddedDefaultIsTheShippedFile() throws {
        let file = try String(
            contentsOf: repositoryRoot.appendingPathComponent("policies/default.yaml"), encoding: .utf8)
        #expect(Policy.defaultPolicyText + "\n" == file || Policy.defaultPolicyText == file)
        let policy = try Policy.loadDefault()
        #expect(policy.name == "mobile-api")
        #expect(policy.warnings.isEmpty)
    }
}

struct RouteLintTests {
    @Test func aTopLevelSettingIsReportedOnceNotOncePerRoute() {
        let found = findings(
            """
            policy: 1
            name: routes
            retry: { methods: [GET, POST], backoff: exponential, max-delay: none, on-exhausted: retry }
            rules: [{ when: { status: [503] }, then: retry }]
            routes:
              - match: { path: "/a/*" }
              - match: { path: "/b/*" }
            """)
        #expect(found.filter { $0.rule == "post-retried" }.map(\.range.start) == [SourcePosition(line: 3, column: 19)])
        #expect(found.filter { $0.rule == "unbounded-backoff" }.count == 1)
        #expect(found.filter { $0.rule == "looping-edge" }.count == 1)
    }

    @Test func aRouteThatWritesTheSettingIsReportedAtTheRoute() {
        let found = findings(
            """
            policy: 1
            name: routes
            rules: [{ when: { status: [503] }, then: retry }]
            routes:
              - match: { path: "/a/*" }
                retry: { methods: [POST] }
            """)
        #expect(found.filter { $0.rule == "post-retried" }.map(\.range.start) == [SourcePosition(line: 6, column: 23)])
    }
}
