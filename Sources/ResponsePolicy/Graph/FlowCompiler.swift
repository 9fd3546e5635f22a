/// Compiles one scope's rules into nodes and edges: the one place that works out what a rule
/// leads to. Everything else (engine, lint, explain, graph, diff, the fuzz oracle) reads its
/// result.
///
/// Why the escalations are edges with their own targets, not the section's values read again:
/// a rule's `then:` may override `on-exhausted`, and a route may override the sections; reading
/// the section here and the override there is how lint once said "no rule leads to logout" of a
/// policy whose retry rule logged out.
struct FlowCompiler {
    let scope: String
    let summary: String
    let classify: CodeSource?
    let retry: RetrySettings
    let refresh: RefreshSettings
    let logout: LogoutSettings
    let routeMethods: [String]?
    /// Whether some rule of the scope logs out on a response (a refresh answer can match it).
    let hasLogoutResponseRule: Bool

    /// The scope's classifier node, where every request of the scope starts.
    private let classifierNode: RuleGraph.Node
    /// The scope's own nodes after its rules' (refresh before sending, deliver, fail, logout).
    private var nodes: [RuleGraph.Node] = []
    /// One rule's edges while it is compiled (they go to its compiled rule), then, in
    /// ``finish(hasErrorRules:)``, the scope's own.
    private var edges: [RuleGraph.Edge] = []
    /// The scope's deliver, fail and logout nodes some edge leads to.
    private var terminals = Terminals()
    /// Made once, so every `match` edge shares the one text.
    private let classifierID: String
    /// The scope's terminal nodes' ids (`default.deliver`), made once.
    private let deliverID: String
    private let failID: String
    private let logoutID: String
    /// The scope's own settings, shared by every rule that overrides none of them.
    private let scopeSettings: RuleGraph.EffectiveSettings
    /// The scope's logout settings, shared by every escalation.
    private let logoutBox: RuleGraph.LogoutBox

    init(
        scope: String, summary: String, classify: CodeSource?, retry: RetrySettings, refresh: RefreshSettings,
        logout: LogoutSettings, routeMethods: [String]?, hasLogoutResponseRule: Bool
    ) {
        self.hasLogoutResponseRule = hasLogoutResponseRule
        self.scope = scope
        self.summary = summary
        self.classify = classify
        self.retry = retry
        self.refresh = refresh
        self.logout = logout
        self.routeMethods = routeMethods
        classifierID = RuleGraph.classifierID(scope: scope)
        deliverID = scope + "." + ActionKind.deliver.rawValue
        failID = scope + "." + ActionKind.fail.rawValue
        logoutID = scope + "." + ActionKind.logout.rawValue
        scopeSettings = RuleGraph.EffectiveSettings(retry: retry, refresh: refresh, logout: logout)
        logoutBox = RuleGraph.LogoutBox(logout)
        classifierNode = RuleGraph.Node(
            id: classifierID, kind: .classifier,
            label: "classify \(summary)" + (classify.map { " by \($0)" } ?? ""), scope: scope, rule: nil,
            action: nil, settings: .none)
    }

    /// The scope's node for a terminal action; a looping value (only in a policy lint refuses)
    /// is drawn as fail, which is what the engine would do with it.
    private mutating func terminal(_ kind: ActionKind) -> (ActionKind, String) {
        let kind: ActionKind = kind == .retry || kind == .refresh ? .fail : kind
        // Every deliver and fail rule reaches one: the ids are made once per scope.
        terminals.insert(kind)
        switch kind {
        case .deliver: return (kind, deliverID)
        case .logout: return (kind, logoutID)
        default: return (kind, failID)
        }
    }

    private mutating func edge(_ from: String, _ to: String, _ kind: RuleGraph.EdgeKind, _ label: String = "")
        -> RuleGraph.Edge
    {
        let edge = RuleGraph.Edge(from: from, to: to, kind: kind, label: label)
        edges.append(edge)
        return edge
    }

    private mutating func escalation(
        _ action: ActionKind, from: String, _ kind: RuleGraph.EdgeKind, _ label: String
    ) -> RuleGraph.Escalation {
        let (action, to) = terminal(action)
        return RuleGraph.Escalation(action: action, edge: edge(from, to, kind, label), logout: logoutBox)
    }

    /// Compiles one rule: its effective settings, its action node when it has one of its own,
    /// and every edge into and out of it.
    ///
    /// The rule's node and edges are held by its compiled rule, not added to lists of the
    /// scope's: ``RuleGraph/Scope/nodes`` and ``RuleGraph/Scope/edges`` are made from the
    /// compiled rules when a tool asks (a 20,000-rule scope held 20,000 nodes and 40,000 edges
    /// that lint and the engine never read).
    mutating func compile(_ rule: Rule, index: Int) -> RuleGraph.CompiledRule {
        if rule.action == .deliver || rule.action == .fail, !rule.overridesSettings {
            // What the general path below gives these rules, without making the three effective
            // sections first (copying them cost each of 20,000 deliver and fail rules dozens of
            // retains): the scope's settings, the `match` edge and one `then` edge to the
            // scope's terminal node, made when asked.
            return RuleGraph.CompiledRule(
                plain: index, rule: rule, scope: scope, settings: scopeSettings, actionNode: terminal(rule.action).1)
        }
        let id = RuleGraph.ruleNodeID(scope: scope, index: index)
        var ownNodes: [RuleGraph.Node] = []
        _ = edge(classifierID, id, .match)
        // Request-wide settings are the scope's: the decoder refuses them in a rule's `then:`
        // (`request-wide-override`), and the compiled rule states what the engine runs.
        let r = rule.retry?.withRequestWide(of: retry) ?? retry
        let f = rule.refresh?.withRequestWide(of: refresh) ?? refresh
        let l = rule.logout?.withRequestWide(of: logout) ?? logout
        var escalations = RuleGraph.Escalations()
        var again: RuleGraph.Edge?
        var methods: [String]?
        var neverRetried: [String] = []
        let actionNode: String
        switch rule.action {
        case .deliver, .fail:
            actionNode = terminal(rule.action).1
            _ = edge(id, actionNode, .then)
        case .logout:
            if l != logout {
                actionNode = id + ".logout"
                ownNodes.append(
                    RuleGraph.Node(id: actionNode, action: .logout, scope: scope, rule: index, settings: .logout(l)))
                _ = edge(id, actionNode, .then)
                _ = edge(actionNode, "logged-out", .cooldown, "cooldown \(l.cooldown.policyText)")
            } else {
                actionNode = terminal(.logout).1
                _ = edge(id, actionNode, .then)
            }
        case .retry:
            actionNode = id + ".retry"
            ownNodes.append(
                RuleGraph.Node(id: actionNode, action: .retry, scope: scope, rule: index, settings: .retry(r)))
            _ = edge(id, actionNode, .then)
            methods = Self.methodsSeen(rule.when.methods, routeMethods)
            if r.idempotencyKey == nil, let seen = methods {
                neverRetried = seen.filter { !r.methods.contains($0) }
            }
            let retriesSomething = r.maxRetries > 0 && (methods == nil || neverRetried.count < (methods?.count ?? 0))
            if retriesSomething {
                let times = r.maxRetries == 1 ? "1 time" : "\(r.maxRetries) times"
                again = edge(actionNode, classifierID, .retry, "again after backoff, up to \(times)")
            }
            escalations.onExhausted = escalation(r.onExhausted, from: actionNode, .onExhausted, "on-exhausted")
            if r.maxRetries > 0 {
                // Some request reaching the rule may not be retryable: any method when the rule
                // does not restrict them (a POST without a key), or a listed one outside `methods`.
                let someNotRetryable = methods.map { $0.contains { !r.methods.contains($0) } } ?? true
                if someNotRetryable {
                    escalations.notRetryable = escalation(
                        r.onExhausted, from: actionNode, .notRetryable, "not retryable")
                }
            }
            if retriesSomething {
                if r.budget != nil {
                    escalations.budget = escalation(r.onExhausted, from: actionNode, .budget, "budget refused")
                }
                if retry.deadline != nil {
                    escalations.deadline = escalation(.fail, from: actionNode, .deadline, "wait past deadline")
                }
            }
        case .refresh:
            actionNode = id + ".refresh"
            ownNodes.append(
                RuleGraph.Node(id: actionNode, action: .refresh, scope: scope, rule: index, settings: .refresh(f)))
            _ = edge(id, actionNode, .then)
            // Every refresh rule, `max-per-request: 0` too: the generation rule re-sends, uncounted,
            // a request refused with a token another refresh or a sign-in has replaced meanwhile.
            again = edge(actionNode, classifierID, .resend, "re-send with the new token")
            escalations.onExhausted = escalation(f.onExhausted, from: actionNode, .onExhausted, "on-exhausted")
            escalations.onFailure = escalation(f.onFailure, from: actionNode, .onFailure, "on-failure")
            escalations.onTransient = escalation(
                .fail, from: actionNode, .transient, "transient trouble past timeout \(f.timeout.policyText)")
            if f.onFailure != .logout, hasLogoutResponseRule {
                escalations.refreshAnswer = escalation(
                    .logout, from: actionNode, .refreshAnswer, "refresh answer matches a logout rule")
            } else if f.onFailure == .logout {
                // The answer logs out either way; the engine names the edge it took.
                escalations.refreshAnswer = escalations.onFailure
            }
        }
        // A rule that overrides nothing runs with exactly its scope's settings (r, f and l are
        // then the sections themselves): it shares the scope's box.
        let settings =
            rule.overridesSettings ? RuleGraph.EffectiveSettings(retry: r, refresh: f, logout: l) : scopeSettings
        defer { edges.removeAll(keepingCapacity: true) }
        return RuleGraph.CompiledRule(
            index: index, rule: rule, scope: scope, settings: settings, actionNode: actionNode,
            edges: edges[...], ownNodes: ownNodes, escalations: escalations, again: again,
            methods: methods, neverRetried: neverRetried)
    }

    /// The terminal actions some edge leads to, as bits: a hashed set cost every rule a hash.
    struct Terminals {
        private var bits: UInt8 = 0

        private static func bit(_ kind: ActionKind) -> UInt8 {
            switch kind {
            case .deliver: return 1
            case .fail: return 2
            case .logout: return 4
            case .retry: return 8
            case .refresh: return 16
            }
        }

        mutating func insert(_ kind: ActionKind) { bits |= Self.bit(kind) }

        func contains(_ kind: ActionKind) -> Bool { bits & Self.bit(kind) != 0 }
    }

    struct Finished {
        /// The classifier node, then (in ``nodes``) the scope's nodes after its rules'.
        var classifierNode: RuleGraph.Node
        var nodes: [RuleGraph.Node]
        /// The scope's own edges, after its rules'.
        var edges: [RuleGraph.Edge]
        var noMatchResponse: RuleGraph.Edge
        var noMatchError: RuleGraph.Edge
        var attemptDeadline: RuleGraph.Edge?
        var beforeSending: RuleGraph.Escalation?
    }

    /// Adds the scope's own edges (no match, the attempt's deadline) and its terminal nodes.
    mutating func finish(hasErrorRules: Bool) -> Finished {
        // The refresh the engine starts before sending a request (ahead of the token's expiry, or
        // to sign in when nothing is stored) has no rule: its failure follows the section's
        // on-failure from a node of the scope's own.
        var beforeSending: RuleGraph.Escalation?
        if refresh.plugin != nil {
            let id = scope + ".refresh-before-send"
            var label = "refresh before sending ("
            label += refresh.ahead.map { "when the token expires within \($0.policyText), or " } ?? ""
            label += "to sign in)"
            nodes.append(
                RuleGraph.Node(
                    id: id, kind: .action, label: label, scope: scope, rule: nil, action: .refresh,
                    settings: .refresh(refresh)))
            _ = edge(classifierID, id, .then, "before sending")
            beforeSending = escalation(refresh.onFailure, from: id, .onFailure, "on-failure")
            _ = edge(id, terminal(.fail).1, .transient, "transient trouble past timeout \(refresh.timeout.policyText)")
        }
        let deliver = terminal(.deliver).1
        let fail = terminal(.fail).1
        let noMatchResponse = edge(classifierID, deliver, .noMatch, "no rule matches")
        let noMatchError = edge(classifierID, fail, .noMatch, "failed attempt, no rule matches")
        let attemptDeadline = retry.deadline == nil ? nil : edge(classifierID, fail, .deadline, "deadline")
        _ = edge(deliver, "delivered", .outcome)
        if hasErrorRules {
            // A rule matching a failed attempt can lead to deliver with nothing to deliver.
            _ = edge(deliver, "failed", .outcome, "no response")
        }
        _ = edge(fail, "failed", .outcome)
        if terminals.contains(.logout) {
            _ = edge("\(scope).logout", "logged-out", .cooldown, "cooldown \(logout.cooldown.policyText)")
        }
        for kind in [ActionKind.deliver, .fail, .logout] where terminals.contains(kind) {
            let label = kind == .logout ? "logout (cooldown \(logout.cooldown.policyText))" : kind.rawValue
            nodes.append(
                RuleGraph.Node(
                    id: "\(scope).\(kind.rawValue)", kind: .action, label: label, scope: scope, rule: nil,
                    action: kind, settings: kind == .logout ? .logout(logout) : .none))
        }
        return Finished(
            classifierNode: classifierNode, nodes: nodes, edges: edges, noMatchResponse: noMatchResponse,
            noMatchError: noMatchError, attemptDeadline: attemptDeadline, beforeSending: beforeSending)
    }

    /// The methods a rule sees: its own `method:` and its route's together.
    static func methodsSeen(_ rule: [String]?, _ route: [String]?) -> [String]? {
        switch (rule, route) {
        case (nil, nil): return nil
        case (let only?, nil), (nil, let only?): return only
        case (let a?, let b?): return a.filter(b.contains)
        }
    }

    static func retryLabel(_ r: RetrySettings) -> String {
        var text = "retry (max \(r.maxRetries), \(r.backoff.rawValue) \(r.initial.policyText)"
        if r.backoff == .exponential { text += " ×\(formatNumber(r.multiplier))" }
        if let cap = r.maxDelay { text += " ≤ \(cap.policyText)" }
        return text + ")"
    }

    static func refreshLabel(_ f: RefreshSettings) -> String {
        "refresh via \(f.plugin?.name ?? "no plugin") (max \(f.maxPerRequest) per request"
            + (f.shareWindow > .zero ? ", share-window \(f.shareWindow.policyText)" : "")
            + (f.transient == nil ? ", transient: none)" : ", transient retried within \(f.timeout.policyText))")
    }
}

extension RuleGraph.Node {
    init(outcome id: String, _ label: String) {
        self.init(id: id, kind: .outcome, label: label, scope: nil, rule: nil, action: nil, settings: .none)
    }
}
