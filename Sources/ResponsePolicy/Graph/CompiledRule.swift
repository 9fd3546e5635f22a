extension RuleGraph {
    /// The id of a scope's classifier node (`default.classify`), where its requests start.
    package static func classifierID(scope: String) -> String { scope + ".classify" }

    /// The id of rule `index` (0-based) of a scope (`default.rule.3`).
    package static func ruleNodeID(scope: String, index: Int) -> String { scope + ".rule." + String(index + 1) }

    /// What an edge stands for: the engine decision that takes it.
    ///
    /// Every transition a request can make is one of these, from one node to another; `policy
    /// graph --format json` prints the raw values, and simulation events name the edge they took.
    package enum EdgeKind: String, Sendable, Hashable, CaseIterable {
        /// Classifier → rule: the rule is the first to match.
        case match
        /// Classifier → deliver (a response) or fail (a failed attempt): no rule matches.
        case noMatch = "no-match"
        /// Rule → its action.
        case then
        /// Retry → classifier: sent again after the backoff wait.
        case retry
        /// Refresh → classifier: re-sent with the new token.
        case resend
        /// Retries or refresh re-sends ran out.
        case onExhausted = "on-exhausted"
        /// The refresh failed definitively (any RFC 6749 §5.2 code, any other 4xx but 408, 425
        /// and 429, or an answer a `refresh`, `fail` or `logout` rule matches: ``TokenAnswer``).
        case onFailure = "on-failure"
        /// Transient refresh trouble (5xx, 408, 425, 429, `temporarily_unavailable`, `slow_down`,
        /// no answer) outlasted `refresh.timeout`, retried meanwhile: the request fails and the
        /// session goes on.
        case transient
        /// The refresh endpoint's own answer matched a `logout` rule: the session ends whatever
        /// `on-failure` says.
        case refreshAnswer = "refresh-answer"
        /// The retry budget refused the retry (it follows `on-exhausted`).
        case budget
        /// The deadline ended the request: an attempt reached it, or a wait would end past it.
        case deadline
        /// The request's method is not in `retry.methods` and it carries no idempotency key (it
        /// follows `on-exhausted`).
        case notRetryable = "not-retryable"
        /// Logout → logged out, for the cooldown.
        case cooldown
        /// Deliver → delivered, fail → failed; deliver → failed when there is no response.
        case outcome
    }

    /// A node of the compiled graph. Ids are stable for the same policy text: `default.classify`,
    /// `route-1.rule.3`, `default.rule.3.retry`, `default.logout`, `delivered`.
    package struct Node: Sendable, Hashable {
        package enum Kind: String, Sendable, Hashable { case classifier, rule, action, outcome }
        package let id: String
        package let kind: Kind
        /// What the node says, for drawings: `3. expired: code 1401`, `retry (2x, exponential)`.
        package var label: String {
            switch labelSource {
            case .text(let text): return text
            case .rule(let rule):
                return "\(self.rule.map { $0 + 1 } ?? 0). \(rule.name): \(RuleGraph.describe(rule.when))"
            case .settings:
                switch source {
                case .none: return ""
                case .retry(let r): return FlowCompiler.retryLabel(r)
                case .refresh(let f): return FlowCompiler.refreshLabel(f)
                case .logout(let l): return "logout (cooldown \(l.cooldown.policyText))"
                }
            }
        }
        /// A rule node's label is made from its rule when asked: compiling a 20,000-rule policy
        /// built 20,000 texts nothing but `graph` and `explain` read.
        private let labelSource: RuleGraph.LabelSource
        /// The scope it belongs to (`nil` for the shared outcomes).
        package let scope: String?
        /// For a rule node and a rule's own action node: the rule's 0-based position in its scope.
        package let rule: Int?
        /// For an action node: the action.
        package let action: ActionKind?
        /// What ``settings`` are read from (kept as the settings themselves: texts are made only
        /// when a tool asks, so compiling a 20,000-rule policy builds none).
        let source: SettingsSource

        /// For an action node: its effective settings (section, then route, then rule override),
        /// as policy text, in a fixed order.
        package var settings: [Setting] {
            switch source {
            case .none: return []
            case .retry(let r): return Self.settings(retry: r)
            case .refresh(let f): return Self.settings(refresh: f)
            case .logout(let l): return Self.settings(logout: l)
            }
        }

        init(
            id: String, kind: Kind, label: String, scope: String?, rule: Int?, action: ActionKind?,
            settings source: SettingsSource
        ) {
            self.init(
                id: id, kind: kind, labelSource: .text(label), scope: scope, rule: rule, action: action,
                settings: source)
        }

        /// A rule's own action node (retry, refresh, a logout with its own settings), labelled
        /// from its settings when asked: `retry (max 3, exponential 1s ×2 ≤ 8s)`. Made for every
        /// retry and refresh rule, these texts were a third of compiling a policy of such rules.
        init(id: String, action: ActionKind, scope: String, rule index: Int, settings source: SettingsSource) {
            self.init(
                id: id, kind: .action, labelSource: .settings, scope: scope, rule: index, action: action,
                settings: source)
        }

        /// A rule's node, labelled `N. name: condition` (N from 1).
        init(id: String, scope: String, rule: Rule, index: Int) {
            self.init(
                id: id, kind: .rule, labelSource: .rule(rule), scope: scope, rule: index, action: nil, settings: .none)
        }

        private init(
            id: String, kind: Kind, labelSource: RuleGraph.LabelSource, scope: String?, rule: Int?, action: ActionKind?,
            settings source: SettingsSource
        ) {
            self.id = id
            self.kind = kind
            self.labelSource = labelSource
            self.scope = scope
            self.rule = rule
            self.action = action
            self.source = source
        }

        /// Compared as before labels were made lazily: by what the node says, not by how.
        package static func == (a: Node, b: Node) -> Bool {
            a.id == b.id && a.kind == b.kind && a.scope == b.scope && a.rule == b.rule && a.action == b.action
                && a.source == b.source && a.label == b.label
        }

        package func hash(into hasher: inout Hasher) {
            hasher.combine(id)
            hasher.combine(kind)
            hasher.combine(label)
            hasher.combine(scope)
            hasher.combine(rule)
            hasher.combine(action)
            hasher.combine(source)
        }
    }

    /// Where a node's label comes from: its text, a rule node's rule, or an action node's
    /// settings.
    enum LabelSource: Sendable {
        case text(String)
        case rule(Rule)
        case settings
    }

    /// Boxed (`indirect`): a node of a deliver or fail rule holds no settings, and inline the
    /// largest case made every node of a 20,000-rule graph as large as a retry section.
    indirect enum SettingsSource: Sendable, Hashable {
        case none
        case retry(RetrySettings)
        case refresh(RefreshSettings)
        case logout(LogoutSettings)
    }

    /// One effective setting, as it would be written in the policy: `max-retries` = `2`.
    package struct Setting: Sendable, Hashable {
        package let key: String
        package let value: String
    }

    /// A transition the engine can take.
    package struct Edge: Sendable, Hashable {
        package let from: String
        package let to: String
        package let kind: EdgeKind
        /// A short text for drawings (`on-exhausted`, `cooldown 20s`); may be empty.
        package let label: String

        /// Stable and unique within a graph: `default.rule.1.retry>on-exhausted>default.logout`.
        package var id: String { from + ">" + kind.rawValue + ">" + to }
    }

    /// Where an escalation edge leads, as the engine follows it: deliver, fail or logout (with
    /// that logout's settings), and the edge itself so the engine can say which it took.
    package struct Escalation: Sendable {
        package let action: ActionKind
        package let edge: Edge
        /// The scope's logout settings, by reference: one box per scope, shared by every
        /// escalation (inline, they made each retry or refresh rule a kilobyte larger).
        let logoutBox: LogoutBox
        package var logout: LogoutSettings { logoutBox.value }

        init(action: ActionKind, edge: Edge, logout: LogoutBox) {
            self.action = action
            self.edge = edge
            logoutBox = logout
        }
    }

    /// A scope's logout settings held by reference. Immutable.
    final class LogoutBox: Sendable {
        let value: LogoutSettings
        init(_ value: LogoutSettings) { self.value = value }
    }

    /// One rule as the engine runs it in one scope: its effective settings and every edge that
    /// leaves it or its action.
    ///
    /// The engine reads the escalations (``onExhausted``, ``budget``, …) when it decides; lint,
    /// `explain`, `graph` and `diff` read the same values. A class, so the engine reaches one per
    /// classified response with a retain, not a copy of three settings structs.
    ///
    /// Concurrency contract: immutable; share it freely.
    package final class CompiledRule: Sendable {
        /// The 0-based position in its scope's rules (drawings number rules from 1).
        package let index: Int
        package let rule: Rule
        /// Effective settings: the section, then the route's, then the rule's override. Held by
        /// reference: every rule without a `then:` mapping shares its scope's one box (copies
        /// of the three sections were most of a 20,000-rule graph's memory).
        let settings: EffectiveSettings
        package var retry: RetrySettings { settings.retry }
        package var refresh: RefreshSettings { settings.refresh }
        package var logout: LogoutSettings { settings.logout }
        /// The rule's node (`default.rule.3`: made when asked, as nothing but tools reads it),
        /// and the node of its action (its own for retry, refresh and a logout with overrides;
        /// the scope's deliver, fail or logout node otherwise).
        package var node: String { RuleGraph.ruleNodeID(scope: scope, index: index) }
        package let actionNode: String
        /// The scope's id (`default`, `route-1`).
        private let scope: String
        /// The rule's nodes in the scope's graph: its own (labelled `N. name: condition`, made
        /// when asked), then its action node when it has one of its own.
        package var nodes: [Node] { [Node(id: node, scope: scope, rule: rule, index: index)] + ownNodes }
        /// The rule's own action node (retry, refresh, a logout with overrides), or none.
        package let ownNodes: [Node]
        /// The edge into the rule node, and the edges leaving it and its own action node.
        package var edges: [Edge] {
            if let storedEdges { return storedEdges }
            let node = node
            return [
                Edge(from: classifierNode, to: node, kind: .match, label: ""),
                Edge(from: node, to: actionNode, kind: .then, label: ""),
            ]
        }
        /// `nil` for a rule whose edges are just `match` and `then` (every deliver and fail rule):
        /// made when asked, instead of an array of two edges held by each of 20,000 rules.
        private let storedEdges: [Edge]?
        /// The scope's classifier node, where the `match` edge starts.
        private var classifierNode: String { RuleGraph.classifierID(scope: scope) }
        /// The escalations below, boxed, `nil` for a rule that has none (deliver, fail, logout):
        /// inline, seven optional escalations with their logout settings cost every rule 1 KB.
        let escalations: EscalationBox?
        /// `retry` and `refresh`: where running out leads.
        package var onExhausted: Escalation? { escalations?.value.onExhausted }
        /// `refresh`: where a failed refresh leads.
        package var onFailure: Escalation? { escalations?.value.onFailure }
        /// `refresh`: the refresh endpoint answered with a response a `logout` rule matches.
        package var refreshAnswer: Escalation? { escalations?.value.refreshAnswer }
        /// `refresh`: transient trouble outlasted `refresh.timeout` (always to fail).
        package var onTransient: Escalation? { escalations?.value.onTransient }
        /// `retry`: the budget refused the retry.
        package var budget: Escalation? { escalations?.value.budget }
        /// `retry`: the request cannot be retried (method, no idempotency key).
        package var notRetryable: Escalation? { escalations?.value.notRetryable }
        /// `retry`: the wait would end past the deadline.
        package var deadline: Escalation? { escalations?.value.deadline }
        /// `retry` and `refresh`: the loop edge (sent again), `nil` when it can never be taken.
        package let again: Edge?
        /// `retry`: the methods this rule can see (rule and route `method:` together); `nil`
        /// when any method can reach it.
        package let methods: [String]?
        /// `retry`: the methods it sees that are never retried (not in `methods`, and no
        /// idempotency key can make them retryable). All of them when the rule never retries.
        package let neverRetried: [String]

        /// A deliver or fail rule that overrides nothing: the scope's settings, `match` and `then`
        /// edges alone, no escalations (made without the general initializer's seven empty
        /// escalations, for each of 20,000 such rules).
        init(plain index: Int, rule: Rule, scope: String, settings: EffectiveSettings, actionNode: String) {
            self.index = index
            self.rule = rule
            self.scope = scope
            self.settings = settings
            self.actionNode = actionNode
            ownNodes = []
            storedEdges = nil
            escalations = nil
            again = nil
            methods = nil
            neverRetried = []
        }

        init(
            index: Int, rule: Rule, scope: String, settings: EffectiveSettings, actionNode: String,
            edges: ArraySlice<Edge>, ownNodes: [Node], escalations: Escalations, again: Edge?, methods: [String]?,
            neverRetried: [String]
        ) {
            self.index = index
            self.rule = rule
            self.scope = scope
            self.settings = settings
            self.actionNode = actionNode
            self.ownNodes = ownNodes
            let node = RuleGraph.ruleNodeID(scope: scope, index: index)
            let plain =
                edges.count == 2
                && edges.first == Edge(from: RuleGraph.classifierID(scope: scope), to: node, kind: .match, label: "")
                && edges.last == Edge(from: node, to: actionNode, kind: .then, label: "")
            storedEdges = plain ? nil : Array(edges)
            self.escalations = escalations.isEmpty ? nil : EscalationBox(escalations)
            self.again = again
            self.methods = methods
            self.neverRetried = neverRetried
        }

        package var action: ActionKind { rule.action }

        /// Whether a request can ever be sent again under this rule.
        package var canRetry: Bool { rule.action == .retry && again != nil }
    }

    struct Escalations: Sendable {
        var onExhausted: Escalation?
        var onFailure: Escalation?
        var refreshAnswer: Escalation?
        var onTransient: Escalation?
        var budget: Escalation?
        var notRetryable: Escalation?
        var deadline: Escalation?

        var isEmpty: Bool {
            onExhausted == nil && onFailure == nil && refreshAnswer == nil && onTransient == nil && budget == nil
                && notRetryable == nil && deadline == nil
        }
    }

    /// A compiled rule's escalations, held by reference. Immutable.
    final class EscalationBox: Sendable {
        let value: Escalations
        init(_ value: Escalations) { self.value = value }
    }

    /// The settings a compiled rule runs with, held by reference so that the rules of a scope
    /// that override nothing share one. Immutable.
    final class EffectiveSettings: Sendable {
        let retry: RetrySettings
        let refresh: RefreshSettings
        let logout: LogoutSettings

        init(retry: RetrySettings, refresh: RefreshSettings, logout: LogoutSettings) {
            self.retry = retry
            self.refresh = refresh
            self.logout = logout
        }
    }
}

extension RuleGraph.Node {
    /// The effective settings of an action, as policy text, in the order of the section's keys
    /// (``SettingsSection/keys``); a refresh or logout action's plugin first, as `use`.
    package static func settings(retry r: RetrySettings) -> [RuleGraph.Setting] {
        r.settingTexts().map { RuleGraph.Setting(key: $0.key, value: $0.value) }
    }

    package static func settings(refresh r: RefreshSettings) -> [RuleGraph.Setting] {
        [RuleGraph.Setting(key: "use", value: r.plugin?.name ?? "none")]
            + r.settingTexts().map { RuleGraph.Setting(key: $0.key, value: $0.value) }
    }

    package static func settings(logout l: LogoutSettings) -> [RuleGraph.Setting] {
        [RuleGraph.Setting(key: "use", value: l.plugin.name)]
            + l.settingTexts().map { RuleGraph.Setting(key: $0.key, value: $0.value) }
    }
}
