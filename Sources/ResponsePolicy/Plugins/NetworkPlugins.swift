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
        registry.register(refresh: "exec") { configuration in try ExecRefresh(configuration: configuration) }
        registry.register(logout: "exec") { configuration in try ExecLogout(configuration: configuration) }
        registry.register(store: "file") { configuration in try FileCredentialStore(configuration: configuration) }
    }
}
