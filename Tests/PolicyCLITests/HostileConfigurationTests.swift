import Foundation
import Testing

@testable import ResponsePolicy

/// The smaller findings of issue 32 that a policy or its environment causes, through the built
/// binary: each is said by lint (or `--check-env`) before it can cost anything at run time.
struct HostileConfigurationTests {
    static func classifyPolicy(_ path: String) -> String {
        """
        policy: 1
        name: x
        classify: { code: "\(path)" }
        rules: [{ name: expired, when: { code: [1401] }, then: fail }]
        """
    }

    @Test(arguments: [
        (
            "body.status[0]",
            "'code' reads a field or an array item after a dot: write 'body.status.0', not 'body.status[0]'"
        ),
        (
            "body.*",
            "'code' names one field; a wildcard ('*') matches no field here: name it, like body.status or body.errors.0.code"
        ),
        (
            "body.__proto__",
            "'__proto__' is not a field a server can send: JavaScript's JSON.parse and most JSON libraries treat it apart, so 'body.__proto__' never finds a code"
        ),
        ("body.$.status", "'code' starts at the body: write 'body.status', without '$'"),
    ])
    func aCodePathFromAnotherLanguageIsAnError(_ path: String, _ message: String) async throws {
        let folder = try TemporaryDirectory()
        let policy = try folder.write("policy.yaml", Self.classifyPolicy(path))
        let run = try await runPolicy(["lint", policy.path])
        #expect(run.status == 1)
        #expect(run.stdout.contains("\(policy.path):3:19: error: \(message) [invalid-value]"), "\(run.stdout)")
    }

    @Test func aPlainCodePathIsFine() async throws {
        let folder = try TemporaryDirectory()
        let policy = try folder.write("policy.yaml", Self.classifyPolicy("body.errors.0.code"))
        let run = try await runPolicy(["lint", policy.path])
        #expect(run.status == 0, "\(run.stdout)")
    }

    /// Issue 32: `redis://127.0.0.1.evil.example` is a name anyone can register, not loopback.
    @Test func aRedisNameThatStartsLikeLoopbackGetsTheTLSWarning() async throws {
        let folder = try TemporaryDirectory()
        let policy = try folder.write(
            "policy.yaml",
            """
            policy: 1
            name: fleet
            coordination: { use: redis, with: { url: "redis://127.0.0.1.evil.example:6379/0", signing-key-env: K } }
            rules: []
            """)
        let run = try await runPolicy(["lint", policy.path])
        #expect(
            run.stdout.contains("over plain TCP") && run.stdout.contains("[coordination-without-tls]"), "\(run.stdout)")
        #expect(!RedisEndpoint(host: "127.0.0.1.evil.example", port: 1, database: 0, tls: false).isLoopback)
        #expect(RedisEndpoint(host: "127.0.0.9", port: 1, database: 0, tls: false).isLoopback)
        #expect(RedisEndpoint(host: "[::1]", port: 1, database: 0, tls: false).isLoopback)
    }

    /// Issue 32: a 16-byte signing key of one repeated character was accepted.
    @Test(arguments: [
        ("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "is too easy to guess: it has 1 different character"),
        ("abababababababababababababababab", "is too easy to guess: it has 2 different characters"),
        ("short", "is shorter than 16 bytes"),
    ])
    func aWeakSigningKeyIsRefused(_ key: String, _ why: String) async throws {
        let folder = try TemporaryDirectory()
        let policy = try folder.write(
            "policy.yaml",
            """
            policy: 1
            name: fleet
            coordination: { use: file, with: { path: \(folder.url.path)/credentials.json, signing-key-env: FLEET_KEY } }
            rules: []
            """)
        var environment = ProcessInfo.processInfo.environment
        environment["FLEET_KEY"] = key
        let run = try await runExecutable(
            try policyBinary.get(), ["lint", "--check-env", policy.path], environment: environment)
        #expect(run.status == 1, "\(run.stdout)")
        #expect(run.stdout.contains("the key in 'FLEET_KEY' (signing-key-env) \(why)"), "\(run.stdout)")
        #expect(!run.stdout.contains(key) || key == "short")
        environment["FLEET_KEY"] = "Zq4v8XnR1tK0pLw9sB3yH6cD2mF7gJ5e"
        let good = try await runExecutable(
            try policyBinary.get(), ["lint", "--check-env", policy.path], environment: environment)
        #expect(good.status == 0, "\(good.stdout)")
    }

    /// Issue 32: a `headers:` value from `{env:X}` holding CR, LF, NUL or ESC passed
    /// `lint --check-env`, and the next request went out unsigned.
    @Test(arguments: [("a\r\nX-Injected: 1", "CR"), ("a\nb", "LF"), ("a\u{0}b", "NUL"), ("a\u{1B}[2Jb", "ESC")])
    func aHeaderValueWithAControlCharacterIsRefused(_ value: String, _ name: String) async throws {
        let folder = try TemporaryDirectory()
        let secretFile = try folder.write("secret", value)
        chmod(secretFile.path, 0o600)
        let policy = try folder.write(
            "policy.yaml",
            """
            policy: 1
            name: x
            rules: [{ name: expired, when: { status: [401] }, then: refresh }]
            refresh:
              use: http
              with:
                url: https://auth.example.com/refresh
                token: body.token
                headers: { X-Api-Key: "{env:API_KEY}", X-Other: "{file:\(secretFile.path)}" }
              on-failure: fail
              on-exhausted: fail
            """)
        // An environment variable cannot hold NUL: that case is the file's alone.
        let hasNUL = value.contains("\u{0}")
        var environment = ProcessInfo.processInfo.environment
        environment["API_KEY"] = hasNUL ? "fine" : value
        let run = try await runExecutable(
            try policyBinary.get(), ["lint", "--check-env", policy.path], environment: environment)
        #expect(run.status == 1, "\(run.stdout)")
        #expect(
            run.stdout.contains(
                "the environment variable 'API_KEY' named by the header 'X-Api-Key' holds a control character (\(name)); a header value cannot carry one"
            ) != hasNUL, "\(run.stdout)")
        #expect(
            run.stdout.contains(
                "the file '\(secretFile.path)' named by the header 'X-Other' holds a control character (\(name))"),
            "\(run.stdout)")
        #expect(!run.stdout.contains("X-Injected"))
    }

    /// The same refusal at start: an engine checking its plugins does not start with such a header.
    @Test func anEngineRefusesToStartWithAControlCharacterInAHeader() throws {
        let policy = try Policy.load(
            yaml: """
                policy: 1
                name: x
                rules: [{ name: expired, when: { status: [401] }, then: refresh }]
                refresh:
                  use: http
                  with: { url: "https://auth.example.com/refresh", token: body.token, headers: { X-Api-Key: "{env:API_KEY}" } }
                  on-failure: fail
                  on-exhausted: fail
                """)
        let registry = PluginRegistry()
        let problems = registry.problems(in: policy, environment: ["API_KEY": "key\r\nX-Injected: yes"])
        #expect(
            problems.map(\.reason) == [
                "the environment variable 'API_KEY' named by the header 'X-Api-Key' holds a control character (CR); a header value cannot carry one"
            ])
        #expect(registry.problems(in: policy, environment: ["API_KEY": "key\twith tab"]).isEmpty)
    }

    /// Issue 32: a simulated `reload:` of a policy whose plugin cannot be made said `ok: true`.
    @Test func aSimulatedReloadOfAPolicyWhosePluginCannotBeMadeIsRefused() async throws {
        let folder = try TemporaryDirectory()
        let policy = try folder.write("policy.yaml", "policy: 1\nname: a\nrules: []\n")
        try folder.write(
            "broken.yaml",
            """
            policy: 1
            name: broken
            rules: [{ name: expired, when: { status: [401] }, then: refresh }]
            refresh: { use: exec, with: { command: [/nonexistent/get-token] }, on-failure: fail, on-exhausted: fail }
            """)
        let script = try folder.write(
            "script.yaml",
            """
            requests:
              - { id: a, at: 10ms, responses: [{ status: 200 }] }
            reload:
              - { at: 1ms, policy: broken.yaml }
            """)
        let run = try await runPolicy(["simulate", policy.path, "--script", script.path, "--format", "json"])
        #expect(run.status == 0, "\(run.stderr)")
        #expect(
            run.stdoutLines.contains(
                #"{"t":0.001,"event":"reload","ok":false,"reason":"4:17: refresh plugin 'exec' cannot be made: the command '/nonexistent/get-token' does not exist or is not executable"}"#
            ), "\(run.stdout)")
    }
}

/// Issue 32: logout messages read "logged out by refresh failed" and "logged out: logged out by
/// another process".
struct LogoutWordingTests {
    @Test(arguments: [
        (LogoutReason.rule("forced-logout", response: nil), "logged out by rule 'forced-logout'"),
        (
            .refreshFailed("the token endpoint answered 400 (invalid_grant)", response: nil),
            "logged out because the token refresh failed: the token endpoint answered 400 (invalid_grant)"
        ),
        (.host("the user signed out"), "logged out by the host: the user signed out"),
        (.elsewhere(LogoutReason.elsewhereWithoutReason), "logged out by another process sharing the session"),
        (.elsewhere("rule session-revoked"), "logged out by another process sharing the session: rule session-revoked"),
    ])
    func everyLogoutReadsAsOneSentence(_ reason: LogoutReason, _ sentence: String) {
        let until = Date(timeIntervalSince1970: 1_700_000_000)
        #expect(
            PolicyEngineError.loggedOut(until: until, reason: reason).description
                == sentence + "; new requests fail until 2023-11-14T22:13:20Z")
        #expect(!sentence.contains("by refresh failed") && !sentence.contains("logged out: logged out"))
    }
}
