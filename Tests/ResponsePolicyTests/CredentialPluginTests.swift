import Foundation
import Testing

@testable import ResponsePolicy

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// The credential sources as values: the token requests each grant builds, secrets from files,
/// placeholders, the exec plugin's input and redaction, and lint's checks of the new options.
struct CredentialPluginTests {
    static let tokenURL = URL(string: "https://auth.example.com/token") ?? URL(fileURLWithPath: "/")

    func configuration(_ name: String, _ options: [String: PluginOption], _ environment: [String: String] = [:])
        -> PluginConfiguration
    {
        PluginConfiguration(name: name, options: options, transport: NoTransport(), environment: environment)
    }

    func oauth2(_ options: [String: PluginOption], _ environment: [String: String] = [:]) throws -> OAuth2Refresh {
        var all: [String: PluginOption] = [
            "token-url": .string(Self.tokenURL.absoluteString), "client-id": .string("svc"),
        ]
        all.merge(options) { $1 }
        return try OAuth2Refresh(configuration: configuration("oauth2", all, environment))
    }

    func body(_ request: HTTPRequest) -> String { String(decoding: request.body ?? Data(), as: UTF8.self) }

    // MARK: - oauth2

    @Test func clientCredentialsWithBasicAuthenticationAndEveryParameter() throws {
        let plugin = try oauth2(
            [
                "grant": .string("client_credentials"), "client-secret-env": .string("S"),
                "scope": .string("read write"), "audience": .string("https://api.example.com"),
                "resource": .string("https://api.example.com/v2"),
            ], ["S": "p@ss"])
        #expect(plugin.canSignIn)
        let request = plugin.request(refreshToken: nil)
        #expect(
            body(request)
                == "grant_type=client_credentials&client_id=svc&scope=read+write"
                + "&audience=https%3A%2F%2Fapi.example.com&resource=https%3A%2F%2Fapi.example.com%2Fv2")
        #expect(request.headers["Authorization"] == "Basic " + Data("svc:p%40ss".utf8).base64EncodedString())
        #expect(
            plugin.description
                == "OAuth2Refresh(https://auth.example.com/token, client 'svc', grant client_credentials, client secret <redacted>)"
        )
    }

    @Test func clientSecretPostPutsTheSecretInTheBodyInstead() throws {
        let plugin = try oauth2(
            [
                "grant": .string("client_credentials"), "client-secret-env": .string("S"),
                "client-auth": .string("client_secret_post"),
            ], ["S": "a b&c"])
        let request = plugin.request(refreshToken: nil)
        #expect(body(request) == "grant_type=client_credentials&client_id=svc&client_secret=a+b%26c")
        #expect(request.headers["Authorization"] == nil)
    }

    @Test func thePasswordGrantSendsTheUserAndPasswordFromTheEnvironment() throws {
        let plugin = try oauth2(
            ["grant": .string("password"), "username-env": .string("U"), "password-env": .string("P")],
            ["U": "alice", "P": "pa55 word"])
        #expect(plugin.canSignIn)
        #expect(
            body(plugin.request(refreshToken: nil))
                == "grant_type=password&username=alice&password=pa55+word&client_id=svc")
        #expect(!"\(plugin)".contains("pa55"))
        var dumped = ""
        dump(plugin, to: &dumped)
        #expect(!dumped.contains("pa55"))
    }

    @Test func theRefreshTokenGrantIsStillTheDefaultAndCannotSignIn() throws {
        let plugin = try oauth2([:])
        #expect(plugin.grant == .refreshToken)
        #expect(!plugin.canSignIn)
        #expect(body(plugin.request(refreshToken: "r1")) == "grant_type=refresh_token&refresh_token=r1&client_id=svc")
    }

    struct FactoryCase: Sendable, CustomTestStringConvertible {
        var name: String
        var options: [String: PluginOption]
        var environment: [String: String] = [:]
        var reason: String
        var testDescription: String { name }
    }

    static let factoryFailures: [FactoryCase] = [
        FactoryCase(
            name: "client_credentials without a secret", options: ["grant": .string("client_credentials")],
            reason:
                "the client_credentials grant needs the client secret: give 'client-secret-env' or 'client-secret-file'"
        ),
        FactoryCase(
            name: "both env and file",
            options: ["client-secret-env": .string("S"), "client-secret-file": .string("/x")], environment: ["S": "s"],
            reason: "give one of 'client-secret-env' and 'client-secret-file', not both"),
        FactoryCase(
            name: "password without its variables", options: ["grant": .string("password")],
            reason: "the password grant needs 'username-env' and 'password-env'"),
        FactoryCase(
            name: "an unset password variable",
            options: ["grant": .string("password"), "username-env": .string("U"), "password-env": .string("P")],
            environment: ["U": "alice"],
            reason: "the environment variable 'P' named by 'password-env' is not set"),
        FactoryCase(
            name: "an unknown grant", options: ["grant": .string("implicit")],
            reason: "the option 'grant' must be refresh_token, client_credentials or password"),
        FactoryCase(
            name: "a missing secret file", options: ["client-secret-file": .string("/nonexistent/secret")],
            reason: "the file '/nonexistent/secret' named by 'client-secret-file' does not exist"),
    ]

    @Test(arguments: factoryFailures)
    func oauth2FactoryFailures(_ testCase: FactoryCase) {
        let error = #expect(throws: PluginError.self) { try oauth2(testCase.options, testCase.environment) }
        #expect(error?.reason == testCase.reason)
    }

    // MARK: - Secret files

    @Test func aSecretFileLosesOneTrailingNewlineAndMustBePrivate() throws {
        try withDirectory { directory in
            let path = directory + "/secret"
            func read() throws(PluginError) -> String {
                try SecretSource.file(
                    path, configuration("oauth2", [:]), kind: .refresh, namedBy: "'client-secret-file'")
            }
            try Data("s3cret\n\n".utf8).write(to: URL(fileURLWithPath: path))
            chmod(path, 0o600)
            #expect(try read() == "s3cret\n")
            try Data("s3cret\r\n".utf8).write(to: URL(fileURLWithPath: path))
            #expect(try read() == "s3cret")
            chmod(path, 0o400)
            #expect(try read() == "s3cret")
            for mode: mode_t in [0o640, 0o604, 0o644] {
                chmod(path, mode)
                let error = #expect(throws: PluginError.self) { try read() }
                #expect(
                    error?.reason
                        == "the file '\(path)' named by 'client-secret-file' is readable by its group or others "
                        + "(mode \(String(mode, radix: 8))); chmod 600 it")
                #expect(error?.description.contains("s3cret") == false)
            }
            chmod(path, 0o600)
            try Data("\n".utf8).write(to: URL(fileURLWithPath: path))
            #expect(throws: PluginError.self) { try read() }
        }
    }

    @Test func aFIFOOrADirectoryIsNotReadAsASecret() throws {
        try withDirectory { directory in
            let fifo = directory + "/fifo"
            #expect(mkfifo(fifo, 0o600) == 0)
            for path in [fifo, directory] {
                let error = #expect(throws: PluginError.self) {
                    try SecretSource.file(path, configuration("http", [:]), kind: .refresh, namedBy: "x")
                }
                #expect(error?.reason == "the file '\(path)' named by x is not a regular file")
            }
        }
    }

    @Test func placeholdersAreResolvedOnceSoASecretIsSentAsWritten() throws {
        let options: [String: PluginOption] = [
            "url": .string("https://api.example.com/login"), "token": .string("body.auth_token"),
            "body": .map(["password": .string("{env:P}"), "nested": .map(["user": .string("{env:U}")])]),
        ]
        let plugin = try HTTPRefresh(
            configuration: configuration("http", options, ["P": "x{refresh_token}y", "U": "alice"]))
        #expect(plugin.canSignIn)
        let request = try plugin.request(for: nil)
        #expect(body(request) == #"{"nested":{"user":"alice"},"password":"x{refresh_token}y"}"#)

        let refreshing = try HTTPRefresh(
            configuration: configuration(
                "http", ["url": .string("https://api.example.com/refresh"), "token": .string("body.auth_token")]))
        #expect(!refreshing.canSignIn)
    }

    // MARK: - exec

    @Test func theExecPluginsInputNeverCarriesTheAccessTokenAndTheRefreshTokenOnlyWhenAsked() throws {
        let credentials = Credentials(
            accessToken: "at-1", refreshToken: "rt-1", expiresAt: Date(timeIntervalSince1970: 1_767_225_600))
        let base: [String: PluginOption] = ["command": .list([.string("/bin/sh")])]
        let plain = try ExecCommand(configuration("exec", base), kind: .refresh, defaultTimeout: .seconds(10))
        #expect(
            String(decoding: plain.input(kind: "refresh", reason: "ahead", credentials: credentials), as: UTF8.self)
                == #"{"version":1,"kind":"refresh","reason":"ahead","credentials":{"expires_at":"2026-01-01T00:00:00Z","has_refresh_token":true}}"#
                + "\n")
        var options = base
        options["pass-refresh-token"] = .bool(true)
        let passing = try ExecCommand(configuration("exec", options), kind: .refresh, defaultTimeout: .seconds(10))
        let input = String(
            decoding: passing.input(kind: "refresh", reason: "sign-in", credentials: credentials), as: UTF8.self)
        #expect(input.contains(#""refresh_token":"rt-1""#))
        #expect(!input.contains("at-1"))
        #expect(
            String(decoding: passing.input(kind: "logout", reason: "forced-logout", credentials: nil), as: UTF8.self)
                == #"{"version":1,"kind":"logout","reason":"forced-logout"}"# + "\n")
    }

    @Test func stderrIsRedactedBeforeItIsQuoted() throws {
        let command = try ExecCommand(
            configuration("exec", ["command": .list([.string("/bin/sh")])]), kind: .refresh,
            defaultTimeout: .seconds(10))
        let credentials = Credentials(accessToken: "short", refreshToken: "rt-abc")
        #expect(
            command.redact("denied for rt-abc: bad (ghp_0123456789abcdefghij0123) ok", credentials)
                == "denied for <redacted>: bad (<redacted>) ok")
        #expect(command.redact("no such user", nil) == "no such user")
    }

    @Test func theExecCommandIsFoundInPathOrRefused() throws {
        let found = try ExecCommand(
            configuration(
                "exec", ["command": .list([.string("sh"), .string("-c"), .string("true")])], ["PATH": "/usr/bin:/bin"]),
            kind: .refresh, defaultTimeout: .seconds(10))
        #expect(found.arguments.first?.hasSuffix("/sh") == true)
        #expect(found.arguments.dropFirst() == ["-c", "true"])
        let missing = #expect(throws: PluginError.self) {
            try ExecCommand(
                configuration("exec", ["command": .list([.string("no-such-tool-xyz")])], ["PATH": "/usr/bin:/bin"]),
                kind: .refresh, defaultTimeout: .seconds(10))
        }
        #expect(missing?.reason == "the command 'no-such-tool-xyz' is not found in PATH")
        let empty = #expect(throws: PluginError.self) {
            try ExecCommand(
                configuration("exec", ["command": .string("get-token --x")]), kind: .refresh,
                defaultTimeout: .seconds(1))
        }
        #expect(empty?.reason == "the option 'command' must be a list: the program, then its arguments")
    }

    // MARK: - Lint

    @Test func lintChecksTheNewOptions() {
        let header = "policy: 1\nname: t\nrules: [{ when: { status: [401] }, then: refresh }]\n"
        #expect(
            renderedErrors(
                header
                    + "refresh: { use: oauth2, with: { token-url: \"https://a.example.com/t\", client-id: a, grant: client_credential } }\n"
            )
                == "test.yaml:4:92: error: 'grant' must be one of 'refresh_token', 'client_credentials', 'password', not "
                + "'client_credential'; did you mean 'client_credentials'? [invalid-value]")
        #expect(
            renderedErrors(
                header
                    + "refresh: { use: oauth2, with: { token-url: \"https://a.example.com/t\", client-id: a, password: hunter2 } }\n"
            )
                == "test.yaml:4:85: error: 'password' would put a secret in the policy file; store it in an environment "
                + "variable and name that with 'password-env' [secret-in-policy]")
        #expect(
            renderedErrors(header + "refresh: { use: exec, with: { command: /usr/bin/get-token, timeout: 10 } }\n")
                .contains("[invalid-duration]"))
        #expect(
            renderedErrors(
                header
                    + "refresh: { use: exec, with: { command: [/usr/bin/get-token], env: [HOME], pass-refresh-token: true } }\n"
            )
                == "")
        #expect(
            renderedErrors(
                header
                    + "refresh: { use: http, with: { url: \"https://a.example.com/l\", token: body.t, headers: { Authorization: \"{file:/run/secrets/k}\" } } }\n"
            ) == "")
    }

    private func withDirectory(_ body: (String) throws -> Void) throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("rp-cp-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try body(directory)
    }
}

/// Signing in when nothing is stored, on the virtual clock: one refresh for every request that
/// starts together, no request sent unsigned, and a failed sign-in follows `on-failure`.
struct SignInTests {
    final class SigningIn: RefreshPlugin {
        let calls = Locked(0)
        let fails: Bool
        init(fails: Bool = false) { self.fails = fails }
        var canSignIn: Bool { true }
        func refresh(_ context: RefreshContext) async throws -> Credentials {
            let call = calls.withLock { count in
                count += 1
                return count
            }
            #expect(context.reason == "sign-in")
            #expect(context.credentials == nil)
            try await context.clock.sleep(until: context.clock.now + .milliseconds(100))  // virtual time
            if fails { throw RefreshFailure("the token endpoint answered 401 (invalid_client)") }
            return Credentials(accessToken: "token-\(call)")
        }
    }

    static let policy = """
        policy: 1
        name: t
        rules: [{ name: unauthorized, when: { status: [401] }, then: refresh }]
        refresh: { use: oauth2, with: { token-url: "https://a.example.com/t", client-id: app }, on-failure: fail }
        """

    @Test func aHundredRequestsWithNothingStoredMakeOneSignIn() async throws {
        let transport = RecordingTransport { request, _ in
            request.headers["Authorization"] == "Bearer token-1" ? response("ok") : response("", status: 401)
        }
        let plugin = SigningIn()
        let rig = try SimulatedEngine(Self.policy, transport: transport, refresh: plugin, credentials: nil)
        let statuses = try await rig.run { engine in
            await withTaskGroup(of: Int.self) { group in
                for _ in 0..<100 {
                    group.addTask { (try? await engine.send(HTTPRequest(url: testURL)).status) ?? 0 }
                }
                return await group.reduce(into: []) { $0.append($1) }
            }
        }
        #expect(statuses == Array(repeating: 200, count: 100))
        #expect(plugin.calls.withLock { $0 } == 1)
        #expect(transport.requests.count == 100)
        #expect(transport.requests.allSatisfy { $0.headers["Authorization"] == "Bearer token-1" })
    }

    @Test func aFailedSignInFailsTheRequestsWithoutSendingThem() async throws {
        let transport = RecordingTransport { _, _ in response("ok") }
        let plugin = SigningIn(fails: true)
        let rig = try SimulatedEngine(Self.policy, transport: transport, refresh: plugin, credentials: nil)
        let errors = try await rig.run { engine in
            await withTaskGroup(of: PolicyEngineError?.self) { group in
                for _ in 0..<10 {
                    group.addTask {
                        do throws(PolicyEngineError) {
                            _ = try await engine.send(HTTPRequest(url: testURL))
                            return nil
                        } catch {
                            return error
                        }
                    }
                }
                return await group.reduce(into: []) { $0.append($1) }
            }
        }
        let expected = PolicyEngineError.refreshFailed(reason: "the token endpoint answered 401 (invalid_client)")
        #expect(errors == Array(repeating: expected, count: 10))
        #expect(plugin.calls.withLock { $0 } == 1)
        #expect(transport.requests.isEmpty)
    }
}
