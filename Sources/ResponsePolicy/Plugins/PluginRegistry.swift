import Foundation

/// What a plugin factory is given: the policy's `with:` options and the engine's environment.
public struct PluginConfiguration: Sendable {
    /// The name the policy's `use:` gave.
    public let name: String
    /// The `with:` options, as written.
    public let options: [String: PluginOption]
    /// The engine's transport (for plugins that call HTTP endpoints; rules do not apply to it).
    public let transport: any Transport
    /// Environment variables, for secrets named in the policy (`client-secret-env`).
    public let environment: [String: String]

    package init(name: String, options: [String: PluginOption], transport: any Transport, environment: [String: String])
    {
        self.name = name
        self.options = options
        self.transport = transport
        self.environment = environment
    }

    /// A text option, `nil` when absent.
    public func string(_ key: String) -> String? { options[key]?.string }
}

/// Why a plugin named in a policy could not be made.
public struct PluginError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The plugin's kind.
    public var kind: PluginKind
    /// The name the policy gave it.
    public var name: String
    /// Why it could not be made; names variables and files, never their values.
    public var reason: String
    /// Where the plugin is named in the policy (its `use:`), when it is known.
    public var range: SourceRange?

    /// An error about the plugin `name` of `kind`.
    public init(kind: PluginKind, name: String, reason: String, range: SourceRange? = nil) {
        self.kind = kind
        self.name = name
        self.reason = reason
        self.range = range
    }

    /// `KIND plugin 'NAME': REASON`.
    public var description: String { "\(kind.rawValue) plugin '\(name)': \(reason)" }

    /// The error as a finding at the plugin's `use:`, rule `plugin-unavailable`.
    package func diagnostic(file: String?) -> Diagnostic {
        Diagnostic(
            .error, "plugin-unavailable", "\(kind.rawValue) plugin '\(name)' cannot be made: \(reason)",
            at: range ?? .fileStart, file: file)
    }
}

/// The plugins an engine can run, by kind and name: the built-ins plus what the host registers.
///
/// Register before loading the policy and pass ``catalog`` to `Policy.load` so lint accepts the
/// names:
///
/// ```swift
/// var registry = PluginRegistry()
/// registry.register(refresh: "my-sso") { config in MySSORefresh(realm: config.string("realm")) }
/// let policy = try Policy.load(contentsOf: url, plugins: registry.catalog)
/// let engine = PolicyEngine(policy: policy, transport: transport, plugins: registry)
/// ```
///
/// Concurrency contract: a value type; register everything, then hand copies to engines.
public struct PluginRegistry: Sendable {
    /// What makes a plugin from its configuration; it may throw to refuse the options.
    public typealias Factory<P> = @Sendable (PluginConfiguration) throws -> P

    /// The names and schemas registered, for `Policy.load(contentsOf:plugins:limits:)`.
    public private(set) var catalog = PluginCatalog()
    var refresh: [String: Factory<any RefreshPlugin>] = [:]
    var authorize: [String: Factory<any AuthorizePlugin>] = [:]
    var logout: [String: Factory<any LogoutPlugin>] = [:]
    var observe: [String: Factory<any PolicyObserver>] = [:]
    var store: [String: Factory<any CredentialStore>] = [:]
    var extract: [String: Factory<any CodeExtractor>] = [:]
    var coordination: [String: CoordinatorFactory] = [:]

    /// A registry with the built-in plugins.
    public init() {
        BuiltinPlugins.register(in: &self)
    }

    /// A refresh plugin for `refresh: { use: name }`.
    public mutating func register(
        refresh name: String, schema: PluginSchema? = nil, _ make: @escaping Factory<any RefreshPlugin>
    ) {
        refresh[name] = make
        declare(.refresh, name, schema)
    }

    /// An authorize plugin for `authorize: { use: name }`.
    public mutating func register(
        authorize name: String, schema: PluginSchema? = nil, _ make: @escaping Factory<any AuthorizePlugin>
    ) {
        authorize[name] = make
        declare(.authorize, name, schema)
    }

    /// A logout plugin for `logout: { use: name }`.
    public mutating func register(
        logout name: String, schema: PluginSchema? = nil, _ make: @escaping Factory<any LogoutPlugin>
    ) {
        logout[name] = make
        declare(.logout, name, schema)
    }

    /// An observer for `observe: [{ use: name }]`.
    public mutating func register(
        observe name: String, schema: PluginSchema? = nil, _ make: @escaping Factory<any PolicyObserver>
    ) {
        observe[name] = make
        declare(.observe, name, schema)
    }

    /// A credential store for `store: { use: name }`.
    public mutating func register(
        store name: String, schema: PluginSchema? = nil, _ make: @escaping Factory<any CredentialStore>
    ) {
        store[name] = make
        declare(.store, name, schema)
    }

    /// A code extractor for `classify: { use: name }`.
    public mutating func register(
        extract name: String, schema: PluginSchema? = nil, _ make: @escaping Factory<any CodeExtractor>
    ) {
        extract[name] = make
        declare(.extract, name, schema)
    }

    /// A coordinator for `coordination: { use: name }`; see `makeCoordinator(for:environment:credentialsPath:)`.
    public mutating func register(
        coordination name: String, schema: PluginSchema? = nil, _ make: @escaping CoordinatorFactory
    ) {
        coordination[name] = make
        declare(.coordination, name, schema)
    }

    private mutating func declare(_ kind: PluginKind, _ name: String, _ schema: PluginSchema?) {
        // Built-ins keep the schema the catalog ships for them.
        if !catalog.isBuiltin(kind, name) || !catalog.contains(kind, name) {
            catalog.declare(kind, name, schema: schema)
        }
    }

    func make<P>(
        _ factories: [String: Factory<P>], _ reference: PluginReference, transport: any Transport,
        environment: [String: String]
    ) throws(PluginError) -> P {
        guard let factory = factories[reference.name] else {
            throw PluginError(
                kind: reference.kind, name: reference.name, reason: "no such plugin is registered in this program")
        }
        let configuration = PluginConfiguration(
            name: reference.name, options: reference.options, transport: transport, environment: environment)
        do {
            return try factory(configuration)
        } catch var error as PluginError {
            error.range = error.range ?? reference.range
            // Name every unreadable secret at once, not one per run.
            let others = SecretSource.problems(in: configuration, kind: reference.kind).filter { $0 != error.reason }
            if !others.isEmpty { error.reason += "; also " + others.joined(separator: "; ") }
            throw error
        } catch {
            throw PluginError(kind: reference.kind, name: reference.name, reason: "\(error)", range: reference.range)
        }
    }

    /// Makes the refresh plugin `name` from `options`, its calls going to `transport`: the fuzz
    /// harness hands token answers of its choosing to the built-ins this way.
    package func makeRefresh(
        _ name: String, options: [String: PluginOption], transport: any Transport
    ) throws(PluginError) -> any RefreshPlugin {
        try make(
            refresh, PluginReference(kind: .refresh, name: name, options: options), transport: transport,
            environment: [:])
    }

    /// Whether a factory for `name` of `kind` is registered (declared names may have none).
    func canMake(_ kind: PluginKind, _ name: String) -> Bool {
        switch kind {
        case .refresh: return refresh[name] != nil
        case .authorize: return authorize[name] != nil
        case .logout: return logout[name] != nil
        case .observe: return observe[name] != nil
        case .store: return store[name] != nil
        case .extract: return extract[name] != nil
        case .coordination: return coordination[name] != nil
        }
    }

    /// Makes every plugin `policy` names and returns why each one that could not be made failed:
    /// an unset `{env:…}` or `*-env` variable, an unreadable `{file:…}` or `*-file`, a missing
    /// `exec` command. What ``PolicyEngine/problems`` reports and `policy lint --check-env` checks.
    ///
    /// ```swift
    /// let problems = registry.problems(in: policy)
    /// guard problems.isEmpty else { fatalError(problems.map(\.description).joined(separator: "\n")) }
    /// ```
    ///
    /// - Parameters:
    ///   - policy: a loaded policy.
    ///   - environment: where secrets named in the policy are read; the process environment by default.
    ///   - onlyRegistered: skip names this registry has no factory for (declared only, as
    ///     `policy lint --plugin` does); `false` by default, when such a name is a problem too.
    public func problems(
        in policy: Policy, environment: [String: String] = ProcessInfo.processInfo.environment,
        onlyRegistered: Bool = false
    ) -> [PluginError] {
        let runtime = PolicyRuntime(
            policy: policy, registry: self, transport: NoTransport(), environment: environment,
            overrides: PolicyEngine.Overrides(refresh: nil, logout: nil, observers: []))
        var problems = runtime.problems
        // The coordinator too: an unset `password-env` or an unusable URL would leave the fleet
        // uncoordinated (or, with on-unavailable: wait, unable to refresh) from its first start.
        let name = policy.coordination.name
        if name != "local", coordination[name] != nil || CoordinationPlugins.notLinked(name) != nil {
            do {
                let coordinator = try makeCoordinator(for: policy, environment: environment)
                coordinator.stop()
            } catch {
                var problem = error
                problem.range = problem.range ?? policy.coordination.range
                problems.append(problem)
            }
        }
        return problems.filter { !onlyRegistered || canMake($0.kind, $0.name) }
    }
}
