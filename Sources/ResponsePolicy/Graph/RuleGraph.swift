/// A policy compiled for running: one scope per route plus the top level, each with its rules
/// resolved over its sections and its decision table, and the graph of what leads where.
///
/// The engine takes its decisions from this graph's compiled edges (``CompiledRule``); lint,
/// `policy graph`, `policy explain`, `policy diff` and the fuzz oracle read the same one, so what
/// they show is what runs. Per scope (``Scope``) and per rule (``CompiledRule``): the effective
/// settings (section, then route, then rule override) and every edge the engine can take.
///
/// Concurrency contract: an immutable value; share it freely.
package struct RuleGraph: Sendable {
    /// Where rules and settings apply: a route, or the top level, compiled: each rule with its
    /// effective settings and edges (``compiled``), the scope's own nodes and edges.
    ///
    /// A class (immutable, so `Sendable`): the engine picks a scope per request, and passing a
    /// reference costs one retain where copying this many settings would cost dozens.
    package final class Scope: Sendable {
        /// `default` for the top level, `route-N` for the N-th route.
        package let id: String
        package let route: Route?
        /// The rules in order, their `then:` overrides resolved over this scope's sections.
        package let rules: [Rule]
        /// The rules compiled, in the same order: effective settings and every edge.
        package let compiled: [CompiledRule]
        package let classify: CodeSource?
        package let retry: RetrySettings
        package let refresh: RefreshSettings
        package let logout: LogoutSettings
        package let authorize: PluginReference
        /// The scope's nodes: the classifier, each rule's (its own and its action's), then the
        /// scope's refresh-before-send, deliver, fail and logout nodes. Made when asked, from
        /// the compiled rules (by `graph`, `explain` and `diff`, a few times per run): held, they
        /// were 20,000 nodes and 40,000 edges of a large policy that lint and the engine never read.
        package var nodes: [Node] {
            var nodes = [classifierNode]
            nodes.reserveCapacity(compiled.count + closingNodes.count + 1)
            for flow in compiled { nodes += flow.nodes }
            nodes += closingNodes
            return nodes
        }
        /// The scope's edges: each rule's, in rule order, then the scope's own (no match, the
        /// deadline, refresh before sending, the outcomes). Made when asked, as ``nodes``.
        package var edges: [Edge] {
            var edges: [Edge] = []
            edges.reserveCapacity(2 * compiled.count + closingEdges.count)
            for flow in compiled { edges += flow.edges }
            edges += closingEdges
            return edges
        }
        private let classifierNode: Node
        /// The scope's nodes and edges after its rules'.
        private let closingNodes: [Node]
        private let closingEdges: [Edge]
        /// Classifier → deliver: a response no rule matches.
        package let noMatchResponse: Edge
        /// Classifier → fail: a failed attempt no rule matches.
        package let noMatchError: Edge
        /// Classifier → fail: an attempt that ran into the deadline (`nil` without a deadline).
        package let attemptDeadline: Edge?
        /// Where a failed refresh before sending leads (ahead of expiry, or signing in): the
        /// section's `on-failure`, from the scope's `refresh-before-send` node. `nil` without a
        /// refresh plugin.
        package let beforeSendingFailure: Escalation?
        package let classifier: Classifier
        package let codePath: JSONPath?
        /// Read on every attempt; kept apart so that reading them copies no settings struct.
        let attemptTimeout: Duration?
        let deadline: Duration?
        let refreshAhead: Duration?
        /// The longest a request of this scope can take, computed from the compiled rules (see
        /// ``WorstCase``): what `explain` states and the deadline lint checks.
        package let worstCase: WorstCase
        /// The idempotency headers to generate, by method: for each method a retry rule of this
        /// scope may retry (listed in the rule's own `methods`) that is not idempotent by nature
        /// (POST, PATCH), the rule's `idempotency-key`. Generated before the first attempt, so
        /// every attempt carries the same value; judged from the same compiled settings as the
        /// retry itself.
        let idempotencyKeys: [String: [String]]

        init(
            id: String, route: Route?, rules: [Rule], classify: CodeSource?, retry: RetrySettings,
            refresh: RefreshSettings, logout: LogoutSettings, authorize: PluginReference, codePath: JSONPath?,
            heldFor: Duration?, classifier: Classifier? = nil
        ) {
            self.id = id
            self.route = route
            self.rules = rules
            self.classify = classify
            self.retry = retry
            self.refresh = refresh
            self.logout = logout
            self.authorize = authorize
            // A route that keeps the top-level rules has their conditions (overrides change only
            // settings): it shares their table, made once for every such route.
            self.classifier = classifier ?? Classifier(rules: rules)
            self.codePath = codePath
            attemptTimeout = retry.attemptTimeout
            deadline = retry.deadline
            refreshAhead = refresh.ahead
            var compiler = FlowCompiler(
                scope: id, summary: Self.summary(route), classify: classify, retry: retry, refresh: refresh,
                logout: logout, routeMethods: route?.methods,
                hasLogoutResponseRule: rules.contains { $0.action == .logout && $0.when.matchesResponses })
            compiled = rules.enumerated().map { compiler.compile($0.element, index: $0.offset) }
            let finished = compiler.finish(hasErrorRules: rules.contains { $0.when.errors?.isEmpty == false })
            classifierNode = finished.classifierNode
            closingNodes = finished.nodes
            closingEdges = finished.edges
            noMatchResponse = finished.noMatchResponse
            noMatchError = finished.noMatchError
            attemptDeadline = finished.attemptDeadline
            beforeSendingFailure = finished.beforeSending
            worstCase = WorstCase(
                compiled: compiled, attemptTimeout: retry.attemptTimeout, heldFor: heldFor,
                holds: refresh.holdNewRequests || refresh.plugin != nil)
            var keys: [String: [String]] = [:]
            for flow in compiled where flow.canRetry {
                guard let header = flow.retry.idempotencyKey else { continue }
                for method in ["POST", "PATCH"] where flow.retry.methods.contains(method) {
                    guard flow.methods.map({ $0.contains(method) }) ?? true else { continue }
                    if keys[method]?.contains(header) != true { keys[method, default: []].append(header) }
                }
            }
            idempotencyKeys = keys
        }

        /// What the scope covers, for people: `all requests` or `POST /upload/*`.
        package var summary: String { Self.summary(route) }

        package static func summary(_ route: Route?) -> String {
            guard let route else { return "all other requests" }
            let methods = route.methods.map { $0.joined(separator: "/") + " requests" } ?? "requests"
            return route.path.map { "\(methods) to \($0.pattern)" } ?? methods
        }

        /// The settings one of this scope's rules runs with, read off its compiled rule (the
        /// scope's section for a rule that is not one of this scope's).
        package func retry(for rule: Rule) -> RetrySettings { compiled(rule)?.retry ?? retry }
        package func refresh(for rule: Rule) -> RefreshSettings { compiled(rule)?.refresh ?? refresh }
        package func logout(for rule: Rule) -> LogoutSettings { compiled(rule)?.logout ?? logout }

        /// The compiled form of one of this scope's rules (a scan: for tools and tests).
        package func compiled(_ rule: Rule) -> CompiledRule? { compiled.first { $0.rule == rule } }

        /// The actions a request in this scope can reach, read off the compiled nodes (every
        /// node is the target of an edge from the classifier or a node it reaches). Only action
        /// nodes have an action: the rules' own and the scope's, read without making the rest.
        package var reachableActions: Set<ActionKind> {
            var actions = Set(closingNodes.compactMap(\.action))
            for flow in compiled {
                for node in flow.ownNodes { if let action = node.action { actions.insert(action) } }
            }
            return actions
        }
    }

    /// Routes in their order, then the top level: the first whose route matches a request applies.
    package let scopes: [Scope]

    /// The top-level scope: requests no route matches. Its compiled `logout:` settings are the
    /// session's own, which a logout no request's rule decided takes (the host's
    /// ``PolicyEngine/logout(reason:)``, news of another process's logout).
    package var topLevel: Scope { scopes[scopes.count - 1] }

    /// The longest logout cooldown any scope or rule has: what a cooldown read from a shared store
    /// is clamped to (a forged or corrupted logout costs at most what a real one costs).
    package var longestCooldown: Duration {
        var longest = topLevel.logout.cooldown
        for scope in scopes {
            longest = max(longest, scope.logout.cooldown)
            for rule in scope.compiled { longest = max(longest, rule.logout.cooldown) }
        }
        return longest
    }
    /// Every node: the shared outcomes (those some edge reaches), then each scope's classifier,
    /// rules, the rules' own action nodes and the scope's deliver, fail and logout nodes.
    ///
    /// Made when asked (by `graph` and tools, a few times per run): held, it was a second copy
    /// of every scope's nodes, 20,000 and more for a large policy.
    package var nodes: [Node] {
        outcomes + scopes.flatMap(\.nodes)
    }
    /// The shared outcome nodes some edge reaches: delivered, failed, and logged out when an
    /// edge leads there.
    package let outcomes: [Node]
    /// Every edge of every scope, in scope and rule order (made when asked, as the nodes).
    package var edges: [Edge] {
        scopes.count == 1 ? scopes[0].edges : scopes.flatMap(\.edges)
    }

    /// The scope for a request: the first matching route, else the top level.
    package func scope(method: String, path: String) -> Scope {
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

    /// The edge with this ``Edge/id``, if the graph has it (a scan: for tools and tests, not
    /// the engine, which holds its edges in ``CompiledRule``).
    package func edge(id: String) -> Edge? { edges.first { $0.id == id } }

    init(parts: PolicyParts, catalog: PluginCatalog) {
        var scopes: [Scope] = []
        // A held request waits for whichever refresh is in flight, which any scope may have
        // started: the longest refresh timeout of the policy bounds every held wait.
        var timeouts = ([parts.refresh] + parts.routes.map(\.refresh)).filter { $0.plugin != nil }.map(\.timeout)
        // Each list read in place: joining them first copied every rule of the policy.
        for rules in [parts.rules] + parts.routes.compactMap(\.rules) {
            for rule in rules where rule.action == .refresh {
                if let timeout = rule.refresh?.timeout { timeouts.append(timeout) }
            }
        }
        let heldFor = timeouts.max()
        // The top level's table, shared by every route that keeps the top-level rules: a table
        // per route was 4 KiB and more each, 100,000 routes 400 MB and more.
        let topClassifier = Classifier(rules: parts.rules)
        // Routes with their own rules share a table when their conditions are the same (most
        // often `rules: []`, the token endpoint's route).
        var classifiers: [[Condition]: Classifier] = [parts.rules.map(\.when): topClassifier]
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
                    codePath: Self.jsonPath(classify), heldFor: heldFor,
                    classifier: route.rules.map { own in
                        let conditions = own.map(\.when)
                        if let shared = classifiers[conditions] { return shared }
                        let made = Classifier(rules: own)
                        classifiers[conditions] = made
                        return made
                    } ?? topClassifier))
        }
        scopes.append(
            Scope(
                id: "default", route: nil, rules: parts.rules, classify: parts.classify, retry: parts.retry,
                refresh: parts.refresh, logout: parts.logout, authorize: parts.authorize,
                codePath: Self.jsonPath(parts.classify), heldFor: heldFor, classifier: topClassifier))
        self.scopes = scopes
        // Delivered and failed are always reached (no rule matches); logged out only when some
        // edge leads there: no orphan node.
        let logsOut = scopes.contains { $0.reachableActions.contains(.logout) }
        var outcomes = [Node(outcome: "delivered", "delivered"), Node(outcome: "failed", "failed")]
        if logsOut { outcomes.append(Node(outcome: "logged-out", "logged out")) }
        self.outcomes = outcomes
    }

    static func jsonPath(_ source: CodeSource?) -> JSONPath? {
        if case .body(let path) = source { return JSONPath(path) }
        return nil
    }

    /// A condition in short form: `code 1401`, `status 502, 503 or error timeout`.
    package static func describe(_ when: Condition) -> String {
        var response: [String] = []
        let codes = (when.codes ?? []) + (when.codeRanges ?? []).map(\.description)
        if !codes.isEmpty { response.append("code " + codes.joined(separator: ", ")) }
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
