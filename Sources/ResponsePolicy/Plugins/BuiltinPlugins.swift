import Foundation

/// The plugins every registry starts with. The network ones (`oauth2`, `http`) and the `file`
/// store live in their own files.
enum BuiltinPlugins {
    static func register(in registry: inout PluginRegistry) {
        registry.register(authorize: "bearer") { _ in BearerAuthorizer() }
        registry.register(authorize: "header") { config in
            HeaderAuthorizer(
                name: config.string("name") ?? "Authorization", prefix: config.string("prefix") ?? "",
                tokenType: config.string("token-type") ?? "bearer")
        }
        registry.register(authorize: "query") { config in QueryAuthorizer(name: config.string("name") ?? "access_token")
        }
        registry.register(logout: "none") { _ in NoLogout() }
        registry.register(store: "memory") { _ in MemoryCredentialStore() }
        registry.register(observe: "log") { config in
            guard let level = PolicyEvent.Level(rawValue: config.string("level") ?? "info"),
                let format = PolicyEvent.LogFormat(rawValue: config.string("format") ?? "json")
            else {
                throw PluginError(
                    kind: .observe, name: config.name,
                    reason: "'level' is debug, info, warning or error and 'format' is json or logfmt")
            }
            return LogObserver(level: level, format: format)
        }
        registerNetworkPlugins(in: &registry)
        CoordinationPlugins.register(in: &registry)
    }
}

/// `Authorization: Bearer <token>`, replacing any earlier Authorization header.
package struct BearerAuthorizer: AuthorizePlugin {
    package init() {}
    package func authorize(_ request: inout HTTPRequest, with credentials: Credentials) {
        request.headers.set("Authorization", "Bearer " + credentials.accessToken)
    }
}

/// `<name>: <prefix><token>`, e.g. `auth_token: abc`; `token-type` names the token type it sends
/// (`bearer` by default), for a token endpoint that issues another (`DPoP`, `mac`).
package struct HeaderAuthorizer: AuthorizePlugin {
    package let name: String
    package let prefix: String
    package let tokenType: String
    package init(name: String, prefix: String = "", tokenType: String = "bearer") {
        self.name = name
        self.prefix = prefix
        self.tokenType = tokenType
    }
    package func authorize(_ request: inout HTTPRequest, with credentials: Credentials) {
        request.headers.set(name, prefix + credentials.accessToken)
    }
}

/// `?<name>=<token>`, replacing an earlier value of that parameter.
package struct QueryAuthorizer: AuthorizePlugin {
    package let name: String
    package init(name: String) { self.name = name }
    package func authorize(_ request: inout HTTPRequest, with credentials: Credentials) {
        guard var components = URLComponents(url: request.url, resolvingAgainstBaseURL: false) else { return }
        var items = (components.queryItems ?? []).filter { $0.name != name }
        items.append(URLQueryItem(name: name, value: credentials.accessToken))
        components.queryItems = items
        if let url = components.url { request.url = url }
    }
}

/// Logout that only changes the engine's own state.
package struct NoLogout: LogoutPlugin {
    package init() {}
    package func logout(_ context: LogoutContext) async {}
}

/// Credentials held in memory for the life of the process.
public final class MemoryCredentialStore: CredentialStore {
    private let stored: Locked<Credentials?>
    /// A store holding `credentials` (none by default).
    public init(_ credentials: Credentials? = nil) { stored = Locked(credentials) }
    /// The credentials held.
    public func load() throws -> Credentials? { stored.withLock { $0 } }
    /// Holds `credentials` instead.
    public func save(_ credentials: Credentials) throws { stored.withLock { $0 = credentials } }
}

/// One line per event on stderr (or `write`), for hosts without a logging system of their own:
/// `observe: [{ use: log, with: { format: json | logfmt, level: info } }]`.
///
/// Each line has the wall-clock time, the level, the request's method and path (never its query
/// or headers) and the event's fields (see ``PolicyEvent/logLine(_:)``). Events carry no tokens,
/// so nothing needs redacting here; the observer never prints anything but the event.
///
/// `level` (`info` by default) is the lowest level written: `debug` adds every attempt (`send`,
/// `response`, `wait`); `warning` keeps failed refreshes, logouts and failed outcomes; `error`
/// only problems and refused reloads.
package struct LogObserver: PolicyObserver {
    package let level: PolicyEvent.Level
    package let format: PolicyEvent.LogFormat
    private let write: @Sendable (String) -> Void

    /// Whether attempts (`send`, `response`, `wait`) are written.
    package var debug: Bool { level == .debug }

    /// - Parameters:
    ///   - level: the lowest level written; `.info` by default.
    ///   - format: `.json` by default.
    ///   - write: where lines go; stderr by default.
    package init(
        level: PolicyEvent.Level = .info, format: PolicyEvent.LogFormat = .json,
        write: (@Sendable (String) -> Void)? = nil
    ) {
        self.level = level
        self.format = format
        self.write = write ?? { line in FileHandle.standardError.write(Data((line + "\n").utf8)) }
    }

    /// The observer of earlier versions: `debug` writes every event.
    package init(debug: Bool, write: (@Sendable (String) -> Void)? = nil) {
        self.init(level: debug ? .debug : .info, write: write)
    }

    package func observe(_ event: PolicyEvent) {
        guard event.level >= level else { return }
        write(event.logLine(format))
    }
}
