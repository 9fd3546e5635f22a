/// The options a plugin takes in `with:`, so lint can check them before the plugin ever runs.
public struct PluginSchema: Sendable, Hashable {
    /// What an option's value must be; the raw value is how lint names it.
    public enum OptionType: String, Sendable, Hashable {
        /// A text; one of the option's `values` when it lists some.
        case string
        /// An `http://` or `https://` URL with a host.
        case url
        /// A duration as the policy writes one (`500ms`, `2s`, `1m`).
        case duration
        /// A whole number.
        case integer
        /// `true` or `false`.
        case boolean
        /// A mapping of names to texts (`body:` of the `http` refresh plugin, extra headers).
        case stringMap = "mapping of texts"
        /// A list of texts.
        case stringList = "list of texts"
        /// `body.<path>` or `header.<Name>`.
        case valuePath = "value path"
    }

    /// One option a plugin takes.
    public struct Option: Sendable, Hashable {
        /// The key in `with:`.
        public var name: String
        /// What its value must be.
        public var type: OptionType
        /// Whether lint reports its absence.
        public var required: Bool
        /// One line for `policy schema` and the docs.
        public var summary: String
        /// The texts the option may take; empty (any text) by default.
        public var values: [String]
        /// An option `name` of `type`.
        public init(
            _ name: String, _ type: OptionType, required: Bool = false, _ summary: String = "", values: [String] = []
        ) {
            self.name = name
            self.type = type
            self.required = required
            self.summary = summary
            self.values = values
        }
    }

    /// The options it takes.
    public var options: [Option]
    /// Option names that must never hold a secret in the YAML, with the option to use instead.
    public var forbiddenSecrets: [String: String]

    /// A schema of `options`.
    public init(_ options: [Option], forbiddenSecrets: [String: String] = [:]) {
        self.options = options
        self.forbiddenSecrets = forbiddenSecrets
    }

    /// A schema that takes no options.
    public static let none = PluginSchema([])
}

/// Which plugin names exist for each kind, with their option schemas; what lint and
/// `Policy.load` check `use:` and `with:` against.
///
/// Built-ins are always present. A host adds its own names (``declare(_:_:schema:)``); a host
/// plugin declared without a schema accepts any options. `policy lint --plugin refresh:my-sso`
/// declares one from the command line.
public struct PluginCatalog: Sendable, Hashable {
    private var entries: [PluginKind: [String: PluginSchema?]]

    /// The built-in plugins alone.
    public init() {
        entries = Self.builtins
    }

    /// Adds a host plugin; `schema` `nil` accepts any options.
    public mutating func declare(_ kind: PluginKind, _ name: String, schema: PluginSchema? = nil) {
        entries[kind, default: [:]][name] = .some(schema)
    }

    /// Whether `name` is a known plugin of `kind`.
    package func contains(_ kind: PluginKind, _ name: String) -> Bool {
        entries[kind]?[name] != nil
    }

    /// The schema of a known plugin; `.some(nil)` for a host plugin that takes any options.
    package func schema(_ kind: PluginKind, _ name: String) -> PluginSchema?? {
        entries[kind]?[name]
    }

    package func names(_ kind: PluginKind) -> [String] {
        (entries[kind] ?? [:]).keys.sorted()
    }

    package func isBuiltin(_ kind: PluginKind, _ name: String) -> Bool {
        Self.builtins[kind]?[name] != nil
    }

    /// The `exec` plugin's options, for refresh and logout alike.
    static let execSchema = PluginSchema(
        [
            .init("command", .stringList, required: true, "the program and its arguments (no shell)"),
            .init("timeout", .duration, "how long the command may run, 10s by default (5s for logout)"),
            .init("env", .stringList, "the environment variables passed to it; none by default"),
            .init(
                "pass-refresh-token", .boolean, "whether stdin carries the refresh token, false by default"),
        ])

    /// `follow-redirects` of the network plugins, whose endpoints get secrets.
    static let followRedirectsOption = PluginSchema.Option(
        "follow-redirects", .string,
        "same-origin follows redirects within the endpoint's origin; none (default) follows none",
        values: ["same-origin", "none"])

    static let builtins: [PluginKind: [String: PluginSchema?]] = [
        .refresh: [
            "oauth2": PluginSchema(
                [
                    .init("token-url", .url, required: true, "the token endpoint (RFC 6749 §3.2)"),
                    .init(
                        "grant", .string, "refresh_token (default), client_credentials or password",
                        values: OAuth2Refresh.Grant.allCases.map(\.rawValue)),
                    .init("client-id", .string, required: true, "sent as client_id"),
                    .init("client-secret-env", .string, "the environment variable holding the client secret"),
                    .init("client-secret-file", .string, "a file holding the client secret (mode 0600 or stricter)"),
                    .init(
                        "client-auth", .string, "client_secret_basic (default) or client_secret_post",
                        values: OAuth2Refresh.ClientAuthentication.allCases.map(\.rawValue)),
                    .init(
                        "client-auth-encoding", .string,
                        "client_secret_basic: form (default, RFC 6749 §2.3.1) encodes id and secret first; raw does not",
                        values: OAuth2Refresh.BasicEncoding.allCases.map(\.rawValue)),
                    .init("scope", .string, "sent as scope"),
                    .init("audience", .string, "sent as audience"),
                    .init("resource", .string, "sent as resource (RFC 8707)"),
                    .init(
                        "username-env", .string, "the password grant: the environment variable holding the user name"),
                    .init("password-env", .string, "the password grant: the environment variable holding the password"),
                    followRedirectsOption,
                ],
                forbiddenSecrets: [
                    "client-secret": "client-secret-env", "password": "password-env", "username": "username-env",
                ]),
            "http": PluginSchema(
                [
                    .init("url", .url, required: true, "where the refresh request is POSTed"),
                    .init(
                        "body", .stringMap,
                        "JSON body fields; `{refresh_token}`, `{env:NAME}` and `{file:PATH}` are replaced"),
                    .init(
                        "headers", .stringMap,
                        "extra request headers; `{refresh_token}`, `{env:NAME}` and `{file:PATH}` are replaced"),
                    .init("token", .valuePath, required: true, "where the new access token is, e.g. body.data.token"),
                    .init("refresh-token", .valuePath, "where a rotated refresh token is"),
                    .init("expires-in", .valuePath, "where the token's lifetime in seconds is"),
                    followRedirectsOption,
                ]),
            "exec": execSchema,
        ],
        .authorize: [
            "bearer": PluginSchema.none,
            "header": PluginSchema(
                [
                    .init("name", .string, required: true, "the header that carries the token"),
                    .init("prefix", .string, "text before the token, e.g. 'Token '"),
                    .init(
                        "token-type", .string,
                        "the token type it sends (RFC 6749 §7.1), bearer by default; a token endpoint that issues"
                            + " another type is refused"),
                ]),
            "query": PluginSchema([.init("name", .string, required: true, "the query parameter that carries the token")]
            ),
        ],
        .logout: [
            "none": PluginSchema.none,
            "exec": execSchema,
            "http": PluginSchema(
                [
                    .init("url", .url, required: true, "where the logout request is POSTed"),
                    .init("timeout", .duration, "how long to wait for it, 5s by default"),
                    followRedirectsOption,
                ]),
        ],
        .extract: [:],
        .observe: [
            "log": PluginSchema([
                .init(
                    "level", .string, "the lowest level written: debug, info (default), warning or error",
                    values: PolicyEvent.Level.allCases.map(\.rawValue)),
                .init(
                    "format", .string, "json (default) or logfmt",
                    values: PolicyEvent.LogFormat.allCases.map(\.rawValue)),
            ])
        ],
        .store: [
            "memory": PluginSchema.none,
            "file": PluginSchema([.init("path", .string, required: true, "the credentials JSON file")]),
        ],
        .coordination: CoordinationPlugins.schemas,
    ]
}
