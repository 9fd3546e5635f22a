import Foundation

extension PluginRegistry {
    /// What `policy lint --check-env` says of the coordination store's own settings (issue 30):
    /// a warning, rule `coordination-store-forgets`, for each way the store is set up to forget
    /// what the fleet shares (Redis evicting keys), asked of the store itself; nothing when the
    /// coordination is `local`, cannot be made (``problems(in:environment:onlyRegistered:)`` says
    /// why) or the store cannot be asked.
    package func coordinationStoreWarnings(
        in policy: Policy, environment: [String: String] = ProcessInfo.processInfo.environment
    ) -> [Diagnostic] {
        guard policy.coordination.name != "local", coordination[policy.coordination.name] != nil,
            let coordinator = try? makeCoordinator(for: policy, environment: environment)
        else { return [] }
        defer { coordinator.stop() }
        guard let check = coordinator as? any StoreSettingsCheck else { return [] }
        return check.storeSettingsWarnings().map {
            .warning("coordination-store-forgets", $0, at: policy.coordination.range ?? .fileStart)
        }
    }
}

/// What a coordinator factory is given: the policy's `coordination.with:` options, where this
/// process keeps its credentials, and the environment (for `password-env`).
public struct CoordinatorConfiguration: Sendable {
    /// The name the policy's `coordination: { use: }` gave.
    public let name: String
    /// The `with:` options, as written.
    public let options: [String: PluginOption]
    /// The credentials file (`store: file`, or `--credentials` for `policy fetch`), when there is one.
    public let credentialsPath: String?
    /// The policy's name: the default session key.
    public let policyName: String
    /// Environment variables, for secrets the options name (`password-env`).
    public let environment: [String: String]

    package init(
        name: String, options: [String: PluginOption], credentialsPath: String?, policyName: String,
        environment: [String: String]
    ) {
        self.name = name
        self.options = options
        self.credentialsPath = credentialsPath
        self.policyName = policyName
        self.environment = environment
    }

    /// A text option, `nil` when absent.
    public func string(_ key: String) -> String? { options[key]?.string }

    /// A duration option (`15s`, `250ms`), or `fallback` when absent.
    package func duration(_ key: String, default fallback: Duration) throws(CoordinationError) -> Duration {
        guard let text = string(key) else { return fallback }
        guard let duration = Duration.parsePolicy(text) else {
            throw CoordinationError("'\(key)' is not a duration: '\(text)'")
        }
        return duration
    }

    /// The key named by `signing-key-env` (nil when none is named), for a backend in another product.
    package func signingKey() throws(CoordinationError) -> Data? { try CoordinationPlugins.signingKey(self) }
}

/// Makes a coordinator from a policy's `coordination:` section.
public typealias CoordinatorFactory = @Sendable (CoordinatorConfiguration) throws -> any SessionCoordinator

/// The built-in coordinators, `local`, `file` and `redis`, with their option schemas. `redis` is
/// declared here (lint, explain and the schema know it in every program) but made by the
/// `ResponsePolicyRedis` product, which installs it in ``CoordinationBackends``.
enum CoordinationPlugins {
    static let schemas: [String: PluginSchema?] = [
        "local": PluginSchema.none,
        "file": PluginSchema([
            .init("path", .string, "the credentials file to share; the store's file (or --credentials) by default"),
            .init("lease", .duration, "how long a refresh lease lasts if its holder dies, 15s by default"),
            .init("connect-timeout", .duration, "the most a call waits for the lock file, 250ms by default"),
            onUnavailableOption, signingKeyOption,
        ]),
        "redis": PluginSchema(
            [
                .init("url", .string, required: true, "redis://host[:port][/db]"),
                .init("key", .string, "processes with the same key share one session; the policy name by default"),
                .init("lease", .duration, "how long a refresh lease lasts if its holder dies, 15s by default"),
                .init("connect-timeout", .duration, "the most any call waits for Redis, 250ms by default"),
                .init("password-env", .string, "the environment variable holding the Redis password"),
                onUnavailableOption, signingKeyOption,
            ],
            forbiddenSecrets: ["password": "password-env"]),
    ]

    /// `on-unavailable`, taken by every built-in store that can be unavailable.
    static let onUnavailableOption = PluginSchema.Option(
        "on-unavailable", .string,
        "what a refresh does while the store cannot be reached: wait (up to refresh.timeout; the default, "
            + "safe with single-use refresh tokens) or local (refresh in this process alone)",
        values: ["wait", "local"])

    /// `signing-key-env`, taken by every built-in store that shares credentials.
    static let signingKeyOption = PluginSchema.Option(
        "signing-key-env", .string,
        "the environment variable holding the fleet's shared key: every value read from the store (credentials "
            + "with their generation, leases, the cooldown, refresh.limit grants; the file store's whole record) is "
            + "used only when signed with it (HMAC-SHA256); anything else is refused as coordination trouble")

    /// The key named by `signing-key-env`, when set; an error when the variable is named but empty,
    /// holds fewer than ``minimumKeyBytes`` bytes (a short key can be guessed offline from any
    /// sealed value read from the store), or fewer than ``minimumDistinctKeyBytes`` different ones
    /// (`aaaaaaaaaaaaaaaa`, `abababab…`: a typed placeholder, not a key).
    static func signingKey(_ config: CoordinatorConfiguration) throws(CoordinationError) -> Data? {
        guard let variable = config.string("signing-key-env") else { return nil }
        guard let value = config.environment[variable], !value.isEmpty else {
            throw CoordinationError("the environment variable '\(variable)' (signing-key-env) is not set")
        }
        guard value.utf8.count >= minimumKeyBytes else {
            throw CoordinationError(
                "the key in '\(variable)' (signing-key-env) is shorter than \(minimumKeyBytes) bytes; use a random one "
                    + "of at least 32 (openssl rand -base64 32), the same in every process of the fleet")
        }
        let distinct = Set(value.utf8).count
        guard distinct >= minimumDistinctKeyBytes else {
            // Issue 32: 16 bytes of one repeated character passed the length check.
            throw CoordinationError(
                "the key in '\(variable)' (signing-key-env) is too easy to guess: it has \(distinct) different "
                    + "character\(distinct == 1 ? "" : "s"); use a random one of at least 32 (openssl rand -base64 32), "
                    + "the same in every process of the fleet")
        }
        return Data(value.utf8)
    }

    static let minimumKeyBytes = 16
    /// The fewest different bytes a key may have: a random key of 16 bytes or more has many more
    /// (16 random base64 characters have fewer than 8 different ones about once in 10^9).
    static let minimumDistinctKeyBytes = 8

    static func register(in registry: inout PluginRegistry) {
        registry.register(coordination: "local") { _ in LocalSessionCoordinator() }
        registry.register(coordination: "file") { config in
            guard let path = config.string("path") ?? config.credentialsPath else {
                throw CoordinationError(
                    "'file' coordination shares a credentials file: use 'store: file', pass --credentials, or set 'path'"
                )
            }
            return try FileSessionCoordinator(
                .init(
                    path: path, lease: try config.duration("lease", default: .seconds(15)),
                    connectTimeout: try config.duration("connect-timeout", default: .milliseconds(250)),
                    signingKey: try signingKey(config)))
        }
        for (name, backend) in CoordinationBackends.installed {
            registry.register(coordination: name, backend.factory)
        }
    }

    /// The built-in coordination names whose backend lives in a library product of its own, with
    /// that product: linking the core alone must not pull in its C library (hiredis).
    static let products = ["redis": "ResponsePolicyRedis"]

    /// Why `name` cannot be made in this program, when it is a built-in whose product is not linked.
    static func notLinked(_ name: String) -> String? {
        guard let product = products[name] else { return nil }
        return "'coordination: \(name)' is in the \(product) library product, which this program does not link: "
            + "add .product(name: \"\(product)\", package: \"response-policy\") to the target's dependencies "
            + "and call RedisCoordination.install() at start (policy does)"
    }
}

/// Coordination backends that library products add to every ``PluginRegistry`` made after they
/// install themselves: the registration point through which `ResponsePolicyRedis` provides
/// `coordination: redis` while the core links libyaml alone.
///
/// Why process-wide and not per registry: `policy` and a service make registries in many places
/// (lint, explain, fetch, each engine); a backend installed once at start is in all of them, so
/// the YAML that names it keeps working. A registry can still take a backend of its own with
/// ``PluginRegistry/register(coordination:schema:_:)``.
///
/// ```swift
/// import ResponsePolicyRedis
/// RedisCoordination.install()   // once, before the first PluginRegistry()
/// ```
///
/// Concurrency contract: `install` and `installed` may be called from any thread; the table lives
/// behind one lock. A registry made before `install` keeps what it had.
public enum CoordinationBackends {
    /// One installed backend.
    package struct Backend: Sendable {
        package let factory: CoordinatorFactory
        package init(_ factory: @escaping CoordinatorFactory) { self.factory = factory }
    }

    private static let table = Locked<[String: Backend]>([:])

    /// Adds `name` (for example `redis`) to every registry made afterwards; replaces an earlier one.
    public static func install(_ name: String, _ factory: @escaping CoordinatorFactory) {
        table.withLock { $0[name] = Backend(factory) }
    }

    /// The backends installed so far, by name.
    package static var installed: [String: Backend] { table.withLock { $0 } }
}

extension PluginRegistry {
    /// The coordinator the policy's `coordination:` names, ready for `start`: what `PolicyEngine`
    /// and `policy fetch` call at engine start.
    ///
    /// ```swift
    /// let coordinator = try registry.makeCoordinator(for: policy, credentialsPath: "credentials.json")
    /// ```
    ///
    /// - Parameters:
    ///   - policy: its `coordination:` section (`local` when absent).
    ///   - environment: where `password-env` is looked up; the process environment by default.
    ///   - credentialsPath: the credentials file this process uses (`--credentials`); the `file`
    ///     store's `path` when nil.
    /// - Throws: ``PluginError`` (kind `coordination`) when the plugin is unknown or its options
    ///   cannot be used (a password variable that is not set, a URL it cannot reach).
    package func makeCoordinator(
        for policy: Policy, environment: [String: String] = ProcessInfo.processInfo.environment,
        credentialsPath: String? = nil
    ) throws(PluginError) -> any SessionCoordinator {
        let reference = policy.coordination
        guard let factory = coordination[reference.name] else {
            throw PluginError(
                kind: .coordination, name: reference.name,
                reason: CoordinationPlugins.notLinked(reference.name) ?? "no such plugin is registered in this program",
                range: reference.range)
        }
        let storePath = policy.store.name == "file" ? policy.store.options["path"]?.string : nil
        let configuration = CoordinatorConfiguration(
            name: reference.name, options: reference.options, credentialsPath: credentialsPath ?? storePath,
            policyName: policy.name, environment: environment)
        do {
            return try factory(configuration)
        } catch let error as PluginError {
            throw error
        } catch {
            throw PluginError(kind: .coordination, name: reference.name, reason: "\(error)")
        }
    }
}

/// What a refresh does while the coordination store cannot be reached (`on-unavailable`).
package enum CoordinationFallback: String, Sendable {
    /// Ask the store again with backoff until `refresh.timeout`, then fail the requests waiting
    /// (never a logout). Safe with single-use refresh tokens: no process refreshes alone.
    case wait
    /// Refresh in this process alone: every process doing so presents the same refresh token,
    /// which a server with single-use (rotating) refresh tokens punishes by revoking the session.
    case local
}

extension Policy {
    /// `coordination.with.on-unavailable`; `wait` by default.
    package var coordinationOnUnavailable: CoordinationFallback {
        coordination.options["on-unavailable"]?.string.flatMap(CoordinationFallback.init(rawValue:)) ?? .wait
    }

    /// What `policy explain` says about `coordination:`: what is shared, and where. `nil` for
    /// `local` (nothing is shared).
    package var coordinationSummary: String? {
        let reference = coordination
        func text(_ key: String) -> String? { reference.options[key]?.string }
        let lease = text("lease") ?? "15s"
        let timeout = text("connect-timeout") ?? "250ms"
        switch reference.name {
        case "local":
            return nil
        case "file":
            let path = text("path").map { "'\($0)'" } ?? "the credentials file"
            return "Processes on this host that use \(path) share one session: its credentials and their generation, "
                + "one refresh at a time (a lease of \(lease)), the logout cooldown, refresh.limit and a token "
                + "endpoint's Retry-After (no process calls before it ends), kept in "
                + "\(path).shared under the lock \(path).lock. A request that triggers no refresh or logout never "
                + "touches these files. " + signingSentence + unavailableSentence(timeout)
        case "redis":
            let url = text("url").flatMap { try? RedisEndpoint.parse($0).get() }.map { "\($0)" } ?? "Redis"
            let key = text("key") ?? name
            return "Every process using key '\(key)' on \(url) shares one session: its credentials and their "
                + "generation, one refresh at a time (a lease of \(lease); a holder that dies delays the others by "
                + "at most that), the logout cooldown, refresh.limit and a token endpoint's Retry-After (no process "
                + "calls before it ends). A request that triggers no refresh or "
                + "logout never contacts Redis (news arrives by subscription). " + signingSentence
                + unavailableSentence(timeout)
        default:
            return "The session is shared through the host's coordination plugin '\(reference.name)'. "
                + unavailableSentence(timeout)
        }
    }

    /// With `signing-key-env`: what the key protects (said only when one is named).
    private var signingSentence: String {
        guard let variable = coordination.options["signing-key-env"]?.string else { return "" }
        return "Every value read from the store is used only when signed with the key in \(variable) (HMAC-SHA256); "
            + "a forged or replayed one is refused as coordination trouble, never a logout. "
    }

    private func unavailableSentence(_ timeout: String) -> String {
        switch coordinationOnUnavailable {
        case .wait:
            return "When the store does not answer within \(timeout), a refresh waits for it (on-unavailable: wait) "
                + "up to refresh.timeout (\(refresh.timeout.policyText)), then its requests fail with the reason; "
                + "nobody is logged out and no process refreshes alone."
        case .local:
            return "When the store does not answer within \(timeout), each process refreshes on its own "
                + "(on-unavailable: local) and reports a problem: with single-use refresh tokens that presents one "
                + "token several times and the server may revoke the session."
        }
    }
}

/// Whether `PolicyEngine` and `policy fetch` call the policy's coordinator (they do: the engine asks
/// `beginRefresh` before the refresh plugin, publishes after, and takes updates in as events). It
/// turns on the multi-process `policy fetch` end-to-end tests.
package enum CoordinationWiring {
    package static let engineUsesCoordinator = true
}
