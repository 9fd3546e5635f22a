// snippet: register-plugins
import ResponsePolicy
import ResponsePolicyURLSession
// snippet end

import Foundation

// The snippets of docs/service-guide.md, in its order. Each region is compared with the block
// the guide shows (DocsTests); the functions around them give the names the guide's prose
// assumes (`registry`, `policy`, `engine`, `policyURL`) and are never called.

// snippet: register-plugins

struct MySSORefresh: RefreshPlugin {
    let realm: String
    let sso: SSOClient   // your own client, captured by the plugin

    func refresh(_ context: RefreshContext) async throws -> Credentials {
        let (token, lifetime) = try await sso.newAccessToken(realm: realm)
        return Credentials(
            accessToken: token, refreshToken: context.credentials?.refreshToken,
            expiresAt: context.clock.date.addingTimeInterval(lifetime))
    }
}
// snippet end

func registerPluginsSnippet(sso: SSOClient) -> PluginRegistry {
    // snippet: register-plugins
    var registry = PluginRegistry()   // starts with the built-ins
    registry.register(
        refresh: "my-sso",
        schema: PluginSchema([.init("realm", .string, required: true, "the SSO realm")])
    ) { configuration in
        guard let realm = configuration.string("realm") else {
            throw PluginError(kind: .refresh, name: configuration.name, reason: "the option 'realm' is missing")
        }
        return MySSORefresh(realm: realm, sso: sso)
    }
    // snippet end
    return registry
}

func loadSnippet(policyURL: URL, registry: PluginRegistry) throws -> Policy {
    // snippet: load-with-catalog
    let policy = try Policy.load(contentsOf: policyURL, plugins: registry.catalog)
    // snippet end
    return policy
}

func sendSnippet(policy: Policy, registry: PluginRegistry, profileURL: URL) async {
    // snippet: send-through-the-engine
    let engine = PolicyEngine(
        policy: policy, transport: URLSessionTransport(timeout: .seconds(15)), plugins: registry,
        credentials: FileCredentialStore(path: "/var/lib/myservice/credentials.json"))

    do {
        let response = try await engine.send(HTTPRequest(url: profileURL))
        // a delivered response: refreshes and retries already happened
        _ = response
    } catch PolicyEngineError.loggedOut(let until, let reason) {
        // the session ended; sign in again, or wait until `until`. `reason` tells why:
        // .rule("forced-logout", response:)  a logout code (e.g. signed in elsewhere)
        // .refreshFailed(why, response:)     the refresh failed (e.g. invalid_grant)
        // .host(why)                         your own engine.logout(reason:)
        // .elsewhere(why)                    another process sharing the session logged out
        _ = (until, reason)
    } catch {
        // retries exhausted, refresh failed, deadline exceeded, cancelled, transport
    }
    // snippet end
}

func checkingSnippet(policy: Policy, registry: PluginRegistry) throws -> PolicyEngine {
    // snippet: start-up-checks
    // Throws PolicyError with one `plugin-unavailable` finding per plugin that cannot be made.
    let engine = try PolicyEngine(checking: policy, transport: URLSessionTransport(), plugins: registry)
    // snippet end
    return engine
}

func problemsSnippet(policy: Policy, registry: PluginRegistry, logger: SnippetLogger) -> PolicyEngine? {
    // snippet: start-up-problems
    // Or keep the non-throwing initializer and look:
    let engine = PolicyEngine(policy: policy, transport: URLSessionTransport(), plugins: registry)
    for problem in engine.problems { logger.critical("\(problem)") }   // PluginError, no secret values
    guard engine.problems.isEmpty else { exit(1) }
    // snippet end
    return engine
}

func diagnosticsSnippet(policyURL: URL, registry: PluginRegistry, logger: SnippetLogger) {
    // snippet: reading-diagnostics
    do {
        let policy = try Policy.load(contentsOf: policyURL, plugins: registry.catalog)
        for warning in policy.warnings {
            logger.warning("\(warning.range.start.line):\(warning.range.start.column): \(warning.message) [\(warning.rule)]")
        }
    } catch {
        for diagnostic in error.diagnostics where diagnostic.severity == .error {
            logger.error("\(diagnostic)")   // FILE:LINE:COL: error: MESSAGE [rule-id]
        }
    }
    // snippet end
}

func watcherSnippet(engine: PolicyEngine, policyURL: URL) {
    // snippet: policy-watcher
    let watcher = PolicyWatcher(engine: engine, url: policyURL)   // polls every 2s
    watcher.start()          // also reloads on SIGHUP: `kill -HUP <pid>` after a deploy
    // … the service runs …
    watcher.stop()
    // snippet end
}

// snippet: host-logout
struct HostSignOut: LogoutPlugin {
    let session: AppSession
    func logout(_ context: LogoutContext) async {
        // context.reason: the rule ('forced-logout') or 'refresh failed'
        await session.signOut(reason: context.reason)
    }
}
// snippet end

func hostLogoutSnippet(registry: inout PluginRegistry, session: AppSession) {
    // snippet: host-logout
    registry.register(logout: "host-signout", schema: PluginSchema([])) { _ in HostSignOut(session: session) }
    // snippet end
}

func exportSchemasSnippet(registry: PluginRegistry) throws {
    // snippet: export-schemas
    // e.g. in a test of your service, so the file never goes stale:
    let yaml = registry.exportSchemas()   // the host plugins only; built-ins are known to `policy`
    try yaml.write(toFile: "policies/plugins.yaml", atomically: true, encoding: .utf8)
    // snippet end
}

func metricsEngineSnippet(policy: Policy) -> (PolicyMetrics, PolicyEngine) {
    // snippet: metrics
    let metrics = PolicyMetrics()
    var options = PolicyEngine.Options()
    options.observers = [metrics]
    let engine = PolicyEngine(policy: policy, transport: URLSessionTransport(), options: options)
    metrics.attach(engine)  // its gauges (requests in flight, refresh waiters, cooldown) and policy name
    // snippet end
    return (metrics, engine)
}

/// What the service's HTTP server answers to `GET /metrics` (its own router calls this).
func metricsSnippet(policy: Policy, acceptHeader: String?) -> (String, String) {
    let (metrics, _) = metricsEngineSnippet(policy: policy)
    // snippet: metrics-endpoint
    // GET /metrics: the format the scraper asks for (Prometheus sends Accept: application/openmetrics-text).
    let format = PolicyMetrics.Format(accept: acceptHeader)
    let body = metrics.exposition(format)
    let contentType = format.contentType
    // snippet end
    return (body, contentType)
}
