/// A policy compiled for running: one scope per route plus the top level, each with its rules
/// resolved over its sections and its decision table, and the graph of what leads where.
///
/// The engine runs this graph; lint, `policy graph` and `policy explain` read the same one, so
/// what they show is what runs.
///
/// Concurrency contract: an immutable value; share it freely.
public struct RuleGraph: Sendable {
    /// Where rules and settings apply: a route, or the top level.
    ///
    /// A class (immutable, so `Sendable`): the engine picks a scope per request, and passing a
    /// reference costs one retain where copying this many settings would cost dozens.
    public final class Scope: Sendable {
        /// `default` for the top level, `route-N` for the N-th route.
        public let id: String
        public let route: Route?
        /// The rules in order, their `then:` overrides resolved over this scope's sections.
        public let rules: [Rule]
        public let classify: CodeSource?
        public let retry: RetrySettings
        public let refresh: RefreshSettings
        public let logout: LogoutSettings
        public let authorize: PluginReference
        package let classifier: Classifier
        package let codePath: JSONPath?
        /// Read on every attempt; kept apart so that reading them copies no settings struct.
        let attemptTimeout: Duration?
        let deadline: Duration?
        let refreshAhead: Duration?

        init(
            id: String, route: Route?, rules: [Rule], classify: CodeSource?, retry: RetrySettings,
            refresh: RefreshSettings, logout: LogoutSettings, authorize: PluginReference, classifier: Classifier,
            codePath: JSONPath?
        ) {
            self.id = id
            self.route = route
            self.rules = rules
            self.classify = classify
            self.retry = retry
            self.refresh = refresh
            self.logout = logout
            self.authorize = authorize
            self.classifier = classifier
            self.codePath = codePath
            attemptTimeout = retry.attemptTimeout
            deadline = retry.deadline
            refreshAhead = refresh.ahead
        }

        /// What the scope covers, for people: `all requests` or `POST /upload/*`.
        public var summary: String {
            guard let route else { return "all other requests" }
            let methods = route.methods.map { $0.joined(separator: "/") + " requests" } ?? "requests"
            return route.path.map { "\(methods) to \($0.pattern)" } ?? methods
        }

        /// The retry settings a rule runs with.
        public func retry(for rule: Rule) -> RetrySettings { rule.retry ?? retry }
        public func refresh(for rule: Rule) -> RefreshSettings { rule.refresh ?? refresh }
        public func logout(for rule: Rule) -> LogoutSettings { rule.logout ?? logout }
    }

    public struct Node: Sendable, Hashable {
        public enum Kind: String, Sendable, Hashable { case classifier, rule, action, outcome }
        public let id: String
        public let kind: Kind
        public let label: String
    }

    public struct Edge: Sendable, Hashable {
        public let from: String
        public let to: String
        public let label: String
    }

    /// Routes in their order, then the top level: the first whose route matches a request applies.
    public let scopes: [Scope]
    public let nodes: [Node]
    public let edges: [Edge]

    /// The scope for a request: the first matching route, else the top level.
    public func scope(method: String, path: String) -> Scope {
        scopes[scopeIndex(method: method, path: path)]
    }

    /// The index in `scopes` of the scope a request runs under (the engine's plugins are kept
    /// per scope, by the same index).
    func scopeIndex(method: String, path: String) -> Int {
        for (index, scope) in scopes.enumerated() {
            guard let route = scope.route else { return index }
            if route.matches(method: method, path: path) { return index }
        }
        return scopes.count - 1
    }

    init(parts: PolicyParts, catalog: PluginCatalog) {
        var scopes: [Scope] = []
        for (index, route) in parts.routes.enumerated() {
            let rules: [Rule]
            if let own = route.rules {
                rules = own
            } else {
                var decoder = PolicyDecoder(catalog: catalog)
                decoder.quiet = true
                let sectionScope = SectionScope(retry: route.retry, refresh: route.refresh, logout: route.logout)
                rules = parts.rules.map { rule in
                    var resolved = rule
                    if let overrides = rule.overrides {
                        decoder.apply(overrides: overrides, to: &resolved, scope: sectionScope)
                    }
                    return resolved
                }
            }
            let classify = route.classify ?? parts.classify
            scopes.append(
                Scope(
                    id: "route-\(index + 1)", route: route, rules: rules, classify: classify, retry: route.retry,
                    refresh: route.refresh, logout: route.logout, authorize: route.authorize,
                    classifier: Classifier(rules: rules), codePath: Self.jsonPath(classify)))
        }
        scopes.append(
            Scope(
                id: "default", route: nil, rules: parts.rules, classify: parts.classify, retry: parts.retry,
                refresh: parts.refresh, logout: parts.logout, authorize: parts.authorize,
                classifier: Classifier(rules: parts.rules), codePath: Self.jsonPath(parts.classify)))
        self.scopes = scopes
        (nodes, edges) = Self.layout(scopes)
    }

    static func jsonPath(_ source: CodeSource?) -> JSONPath? {
        if case .body(let path) = source { return JSONPath(path) }
        return nil
    }

    /// Builds the node and edge lists: per scope a classifier, its rules, one action node per
    /// action kind the scope reaches, and the shared outcomes.
    static func layout(_ scopes: [Scope]) -> ([Node], [Edge]) {
        var nodes: [Node] = [
            Node(id: "delivered", kind: .outcome, label: "delivered"),
            Node(id: "failed", kind: .outcome, label: "failed"),
            Node(id: "logged-out", kind: .outcome, label: "logged out"),
        ]
        var edges: [Edge] = []
        for scope in scopes {
            let prefix = scope.id
            let classifier = "\(prefix).classify"
            nodes.append(
                Node(
                    id: classifier, kind: .classifier,
                    label: "classify \(scope.summary)" + (scope.classify.map { " by \($0)" } ?? "")))
            var actions: Set<ActionKind> = [.deliver]
            func action(_ kind: ActionKind) -> String {
                actions.insert(kind)
                return "\(prefix).\(kind.rawValue)"
            }
            for (index, rule) in scope.rules.enumerated() {
                let id = "\(prefix).rule.\(index + 1)"
                nodes.append(Node(id: id, kind: .rule, label: "\(rule.name): \(describe(rule.when))"))
                edges.append(Edge(from: classifier, to: id, label: "match"))
                edges.append(
                    Edge(from: id, to: action(rule.action), label: rule.overrides == nil ? "" : "with overrides"))
            }
            edges.append(Edge(from: classifier, to: action(.deliver), label: "no rule matches"))
            // Escalations, added until no new action appears.
            var done: Set<ActionKind> = []
            while let kind = actions.subtracting(done).sorted(by: { $0.rawValue < $1.rawValue }).first {
                done.insert(kind)
                let id = "\(prefix).\(kind.rawValue)"
                switch kind {
                case .deliver: edges.append(Edge(from: id, to: "delivered", label: ""))
                case .fail: edges.append(Edge(from: id, to: "failed", label: ""))
                case .logout:
                    edges.append(
                        Edge(from: id, to: "logged-out", label: "cooldown \(scope.logout.cooldown.policyText)"))
                case .retry:
                    edges.append(Edge(from: id, to: classifier, label: "retry again (max \(scope.retry.maxRetries))"))
                    edges.append(Edge(from: id, to: action(scope.retry.onExhausted), label: "on-exhausted"))
                case .refresh:
                    edges.append(Edge(from: id, to: classifier, label: "re-send with new token"))
                    edges.append(Edge(from: id, to: action(scope.refresh.onExhausted), label: "on-exhausted"))
                    edges.append(Edge(from: id, to: action(scope.refresh.onFailure), label: "on-failure"))
                }
            }
            for kind in ActionKind.allCases where actions.contains(kind) {
                nodes.append(Node(id: "\(prefix).\(kind.rawValue)", kind: .action, label: kind.rawValue))
            }
        }
        return (nodes, edges)
    }

    /// A condition in short form: `code 1401`, `status 502, 503 or error timeout`.
    public static func describe(_ when: Condition) -> String {
        var response: [String] = []
        if let codes = when.codes { response.append("code " + codes.joined(separator: ", ")) }
        if let statuses = when.statuses {
            response.append("status " + statuses.map(\.description).joined(separator: ", "))
        }
        if let headers = when.headers {
            response.append(headers.map { "header \($0.name) = \($0.value.pattern)" }.joined(separator: " and "))
        }
        var parts: [String] = []
        if !response.isEmpty { parts.append(response.joined(separator: " and ")) }
        if let errors = when.errors { parts.append("error " + errors.map(\.rawValue).joined(separator: ", ")) }
        var text = parts.isEmpty ? "any response" : parts.joined(separator: " or ")
        if let methods = when.methods { text += " on " + methods.joined(separator: ", ") }
        if let path = when.path { text += " at " + path.pattern }
        return text
    }
}
