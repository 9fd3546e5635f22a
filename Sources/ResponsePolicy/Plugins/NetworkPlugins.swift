extension BuiltinPlugins {
    /// `oauth2` and `http` refresh, `http` logout and the `file` store.
    static func registerNetworkPlugins(in registry: inout PluginRegistry) {}
}
