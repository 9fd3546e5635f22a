import Foundation

/// The plugins every registry starts with. The network ones (`oauth2`, `http`) and the `file`
/// store live in their own files.
enum BuiltinPlugins {
    static func register(in registry: inout PluginRegistry) {
        registry.register(authorize: "bearer") { _ in BearerAuthorizer() }
        registry.register(authorize: "header") { config in
            HeaderAuthorizer(name: config.string("name") ?? "Authorization", prefix: config.string("prefix") ?? "")
        }
        registry.register(authorize: "query") { config in QueryAuthorizer(name: config.string("name") ?? "access_token")
        }
        registry.register(logout: "none") { _ in NoLogout() }
        registry.register(store: "memory") { _ in MemoryCredentialStore() }
        registry.register(observe: "log") { config in LogObserver(debug: config.string("level") == "debug") }
        registerNetworkPlugins(in: &registry)
        CoordinationPlugins.register(in: &registry)
    }
}

/// `Authorization: Bearer <token>`, replacing any earlier Authorization header.
public struct BearerAuthorizer: AuthorizePlugin {
    public init() {}
    public func authorize(_ request: inout HTTPRequest, with credentials: Credentials) {
        request.headers.set("Authorization", "Bearer " + credentials.accessToken)
    }
}

/// `<name>: <prefix><token>`, e.g. `auth_token: abc`.
public struct HeaderAuthorizer: AuthorizePlugin {
    public let name: String
    public let prefix: String
    public init(name: String, prefix: String = "") {
        self.name = name
        self.prefix = prefix
    }
    public func authorize(_ request: inout HTTPRequest, with credentials: Credentials) {
        request.headers.set(name, prefix + credentials.accessToken)
    }
}

/// `?<name>=<token>`, replacing an earlier value of that parameter.
public struct QueryAuthorizer: AuthorizePlugin {
    public let name: String
    public init(name: String) { self.name = name }
    public func authorize(_ request: inout HTTPRequest, with credentials: Credentials) {
        guard var components = URLComponents(url: request.url, resolvingAgainstBaseURL: false) else { return }
        var items = (components.queryItems ?? []).filter { $0.name != name }
        items.append(URLQueryItem(name: name, value: credentials.accessToken))
        components.queryItems = items
        if let url = components.url { request.url = url }
    }
}

/// Logout that only changes the engine's own state.
public struct NoLogout: LogoutPlugin {
    public init() {}
    public func logout(_ context: LogoutContext) async {}
}

/// Credentials held in memory for the life of the process.
public final class MemoryCredentialStore: CredentialStore {
    private let stored: Locked<Credentials?>
    public init(_ credentials: Credentials? = nil) { stored = Locked(credentials) }
    public func load() throws -> Credentials? { stored.withLock { $0 } }
    public func save(_ credentials: Credentials) throws { stored.withLock { $0 = credentials } }
}

/// JSON lines on stderr, one per event. Events carry no tokens, so nothing needs redacting
/// here; the observer still never prints anything but the event.
public struct LogObserver: PolicyObserver {
    public let debug: Bool
    private let write: @Sendable (String) -> Void

    public init(debug: Bool = false, write: (@Sendable (String) -> Void)? = nil) {
        self.debug = debug
        self.write = write ?? { line in FileHandle.standardError.write(Data((line + "\n").utf8)) }
    }

    public func observe(_ event: PolicyEvent) {
        // At info level the per-attempt chatter is left out: outcomes, refreshes, logouts, reloads.
        if !debug, event.kind == .send || event.kind == .response || event.kind == .wait { return }
        write(event.jsonLine)
    }
}
