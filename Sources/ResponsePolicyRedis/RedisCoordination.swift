import Foundation
import ResponsePolicy

/// `coordination: redis`, the product that links hiredis: the core (`ResponsePolicy`) declares the
/// option schema, so lint, explain and the schema know `redis` in every program, but it makes a
/// Redis coordinator only in a program that installs this product.
///
/// Why a product of its own: every embedder of the core needed `libhiredis-dev` to build, even
/// with `coordination: local` (issue 19). `policy` installs it at start; a service that shares its
/// session on Redis adds the product and does the same:
///
/// ```swift
/// // Package.swift: .product(name: "ResponsePolicyRedis", package: "response-policy")
/// import ResponsePolicyRedis
/// RedisCoordination.install()   // once, before the first PluginRegistry()
/// ```
///
/// Without it, a policy that names `redis` loads and lints, and the engine reports a positioned
/// problem naming this product (refreshes wait and fail with it under `on-unavailable: wait`).
public enum RedisCoordination {
    /// Adds `coordination: redis` to every `PluginRegistry` made afterwards in this process.
    public static func install() {
        CoordinationBackends.install("redis", make)
    }

    /// Adds `coordination: redis` to `registry` alone.
    public static func register(in registry: inout PluginRegistry) {
        registry.register(coordination: "redis", make)
    }

    /// The factory: `with:` options to a ``RedisSessionCoordinator``.
    @Sendable static func make(_ config: CoordinatorConfiguration) throws -> any SessionCoordinator {
        guard let url = config.string("url") else { throw CoordinationError("'redis' coordination needs 'url'") }
        var password: String?
        if let variable = config.string("password-env") {
            guard let value = config.environment[variable], !value.isEmpty else {
                throw CoordinationError("the environment variable '\(variable)' (password-env) is not set")
            }
            password = value
        }
        return try RedisSessionCoordinator(
            .init(
                url: url, key: config.string("key") ?? config.policyName,
                lease: try config.duration("lease", default: .seconds(15)),
                connectTimeout: try config.duration("connect-timeout", default: .milliseconds(250)),
                password: password, signingKey: try config.signingKey()))
    }
}
