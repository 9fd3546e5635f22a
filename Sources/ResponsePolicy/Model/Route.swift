/// One entry of `routes:`: requests it matches use its sections, merged over the top level.
public struct Route: Sendable, Hashable {
    public var path: Glob?
    public var methods: [String]?
    /// The route's own rules; `nil` keeps the top-level rules, `[]` means no rules.
    public var rules: [Rule]?
    public var classify: CodeSource??
    public var refresh: RefreshSettings
    public var logout: LogoutSettings
    public var retry: RetrySettings
    public var authorize: PluginReference
    public var range: SourceRange

    public func matches(method: String, path requestPath: String) -> Bool {
        if let methods, !methods.contains(method) { return false }
        if let path, !path.matches(requestPath) { return false }
        return true
    }
}
