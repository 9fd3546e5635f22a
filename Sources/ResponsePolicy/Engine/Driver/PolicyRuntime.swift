import Foundation

/// A policy with its plugins made: what one request runs under from start to end.
///
/// A reload builds a new runtime; requests in flight keep the one they started with.
final class PolicyRuntime: Sendable {
    /// The plugins of one scope (routes may name their own `authorize` and `refresh`).
    /// (A class: a request holds its scope's plugins by one reference, not four existentials.)
    final class ScopePlugins: Sendable {
        let authorize: (any AuthorizePlugin)?
        /// `nil` when the scope has no refresh plugin; a failure when it could not be made.
        let refresh: Result<any RefreshPlugin, PluginError>?
        let logout: any LogoutPlugin
        let extractor: (any CodeExtractor)?
        /// Whether the refresh plugin can get credentials when there are none.
        let signsIn: Bool

        init(
            authorize: (any AuthorizePlugin)?, refresh: Result<any RefreshPlugin, PluginError>?,
            logout: any LogoutPlugin, extractor: (any CodeExtractor)?
        ) {
            self.authorize = authorize
            self.refresh = refresh
            self.logout = logout
            self.extractor = extractor
            if case .success(let plugin)? = refresh { signsIn = plugin.canSignIn } else { signsIn = false }
        }
    }

    let policy: Policy
    /// Some scope or rule sets `refresh.limit`: a coordinator is told which generations a
    /// response accepted (never counted fleet-wide).
    let countsRefreshLimit: Bool
    let scopes: [ScopePlugins]
    let observers: [any PolicyObserver]
    /// Problems making plugins, reported as events when the runtime is installed.
    let problems: [PluginError]

    init(
        policy: Policy, registry: PluginRegistry, transport: any Transport, environment: [String: String],
        overrides: PolicyEngine.Overrides
    ) {
        self.policy = policy
        countsRefreshLimit = policy.graph.scopes.contains { scope in
            scope.refresh.limit != nil || scope.compiled.contains { $0.refresh.limit != nil }
        }
        var problems: [PluginError] = []
        func make<P>(_ factories: [String: PluginRegistry.Factory<P>], _ reference: PluginReference) -> P? {
            do {
                return try registry.make(factories, reference, transport: transport, environment: environment)
            } catch {
                problems.append(error)
                return nil
            }
        }
        var scopes: [ScopePlugins] = []
        for scope in policy.graph.scopes {
            let refresh: Result<any RefreshPlugin, PluginError>?
            if let override = overrides.refresh {
                refresh = .success(override)
            } else if let reference = scope.refresh.plugin {
                do {
                    refresh = .success(
                        try registry.make(registry.refresh, reference, transport: transport, environment: environment))
                } catch {
                    problems.append(error)
                    refresh = .failure(error)
                }
            } else {
                refresh = nil
            }
            var extractor: (any CodeExtractor)?
            if case .plugin(let reference) = scope.classify { extractor = make(registry.extract, reference) }
            scopes.append(
                ScopePlugins(
                    authorize: make(registry.authorize, scope.authorize), refresh: refresh,
                    logout: overrides.logout ?? make(registry.logout, scope.logout.plugin) ?? NoLogout(),
                    extractor: extractor))
        }
        self.scopes = scopes
        observers = policy.observe.compactMap { make(registry.observe, $0) } + overrides.observers
        // Every scope (each route, then the top level) makes its own plugins, most of them from
        // the same `use:`: one problem is reported once, not once per route.
        var unique: [PluginError] = []
        for problem in problems where !unique.contains(problem) { unique.append(problem) }
        self.problems = unique
    }

    /// The business code of a response under a scope, `nil` when it has none.
    func code(of response: HTTPResponse, scopeIndex: Int, scanLimit: Int) -> String? {
        let scope = policy.graph.scopes[scopeIndex]
        switch scope.classify {
        case nil: return nil
        case .header(let name): return response.headers[name]
        case .plugin: return scopes[scopeIndex].extractor?.code(in: response)
        case .body:
            guard let path = scope.codePath else { return nil }
            return response.body.withUnsafeBytes { bytes in
                JSONCodeScanner.code(in: bytes, at: path, maxBytes: scanLimit)
            }
        }
    }
}

extension PolicyRuntime {
    /// The longest logout cooldown any scope or rule of the policy has (``RuleGraph/longestCooldown``).
    var maxCooldown: Duration { policy.graph.longestCooldown }
}
