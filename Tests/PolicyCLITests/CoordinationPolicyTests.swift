import Foundation
import ResponsePolicy
import ResponsePolicyRedis
import Testing

@testable import PolicyCLI

/// The `coordination:` section: lint checks it, the registry makes its coordinator, explain says
/// what is shared and where.
struct CoordinationPolicyTests {
    static let rules =
        "rules: [{ name: missing-scope, when: { status: [401], header: { WWW-Authenticate: '*insufficient_scope*' } }, then: deliver }, { name: expired, when: { status: [401] }, then: refresh }]\n"
        + "refresh: { use: oauth2, with: { token-url: \"https://a.example.com/t\", client-id: app }, "
        + "on-failure: logout, on-exhausted: logout }\n"

    func lint(_ yaml: String) async throws -> CLIResult {
        let folder = try TemporaryDirectory()
        let file = try folder.write("p.yaml", "policy: 1\nname: api\n" + Self.rules + yaml)
        return try await runPolicy(["lint", file.path], in: folder.url)
    }

    @Test func aRedisSectionWithEveryOptionLintsClean() async throws {
        let result = try await lint(
            """
            coordination:
              use: redis
              with:
                url: redis://127.0.0.1:6379/0
                key: mobile-api
                lease: 15s
                connect-timeout: 250ms
                password-env: REDIS_PASSWORD
            """)
        #expect(result.status == 0, "\(result.stdout)")
        #expect(!result.stdout.contains("warning:"))
    }

    @Test func aLiteralPasswordAnUnknownKeyAndAPasswordInTheURLAreErrors() async throws {
        let result = try await lint(
            """
            coordination:
              use: redis
              with:
                url: redis://:hunter2@127.0.0.1:6379/0
                key: mobile-api
                password: hunter2
                leese: 15s
            """)
        #expect(result.status == 1)
        let lines = result.stdout.split(separator: "\n").map(String.init)
        #expect(
            lines.contains {
                $0.hasSuffix(
                    "p.yaml:8:10: error: 'url' carries a password; a secret belongs in the environment: name it with 'password-env' [secret-in-policy]"
                )
            })
        #expect(
            lines.contains {
                $0.hasSuffix(
                    "p.yaml:10:5: error: 'password' would put a secret in the policy file; store it in an environment variable and name that with 'password-env' [secret-in-policy]"
                )
            })
        #expect(
            lines.contains {
                $0.hasSuffix(
                    "p.yaml:11:5: error: coordination plugin 'redis' has no option 'leese'; did you mean 'lease'? [unknown-plugin-option]"
                )
            }, "\(lines)")
        #expect(!result.stdout.contains("hunter2"))
    }

    @Test func aRemoteRedisWithoutTLSIsAWarning() async throws {
        let result = try await lint(
            "coordination: { use: redis, with: { url: \"redis://10.1.2.3:6379/0\", key: api } }\n")
        #expect(result.status == 0)
        #expect(
            result.stdout.contains(
                "p.yaml:5:42: warning: 'url' reaches '10.1.2.3' over plain TCP; the shared tokens would cross the network in clear: use a TLS tunnel (stunnel, spiped) on a loopback port [coordination-without-tls]"
            ), "\(result.stdout)")
        #expect(
            try await lint("coordination: { use: redis, with: { url: \"redis://10.1.2.3:6379/0\", key: api } }\n")
                .status == 0
        )
        let strict = try TemporaryDirectory()
        let file = try strict.write(
            "p.yaml",
            "policy: 1\nname: api\n" + Self.rules
                + "coordination: { use: redis, with: { url: \"redis://10.1.2.3:6379/0\", key: api } }\n")
        #expect(try await runPolicy(["lint", "--strict", file.path]).status == 1)
    }

    @Test(arguments: [
        ("coordination: { use: redis, with: { key: api } }\n", "needs the option 'url'"),
        ("coordination: { use: redis, with: { url: \"http://127.0.0.1/\" } }\n", "'url' must be redis://"),
        ("coordination: { use: zookeeper }\n", "unknown coordination plugin 'zookeeper'"),
        ("coordination: { use: file, with: { lease: soon } }\n", "'lease' is not a duration"),
        ("coordination: { with: { path: x } }\n", "'with' gives options, but no plugin is named with 'use'"),
        ("coordination: { use: local, colour: blue }\n", "unknown key 'colour'"),
    ])
    func aBadSectionIsAPositionedError(_ yaml: String, _ message: String) async throws {
        let result = try await lint(yaml)
        #expect(result.status == 1)
        #expect(result.stdout.contains("p.yaml:5:"), "\(result.stdout)")
        #expect(result.stdout.contains(message), "\(result.stdout)")
    }

    @Test func aHostPluginIsDeclaredLikeAnyOther() async throws {
        let folder = try TemporaryDirectory()
        let file = try folder.write(
            "p.yaml", "policy: 1\nname: api\n" + Self.rules + "coordination: { use: etcd, with: { endpoints: x } }\n")
        #expect(try await runPolicy(["lint", file.path]).status == 1)
        #expect(try await runPolicy(["lint", "--plugin", "coordination:etcd", file.path]).status == 0)
    }

    /// The core does not link hiredis: a program without ResponsePolicyRedis gets a positioned
    /// error naming the product, from the registry and from `problems(in:)` (engine.problems).
    @Test func redisWithoutItsProductIsAPositionedErrorNamingTheProduct() throws {
        let yaml =
            "policy: 1\nname: api\n" + Self.rules
            + "coordination: { use: redis, with: { url: \"redis://127.0.0.1:7000/2\" } }\n"
        let policy = try Policy.load(yaml: yaml, file: "api.yaml")
        let registry = PluginRegistry()
        do {
            _ = try registry.makeCoordinator(for: policy, environment: [:])
            Issue.record("a redis coordinator was made without ResponsePolicyRedis")
        } catch {
            #expect(error.reason.contains(".product(name: \"ResponsePolicyRedis\""), "\(error.reason)")
            #expect(error.range?.start.line == yaml.split(separator: "\n").count, "\(String(describing: error.range))")
        }
        let problems = registry.problems(in: policy, environment: [:])
        #expect(
            problems.contains { $0.kind == .coordination && $0.reason.contains("ResponsePolicyRedis") }, "\(problems)")
        var linked = registry
        RedisCoordination.register(in: &linked)
        #expect(linked.problems(in: policy, environment: [:]).isEmpty)
    }

    @Test func theRegistryMakesTheNamedCoordinator() throws {
        var registry = PluginRegistry()
        RedisCoordination.register(in: &registry)
        func make(_ yaml: String, environment: [String: String] = [:], credentials: String? = nil) throws
            -> any SessionCoordinator
        {
            let policy = try Policy.load(yaml: "policy: 1\nname: api\n" + Self.rules + yaml)
            return try registry.makeCoordinator(for: policy, environment: environment, credentialsPath: credentials)
        }
        #expect(try make("") is LocalSessionCoordinator)
        let redis = try make(
            "coordination: { use: redis, with: { url: \"redis://127.0.0.1:7000/2\", lease: 2s, password-env: PW } }\n",
            environment: ["PW": "pw"])
        let configuration = (redis as? RedisSessionCoordinator)?.configuration
        #expect(configuration == .init(url: "redis://127.0.0.1:7000/2", key: "api", lease: .seconds(2), password: "pw"))
        #expect(throws: PluginError.self) {
            try make("coordination: { use: redis, with: { url: \"redis://127.0.0.1:7000/2\", password-env: PW } }\n")
        }
        let file = try make("coordination: { use: file }\n", credentials: "/tmp/creds.json")
        #expect((file as? FileSessionCoordinator)?.configuration.path == "/tmp/creds.json")
        let fromStore = try make("coordination: { use: file }\nstore: { use: file, with: { path: /var/c.json } }\n")
        #expect((fromStore as? FileSessionCoordinator)?.configuration.path == "/var/c.json")
        do {
            _ = try make("coordination: { use: file }\n")
            Issue.record("a file coordinator without a file was made")
        } catch {
            #expect("\(error)".contains("'file' coordination shares a credentials file"))
        }
        var custom = registry
        custom.register(coordination: "mine") { _ in LocalSessionCoordinator() }
        let policy = try Policy.load(
            yaml: "policy: 1\nname: api\n" + Self.rules + "coordination: { use: mine }\n", plugins: custom.catalog)
        #expect(try custom.makeCoordinator(for: policy) is LocalSessionCoordinator)
    }

    @Test func explainSaysWhatIsSharedAndWhere() async throws {
        let folder = try TemporaryDirectory()
        let file = try folder.write(
            "p.yaml",
            "policy: 1\nname: api\n" + Self.rules
                + "coordination: { use: redis, with: { url: \"redis://127.0.0.1:6379/0\", key: mobile-api, lease: 10s } }\n"
        )
        let result = try await runPolicy(["explain", file.path])
        #expect(result.status == 0)
        #expect(
            try explanation(ofFile: file.path).contains(
                """
                Shared session (coordination: redis):
                  Every process using key 'mobile-api' on redis://127.0.0.1:6379/0 shares one session: its credentials and their generation, one refresh at a time (a lease of 10s; a holder that dies delays the others by at most that), the logout cooldown, refresh.limit and a token endpoint's Retry-After (no process calls before it ends). A request that triggers no refresh or logout never contacts Redis (news arrives by subscription). When the store does not answer within 250ms, a refresh waits for it (on-unavailable: wait) up to refresh.timeout (10s), then its requests fail with the reason; nobody is logged out and no process refreshes alone.
                """), "\(result.stdout)")
        let local = try folder.write("l.yaml", "policy: 1\nname: api\n" + Self.rules)
        #expect(!(try await runPolicy(["explain", local.path]).stdout.contains("Shared session")))
    }
}
