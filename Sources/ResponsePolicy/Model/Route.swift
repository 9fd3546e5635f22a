/// One entry of `routes:`: requests it matches use its sections, merged over the top level.
package struct Route: Sendable, Hashable {
    package var path: Glob?
    package var methods: [String]?
    /// The route's own rules; `nil` keeps the top-level rules, `[]` means no rules.
    package var rules: [Rule]?
    package var classify: CodeSource??
    package var refresh: RefreshSettings
    package var logout: LogoutSettings
    package var retry: RetrySettings
    package var authorize: PluginReference
    package var range: SourceRange

    package func matches(method: String, path requestPath: String) -> Bool {
        if let methods, !methods.contains(method) { return false }
        if let path, !path.matches(requestPath) { return false }
        return true
    }
}
