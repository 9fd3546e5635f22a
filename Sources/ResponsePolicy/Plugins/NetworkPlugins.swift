extension BuiltinPlugins {
    /// `oauth2` and `http` refresh, `http` logout and the `file` store.
    ///
    /// Their option schemas are in ``PluginCatalog``'s built-ins, so lint checks `with:` before a
    /// factory ever runs; the factories still check what lint cannot (a URL that does not parse,
    /// an environment variable that is not set) and throw ``PluginError`` with the reason.
    static func registerNetworkPlugins(in registry: inout PluginRegistry) {
        registry.register(refresh: "oauth2") { configuration in try OAuth2Refresh(configuration: configuration) }
        registry.register(refresh: "http") { configuration in try HTTPRefresh(configuration: configuration) }
        registry.register(logout: "http") { configuration in try HTTPLogout(configuration: configuration) }
        registry.register(store: "file") { configuration in try FileCredentialStore(configuration: configuration) }
    }
}

extension PluginRegistry {
    /// Wraps the plugin every logout factory makes, for hosts that must know when logout calls end.
    ///
    /// The engine calls the logout plugin in a task it does not wait for; `policy fetch` exits
    /// right after its last request, which would kill an `http` logout POST before it is sent.
    /// It wraps the plugins to count finished calls and waits for them before exiting.
    ///
    /// - Parameter wrap: Gets each plugin as its factory made it; returns the one the engine uses.
    package mutating func wrapLogoutPlugins(_ wrap: @escaping @Sendable (any LogoutPlugin) -> any LogoutPlugin) {
        for (name, make) in logout {
            logout[name] = { configuration in wrap(try make(configuration)) }
        }
    }
}
