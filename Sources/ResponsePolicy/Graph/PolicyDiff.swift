/// What changes in behaviour between two policies, read from their compiled rule graphs: rules
/// added, removed, reordered or rewritten; each scope's effective settings and each rule's own
/// overrides; which responses refresh, log out, retry or fail; the worst case before and after.
///
/// Nothing here re-derives the flow: settings are the graph's merged ones
/// (``RuleGraph/Scope/retry(for:)`` and friends), triggers are the scope's decision table asked
/// about each status, code and error class the two policies name, and the worst case is
/// ``WorstCase``. Text that differs but means the same (comments, anchors, key order, a default
/// written out) is no change.
///
/// ```swift
/// let diff = PolicyDiff(old: try Policy.load(path: "old.yaml"), new: try Policy.load(path: "new.yaml"))
/// if diff.changes.isEmpty { print("same behaviour") }
/// ```
package struct PolicyDiff: Sendable {
    /// One difference. `old` or `new` is `nil` when the thing is added or removed.
    package struct Change: Sendable, Equatable {
        package enum Kind: String, Sendable {
            case routeAdded = "route-added"
            case routeRemoved = "route-removed"
            case ruleAdded = "rule-added"
            case ruleRemoved = "rule-removed"
            case rule
            case setting
            case trigger
            case worstCase = "worst-case"
        }

        package var kind: Kind
        /// The scope: `default` or the route's summary (`POST requests to /upload/*`).
        package var scope: String
        package var rule: String?
        /// What changed: `retry.max-retries`, `when`, `position`, `refresh` (for triggers).
        package var key: String
        package var old: String?
        package var new: String?
    }

    package var changes: [Change] = []

    package init(old: Policy, new: Policy) {
        let oldScopes = Self.keyed(old.graph.scopes)
        let newScopes = Self.keyed(new.graph.scopes)
        for (key, scope) in oldScopes where !newScopes.contains(where: { $0.key == key }) {
            changes.append(
                Change(kind: .routeRemoved, scope: key, key: "route", old: scope.summary, new: nil))
        }
        for (key, scope) in newScopes {
            guard let before = oldScopes.first(where: { $0.key == key })?.scope else {
                changes.append(Change(kind: .routeAdded, scope: key, key: "route", old: nil, new: scope.summary))
                continue
            }
            compare(before, scope, key: key)
        }
    }

    /// Scopes by a key that survives reordering routes: the route's match, or `default`.
    static func keyed(_ scopes: [RuleGraph.Scope]) -> [(key: String, scope: RuleGraph.Scope)] {
        var seen: [String: Int] = [:]
        return scopes.map { scope in
            var key = scope.route == nil ? "default" : scope.summary
            seen[key, default: 0] += 1
            if let count = seen[key], count > 1 { key += " (\(count))" }
            return (key, scope)
        }
    }

    mutating func compare(_ old: RuleGraph.Scope, _ new: RuleGraph.Scope, key scope: String) {
        // Scope-level settings: what every rule without its own override runs with.
        add(scope, nil, Self.settings(old), Self.settings(new))

        // Rules by name.
        let oldNames = old.rules.map(\.name)
        let newNames = new.rules.map(\.name)
        for (index, rule) in old.rules.enumerated() where !newNames.contains(rule.name) {
            changes.append(
                Change(
                    kind: .ruleRemoved, scope: scope, rule: rule.name, key: "rule", old: Self.describe(rule, index),
                    new: nil))
        }
        for (index, rule) in new.rules.enumerated() {
            guard let oldIndex = oldNames.firstIndex(of: rule.name) else {
                changes.append(
                    Change(
                        kind: .ruleAdded, scope: scope, rule: rule.name, key: "rule", old: nil,
                        new: Self.describe(rule, index)))
                continue
            }
            let before = old.rules[oldIndex]
            let oldWhen = RuleGraph.describe(before.when)
            let newWhen = RuleGraph.describe(rule.when)
            if oldWhen != newWhen {
                changes.append(
                    Change(kind: .rule, scope: scope, rule: rule.name, key: "when", old: oldWhen, new: newWhen))
            }
            if before.action != rule.action {
                changes.append(
                    Change(
                        kind: .rule, scope: scope, rule: rule.name, key: "then", old: before.action.rawValue,
                        new: rule.action.rawValue))
            }
            // Order matters (first match wins), but only relative to the rules both have.
            let oldOrder = oldNames.filter { newNames.contains($0) }
            let newOrder = newNames.filter { oldNames.contains($0) }
            if oldOrder.firstIndex(of: rule.name) != newOrder.firstIndex(of: rule.name) {
                changes.append(
                    Change(
                        kind: .rule, scope: scope, rule: rule.name, key: "position", old: "\(oldIndex + 1)",
                        new: "\(index + 1)"))
            }
            // A rule's own overrides: its effective settings where they differ from its scope's.
            if before.retry != nil || rule.retry != nil || before.refresh != nil || rule.refresh != nil
                || before.logout != nil || rule.logout != nil
            {
                add(scope, rule.name, Self.settings(old, for: before), Self.settings(new, for: rule))
            }
        }

        // What each action is triggered by.
        let probes = Self.probes(old) + Self.probes(new)
        let oldTriggers = Self.triggers(old, probes: probes)
        let newTriggers = Self.triggers(new, probes: probes)
        for action in [ActionKind.refresh, .logout, .retry, .fail] {
            let before = oldTriggers[action] ?? []
            let after = newTriggers[action] ?? []
            if before != after {
                changes.append(
                    Change(
                        kind: .trigger, scope: scope, key: action.rawValue, old: Self.list(before),
                        new: Self.list(after)))
            }
        }

        let oldWorst = Self.worstCase(WorstCase(scope: old))
        let newWorst = Self.worstCase(WorstCase(scope: new))
        if oldWorst != newWorst {
            changes.append(Change(kind: .worstCase, scope: scope, key: "worst-case", old: oldWorst, new: newWorst))
        }
    }

    mutating func add(_ scope: String, _ rule: String?, _ old: [(String, String)], _ new: [(String, String)]) {
        for (key, value) in new {
            let before = old.first { $0.0 == key }?.1
            if before != value {
                changes.append(Change(kind: .setting, scope: scope, rule: rule, key: key, old: before, new: value))
            }
        }
        for (key, value) in old where !new.contains(where: { $0.0 == key }) {
            changes.append(Change(kind: .setting, scope: scope, rule: rule, key: key, old: value, new: nil))
        }
    }

    // MARK: - Reading the graph

    static func describe(_ rule: Rule, _ index: Int) -> String {
        "#\(index + 1): \(RuleGraph.describe(rule.when)) -> \(rule.action.rawValue)"
    }

    /// A scope's effective settings as `section.key: value` pairs.
    static func settings(_ scope: RuleGraph.Scope) -> [(String, String)] {
        var out: [(String, String)] = [("classify", scope.classify?.description ?? "none")]
        out.append(("authorize.use", scope.authorize.name))
        out += options("authorize", scope.authorize)
        out += retry(scope.retry) + refresh(scope.refresh) + logout(scope.logout)
        return out
    }

    /// The settings a rule runs with, for the section its action uses.
    static func settings(_ scope: RuleGraph.Scope, for rule: Rule) -> [(String, String)] {
        switch rule.action {
        case .retry: return retry(scope.retry(for: rule))
        case .refresh: return refresh(scope.refresh(for: rule))
        case .logout: return logout(scope.logout(for: rule))
        case .deliver, .fail: return []
        }
    }

    static func retry(_ r: RetrySettings) -> [(String, String)] {
        [
            ("retry.max-retries", "\(r.maxRetries)"), ("retry.backoff", r.backoff.rawValue),
            ("retry.initial", r.initial.policyText), ("retry.multiplier", formatNumber(r.multiplier)),
            ("retry.max-delay", r.maxDelay?.policyText ?? "none"), ("retry.jitter", r.jitter.description),
            ("retry.retry-after", r.honorRetryAfter ? "honor" : "ignore"),
            ("retry.attempt-timeout", r.attemptTimeout?.policyText ?? "none"),
            ("retry.methods", r.methods.joined(separator: ", ")),
            ("retry.idempotency-key", r.idempotencyKey ?? "none"), ("retry.on-exhausted", r.onExhausted.rawValue),
            ("retry.deadline", r.deadline?.policyText ?? "none"),
            ("retry.budget", r.budget.map { "ratio \(formatNumber($0.ratio)), min \($0.min)" } ?? "none"),
        ]
    }

    static func refresh(_ r: RefreshSettings) -> [(String, String)] {
        var out = [("refresh.use", r.plugin?.name ?? "none")]
        if let plugin = r.plugin { out += options("refresh", plugin) }
        out += [
            ("refresh.timeout", r.timeout.policyText), ("refresh.share-window", r.shareWindow.policyText),
            ("refresh.max-per-request", "\(r.maxPerRequest)"), ("refresh.on-exhausted", r.onExhausted.rawValue),
            ("refresh.on-failure", r.onFailure.rawValue),
            ("refresh.limit", r.limit.map { "\($0.count) per \($0.per.policyText)" } ?? "none"),
            ("refresh.ahead", r.ahead?.policyText ?? "none"),
        ]
        return out
    }

    static func logout(_ l: LogoutSettings) -> [(String, String)] {
        [("logout.use", l.plugin.name)] + options("logout", l.plugin) + [
            ("logout.cancel-in-flight", "\(l.cancelInFlight)"), ("logout.cooldown", l.cooldown.policyText),
        ]
    }

    static func options(_ section: String, _ plugin: PluginReference) -> [(String, String)] {
        plugin.options.keys.sorted().compactMap { key in
            plugin.options[key].map { ("\(section).with.\(key)", $0.description) }
        }
    }

    /// Every status, code and error class a scope's rules name: what to ask the decision
    /// tables about.
    static func probes(_ scope: RuleGraph.Scope) -> [Probe] {
        var probes: [Probe] = []
        for rule in scope.rules {
            for range in rule.when.statuses ?? [] {
                probes.append(.status(range.lower))
                if range.upper != range.lower { probes.append(.status(range.upper)) }
            }
            for code in rule.when.codes ?? [] { probes.append(.code(code)) }
        }
        probes += TransportErrorClass.allCases.map(Probe.error)
        return probes
    }

    enum Probe: Hashable {
        case status(Int)
        case code(String)
        case error(TransportErrorClass)

        var text: String {
            switch self {
            case .status(let status): return "status \(status)"
            case .code(let code): return "code \(code)"
            case .error(let error): return "error \(error.rawValue)"
            }
        }
    }

    /// For each action, the probes the scope's decision table sends there (a GET to the
    /// route's path; a code arrives in a 200).
    static func triggers(_ scope: RuleGraph.Scope, probes: [Probe]) -> [ActionKind: [String]] {
        let path = scope.route?.path.map { $0.pattern.replacingOccurrences(of: "*", with: "x") } ?? "/"
        let method = scope.route?.methods?.first ?? "GET"
        var seen = Set<Probe>()
        var out: [ActionKind: [String]] = [:]
        for probe in probes where seen.insert(probe).inserted {
            let index: Int?
            switch probe {
            case .status(let status):
                index = scope.classifier.match(
                    status: status, code: nil, headers: HTTPHeaders(), method: method, path: path)
            case .code(let code):
                index = scope.classifier.match(
                    status: 200, code: code, headers: HTTPHeaders(), method: method, path: path)
            case .error(let error):
                index = scope.classifier.match(error: error, method: method, path: path)
            }
            guard let index, index < scope.rules.count else { continue }
            out[scope.rules[index].action, default: []].append(probe.text)
        }
        return out.mapValues { $0.sorted(by: Self.order) }
    }

    /// Statuses, then codes, then errors; numbers in numeric order.
    static func order(_ a: String, _ b: String) -> Bool {
        func rank(_ text: String) -> (Int, Int, String) {
            let parts = text.split(separator: " ", maxSplits: 1).map(String.init)
            let kind = ["status": 0, "code": 1, "error": 2][parts[0]] ?? 3
            let value = parts.count > 1 ? parts[1] : ""
            return (kind, Int(value) ?? Int.max, value)
        }
        return rank(a) < rank(b)
    }

    static func list(_ items: [String]) -> String? {
        items.isEmpty ? nil : items.joined(separator: ", ")
    }

    static func worstCase(_ w: WorstCase) -> String {
        var text = "\(w.attempts) attempt\(w.attempts == 1 ? "" : "s"), waits "
        text += w.waits.count > 1 ? w.waits.map(\.policyText).joined(separator: " + ") + " = " : ""
        text += w.totalWait.policyText
        text += ", total " + (w.total?.policyText ?? "unbounded")
        if w.honorsRetryAfter {
            text += " (with Retry-After " + (w.totalWithRetryAfter?.policyText ?? "unbounded") + ")"
        }
        return text
    }
}
