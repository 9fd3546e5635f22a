import Foundation

/// What changes in behaviour between two policies, read from their compiled rule graphs: rules
/// added, removed, reordered or rewritten; each scope's own settings; each rule's effective
/// settings and where its escalation edges lead; which responses refresh, log out, retry or
/// fail; the worst case before and after.
///
/// Nothing here re-derives the flow. Settings are the compiled action nodes' own
/// (``RuleGraph/Node/settings``, the texts `policy graph` prints), escalations are the compiled
/// rules' edges (``RuleGraph/CompiledRule/onExhausted`` and friends), triggers are the scope's
/// decision table asked about every case the two policies' conditions tell apart (each status
/// interval, business code and code-range piece, error class, and each method, path and header
/// a rule names), and the worst case is ``WorstCase``. Text that differs but means the same
/// (comments, anchors, key order, a default written out) is no change.
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
            /// Where one of a rule's escalation edges leads (`key`: the edge kind).
            case escalation
            case trigger
            case worstCase = "worst-case"
        }

        package var kind: Kind
        /// The scope: `default` or the route's summary (`POST requests to /upload/*`).
        package var scope: String
        package var rule: String?
        /// What changed: `retry.max-retries`, `when`, `position`, `on-exhausted` (an edge kind),
        /// `refresh` (for triggers).
        package var key: String
        package var old: String?
        package var new: String?
    }

    package var changes: [Change] = []
    /// What was not compared, and why (a scope whose conditions tell apart more request contexts
    /// than ``maxTriggerContexts``): said beside the changes, never counted as one.
    package var notes: [String] = []

    /// The most request contexts (methods × paths × header sets the two scopes' rules name) whose
    /// triggers are compared one by one. Past it, the comparison's size grows as their product
    /// (a generated 1,000-rule file named 1.2 million contexts and wrote 30 MB lines), so the
    /// triggers are not compared and a note says so; the rules, settings, edges and worst case
    /// still are, and they are the whole of what changed.
    package static let maxTriggerContexts = 250_000

    /// The most steps (a question to a decision table, a context visited) the trigger comparison
    /// of one scope may take, old and new together: about a second on one core. Only files whose
    /// rules name hundreds of paths and header sets each, with hundreds of statuses and codes,
    /// reach it (a generated 400-rule pair took 125 s before); they get the note above instead.
    package static let maxTriggerWork = 30_000_000

    package init(old: Policy, new: Policy) {
        // The dispatcher's limit holds for every request of the policy, whatever its scope.
        add(
            .setting, "default", nil, Self.prefixed("dispatch", old.dispatch.settingTexts()),
            Self.prefixed("dispatch", new.dispatch.settingTexts()))
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

    /// Scopes by a key that survives reordering routes (or a route's methods): what the route
    /// matches, or `default`.
    static func keyed(_ scopes: [RuleGraph.Scope]) -> [(key: String, scope: RuleGraph.Scope)] {
        var seen: [String: Int] = [:]
        return scopes.map { scope in
            var route = scope.route
            if let methods = route?.methods { route?.methods = Array(Set(methods)).sorted() }
            var key = route == nil ? "default" : RuleGraph.Scope.summary(route)
            seen[key, default: 0] += 1
            if let count = seen[key], count > 1 { key += " (\(count))" }
            return (key, scope)
        }
    }

    mutating func compare(_ old: RuleGraph.Scope, _ new: RuleGraph.Scope, key scope: String) {
        // What every request in the scope runs with, whichever rule it meets.
        add(.setting, scope, nil, Self.scopeSettings(old, new), Self.scopeSettings(new, old))

        let pairs = Self.pairs(old.compiled, new.compiled)
        // Order matters (first match wins), but only relative to the rules both have: each
        // paired rule's rank among them, before and after.
        let both = pairs.compactMap { pair -> (Int, Int)? in
            guard let o = pair.0, let n = pair.1 else { return nil }
            return (o, n)
        }
        var oldRank: [Int: Int] = [:]
        for (rank, pair) in both.sorted(by: { $0.0 < $1.0 }).enumerated() { oldRank[pair.0] = rank }
        var newRank: [Int: Int] = [:]
        for (rank, pair) in both.enumerated() { newRank[pair.1] = rank }
        let oldNodes = Self.actionNodes(old)
        let newNodes = Self.actionNodes(new)
        for (oldIndex, newIndex) in pairs {
            switch (oldIndex, newIndex) {
            case (let o?, nil):
                let rule = old.compiled[o]
                changes.append(
                    Change(
                        kind: .ruleRemoved, scope: scope, rule: rule.rule.name, key: "rule", old: Self.describe(rule),
                        new: nil))
            case (nil, let n?):
                let rule = new.compiled[n]
                changes.append(
                    Change(
                        kind: .ruleAdded, scope: scope, rule: rule.rule.name, key: "rule", old: nil,
                        new: Self.describe(rule)))
            case (let o?, let n?):
                let moved = oldRank[o] != newRank[n]
                compareRule(
                    (old.compiled[o], oldNodes[o]), (new.compiled[n], newNodes[n]), scope: scope, moved: moved)
            case (nil, nil):
                break
            }
        }

        // What each action is triggered by.
        let space = TriggerSpace(old, new)
        var work = Self.maxTriggerWork
        if space.tooLarge {
            notes.append(
                "\(scope == "default" ? "all other requests" : scope): triggers not compared: the rules name "
                    + "\(space.methods.count) methods × \(space.paths.count) paths × \(space.headers.count) header sets, "
                    + "more than \(Self.maxTriggerContexts) request contexts; the rule changes are listed")
        } else if let oldHolds = space.holds(old, budget: &work), let newHolds = space.holds(new, budget: &work) {
            for action in [ActionKind.refresh, .logout, .retry, .fail] {
                // The same atoms in the same contexts read the same: only an action whose triggers
                // changed is written out (its text can be long; building it for both was most of a
                // 1,000-rule diff).
                guard oldHolds.mapValues({ $0[action] }) != newHolds.mapValues({ $0[action] }) else { continue }
                let before = space.describe(oldHolds, only: action)[action] ?? []
                var after = space.describe(newHolds, only: action)[action] ?? []
                if before == after {
                    // The same text for sets of contexts that mean the same is no change; a text
                    // that cut a long list of contexts short may read alike for different ones.
                    guard after.contains(where: { $0.contains(" more request context") }) else { continue }
                    after.append("(in other request contexts)")
                }
                changes.append(
                    Change(
                        kind: .trigger, scope: scope, key: action.rawValue, old: Self.list(before),
                        new: Self.list(after)))
            }
        } else {
            notes.append(
                "\(scope == "default" ? "all other requests" : scope): triggers not compared: asking the rules about "
                    + "\(space.contexts.count) request contexts for every status and code would take more than "
                    + "\(Self.maxTriggerWork) steps; the rule changes are listed")
        }

        let oldWorst = Self.worstCase(WorstCase(scope: old))
        let newWorst = Self.worstCase(WorstCase(scope: new))
        if oldWorst != newWorst {
            changes.append(Change(kind: .worstCase, scope: scope, key: "worst-case", old: oldWorst, new: newWorst))
        }
    }

    /// A compiled rule with its own action node (`nil` for one that ends in a scope's deliver,
    /// fail or logout node).
    typealias RuleAndNode = (rule: RuleGraph.CompiledRule, node: RuleGraph.Node?)

    mutating func compareRule(_ old: RuleAndNode, _ new: RuleAndNode, scope: String, moved: Bool) {
        let before = old.rule
        let after = new.rule
        let name = after.rule.name
        if before.rule.name != name {
            changes.append(Change(kind: .rule, scope: scope, rule: name, key: "name", old: before.rule.name, new: name))
        }
        if Self.normalized(before.rule.when) != Self.normalized(after.rule.when) {
            changes.append(
                Change(
                    kind: .rule, scope: scope, rule: name, key: "when", old: Self.describe(before.rule.when),
                    new: Self.describe(after.rule.when)))
        }
        if moved {
            changes.append(
                Change(
                    kind: .rule, scope: scope, rule: name, key: "position", old: "\(before.index + 1)",
                    new: "\(after.index + 1)"))
        }
        guard before.action == after.action else {
            changes.append(
                Change(
                    kind: .rule, scope: scope, rule: name, key: "then", old: before.action.rawValue,
                    new: after.action.rawValue))
            return
        }
        add(.setting, scope, name, Self.ruleSettings(old, new), Self.ruleSettings(new, old))
        add(.escalation, scope, name, Self.escalations(before), Self.escalations(after))
    }

    mutating func add(
        _ kind: Change.Kind, _ scope: String, _ rule: String?, _ old: [(String, String)], _ new: [(String, String)]
    ) {
        for (key, value) in new {
            let before = old.first { $0.0 == key }?.1
            if before != value {
                changes.append(Change(kind: kind, scope: scope, rule: rule, key: key, old: before, new: value))
            }
        }
        for (key, value) in old where !new.contains(where: { $0.0 == key }) {
            changes.append(Change(kind: kind, scope: scope, rule: rule, key: key, old: value, new: nil))
        }
    }

    // MARK: - Rules

    /// Old and new rules paired: by name (the k-th rule of a name with the k-th of that name),
    /// then the rest by position; unpaired ones are removed or added. In new-rule order, removed
    /// rules first.
    static func pairs(_ old: [RuleGraph.CompiledRule], _ new: [RuleGraph.CompiledRule]) -> [(Int?, Int?)] {
        var oldByName: [String: [Int]] = [:]
        for rule in old { oldByName[rule.rule.name, default: []].append(rule.index) }
        var match = [Int?](repeating: nil, count: new.count)
        var taken = Set<Int>()
        for rule in new {
            if var list = oldByName[rule.rule.name], !list.isEmpty {
                let index = list.removeFirst()
                oldByName[rule.rule.name] = list
                match[rule.index] = index
                taken.insert(index)
            }
        }
        // A renamed rule at the same position is the same rule.
        let newNames = Set(new.map(\.rule.name))
        for rule in new where match[rule.index] == nil && rule.index < old.count && !taken.contains(rule.index) {
            guard !newNames.contains(old[rule.index].rule.name) else { continue }
            match[rule.index] = rule.index
            taken.insert(rule.index)
        }
        var out: [(Int?, Int?)] = old.indices.filter { !taken.contains($0) }.map { ($0, nil) }
        for rule in new { out.append((match[rule.index], rule.index)) }
        return out
    }

    static func describe(_ rule: RuleGraph.CompiledRule) -> String {
        "#\(rule.index + 1): \(describe(rule.rule.when)) -> \(rule.action.rawValue)"
    }

    /// The graph's text of a condition, with code ranges among the codes.
    static func describe(_ when: Condition) -> String { RuleGraph.describe(when) }

    /// A condition with its lists in a fixed order, without repeats, and integer codes and
    /// statuses as merged ranges, so `[503, 502]`, `[502, 503, 503]` and `["502-503"]` compare
    /// equal.
    static func normalized(_ when: Condition) -> Condition {
        var out = when
        out.statuses = when.statuses.map { ranges in
            merged(ranges.map { (Int64($0.lower), Int64($0.upper)) }).map { StatusRange(Int($0.0), Int($0.1)) }
        }
        if let codes = when.codes {
            let integers = codes.compactMap(CodeTable.canonicalInteger)
            out.codes = Array(Set(codes.filter { CodeTable.canonicalInteger($0) == nil })).sorted()
            let ranges = integers.map { ($0, $0) } + (when.codeRanges ?? []).map { ($0.lower, $0.upper) }
            out.codeRanges = merged(ranges).map { CodeRange($0.0, $0.1) }
        }
        out.errors = when.errors.map { errors in
            errors.contains(.any) ? [.any] : Array(Set(errors)).sorted { $0.rawValue < $1.rawValue }
        }
        out.methods = when.methods.map { Array(Set($0)).sorted() }
        out.headers = when.headers.map {
            $0.sorted { ($0.name.lowercased(), $0.value.pattern) < ($1.name.lowercased(), $1.value.pattern) }
        }
        return out
    }

    /// Integer ranges sorted, overlapping and adjacent ones joined.
    static func merged(_ ranges: [(Int64, Int64)]) -> [(Int64, Int64)] {
        var out: [(Int64, Int64)] = []
        for range in ranges.sorted(by: { $0 < $1 }) {
            if let last = out.last, last.1 == Int64.max || range.0 <= last.1 + 1 {
                out[out.count - 1].1 = max(last.1, range.1)
            } else {
                out.append(range)
            }
        }
        return out
    }

    // MARK: - Settings, as the graph renders them

    /// Keys of the action settings that hold for the whole scope (the engine arms them per
    /// request from the scope), compared once per scope rather than per rule.
    static let scopeKeys = Set(RetrySettings.requestWideNames + RefreshSettings.requestWideNames)
    /// Keys that say where an escalation leads (those whose value is an action): compared as
    /// the edges they compile to.
    static let edgeKeys = Set(
        (RetrySettings.infos + RefreshSettings.infos + LogoutSettings.infos).filter {
            if case .action = $0.kind { return true } else { return false }
        }.map(\.name))

    /// What a scope's every request runs with: the code source, the authorizer, the request-wide
    /// settings (attempt timeout, deadline, refresh-ahead, holding during a refresh: ``scopeKeys``),
    /// and the scope's logout node when `other` has one too
    /// (one that appears or goes shows as the rules and edges that lead there).
    static func scopeSettings(_ scope: RuleGraph.Scope, _ other: RuleGraph.Scope) -> [(String, String)] {
        var out: [(String, String)] = [("classify", scope.classify?.description ?? "none")]
        out.append(("authorize.use", scope.authorize.name))
        out += options("authorize", scope.authorize)
        out += prefixed("retry", RuleGraph.Node.settings(retry: scope.retry).filter { scopeKeys.contains($0.key) })
        out += prefixed(
            "refresh", RuleGraph.Node.settings(refresh: scope.refresh).filter { scopeKeys.contains($0.key) })
        if let node = logoutNode(scope), logoutNode(other) != nil {
            out += prefixed("logout", node.settings) + options("logout", scope.logout.plugin)
        }
        return out
    }

    static func logoutNode(_ scope: RuleGraph.Scope) -> RuleGraph.Node? {
        scope.nodes.last { $0.id == scope.id + ".logout" }
    }

    /// Each rule's action node, by rule index: its own (retry, refresh, a logout with its own
    /// settings), the scope's logout node for another logout rule, `nil` for deliver and fail.
    static func actionNodes(_ scope: RuleGraph.Scope) -> [RuleGraph.Node?] {
        let shared = logoutNode(scope)
        return scope.compiled.map { rule in rule.ownNodes.first ?? (rule.action == .logout ? shared : nil) }
    }

    /// A rule's effective settings: its action node's (the graph's texts), less the scope-wide
    /// keys and the escalation keys, with its plugin's options. Two logout rules that both run
    /// their scope's logout node are compared once, as the scope's.
    static func ruleSettings(_ pair: RuleAndNode, _ other: RuleAndNode) -> [(String, String)] {
        let rule = pair.rule
        guard let node = pair.node, node.rule != nil || other.node?.rule != nil else { return [] }
        let section = rule.action.rawValue
        var out = prefixed(
            section, node.settings.filter { !scopeKeys.contains($0.key) && !edgeKeys.contains($0.key) })
        switch rule.action {
        case .refresh: if let plugin = rule.refresh.plugin { out += options(section, plugin) }
        case .logout: out += options(section, rule.logout.plugin)
        case .retry, .deliver, .fail: break
        }
        return out
    }

    /// Where each escalation edge of a rule leads (deliver, fail or logout), by edge kind, and
    /// whether its loop edge (retry, re-send) can be taken.
    static func escalations(_ rule: RuleGraph.CompiledRule) -> [(String, String)] {
        var out: [(String, String)] = []
        if rule.action == .retry || rule.action == .refresh {
            out.append((rule.action == .retry ? "retry" : "resend", rule.again == nil ? "never" : "send again"))
        }
        let edges: [(RuleGraph.EdgeKind, RuleGraph.Escalation?)] = [
            (.onExhausted, rule.onExhausted), (.onFailure, rule.onFailure), (.refreshAnswer, rule.refreshAnswer),
            (.transient, rule.onTransient),
            (.notRetryable, rule.notRetryable), (.budget, rule.budget), (.deadline, rule.deadline),
        ]
        for (kind, escalation) in edges {
            if let escalation { out.append((kind.rawValue, escalation.action.rawValue)) }
        }
        return out
    }

    static func prefixed(_ section: String, _ settings: [RuleGraph.Setting]) -> [(String, String)] {
        settings.map { ("\(section).\($0.key)", $0.value) }
    }

    static func prefixed(_ section: String, _ settings: [(key: String, value: String)]) -> [(String, String)] {
        settings.map { ("\(section).\($0.key)", $0.value) }
    }

    static func options(_ section: String, _ plugin: PluginReference) -> [(String, String)] {
        plugin.options.keys.sorted().compactMap { key in
            plugin.options[key].map { ("\(section).with.\(key)", $0.description) }
        }
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

extension PolicyDiff {
    /// Every case two scopes' conditions tell apart, to ask their decision tables about: the
    /// status intervals their `status:` ranges cut 100–599 into, each business code and each
    /// piece their code ranges cut the integers into, each error class; in each request context
    /// their `method:`, `path:` and `header:` conditions distinguish (each one named, and one
    /// for everything else). Within such a case every condition holds or fails as a whole, so
    /// the answers are the scope's whole behaviour, not a sample of it (paths and header values
    /// are asked about with one text each glob matches).
    struct TriggerSpace {
        enum CodeAtom {
            case integer(Int64, Int64)
            case text(String)

            var probe: String {
                switch self {
                case .integer(let lower, _): return String(lower)
                case .text(let text): return text
                }
            }
        }

        struct Context {
            var method: Int
            var path: Int
            var headers: Int
        }

        var statuses: [ClosedRange<Int>] = []
        var codes: [CodeAtom] = []
        var methods: [(probe: String, label: String)] = []
        var paths: [(probe: String, label: String)] = []
        var headers: [(probe: HTTPHeaders, label: String)] = []
        var contexts: [Context] = []
        /// More contexts than ``PolicyDiff/maxTriggerContexts``: `contexts` is left empty.
        var tooLarge = false

        init(_ a: RuleGraph.Scope, _ b: RuleGraph.Scope) {
            let conditions = (a.rules + b.rules).map(\.when)

            var statusCuts: Set<Int> = [100, 600]
            for range in conditions.flatMap({ $0.statuses ?? [] }) {
                statusCuts.insert(min(600, max(100, range.lower)))
                statusCuts.insert(min(600, max(100, range.upper + 1)))
            }
            let sortedStatus = statusCuts.sorted()
            statuses = zip(sortedStatus, sortedStatus.dropFirst()).map { $0...($1 - 1) }

            var codeCuts = Set<Int64>()
            var points = Set<Int64>()
            var texts = Set<String>()
            var ranges: [CodeRange] = []
            for when in conditions {
                for code in when.codes ?? [] {
                    if let value = CodeTable.canonicalInteger(code) {
                        points.insert(value)
                        codeCuts.insert(value)
                        if value < Int64.max { codeCuts.insert(value + 1) }
                    } else {
                        texts.insert(code)
                    }
                }
                for range in when.codeRanges ?? [] {
                    ranges.append(range)
                    codeCuts.insert(range.lower)
                    if range.upper < Int64.max { codeCuts.insert(range.upper + 1) }
                }
            }
            let sortedCodes = codeCuts.sorted()
            for (index, lower) in sortedCodes.enumerated()
            where points.contains(lower) || ranges.contains(where: { $0.contains(lower) }) {
                let upper = index + 1 < sortedCodes.count ? sortedCodes[index + 1] - 1 : Int64.max
                codes.append(.integer(lower, upper))
            }
            codes += texts.sorted().map(CodeAtom.text)

            let route = a.route
            let named = Set(conditions.flatMap { $0.methods ?? [] })
            if let routeMethods = route?.methods {
                methods = Array(Set(routeMethods)).sorted().map { ($0, $0) }
            } else {
                methods = named.sorted().map { ($0, $0) }
                let other = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"].first { !named.contains($0) }
                methods.append((other ?? "X-OTHER", "other methods"))
            }

            let base = route?.path
            // "Every other path": a text the route matches (any, at the top level) that the rules'
            // own globs are unlikely to name.
            let baseProbe =
                base.map {
                    $0.pattern.replacingOccurrences(of: "*", with: "~other~").replacingOccurrences(of: "?", with: "~")
                } ?? "/~other~"
            paths = [(baseProbe, "other paths")]
            let globs = Set(conditions.compactMap(\.path)).sorted { $0.pattern < $1.pattern }
            for glob in globs {
                let probe = Self.probe(glob)
                guard glob.matches(probe), base?.matches(probe) ?? true, !paths.contains(where: { $0.probe == probe })
                else { continue }
                paths.append((probe, glob.pattern))
            }

            headers = [(HTTPHeaders(), "other headers")]
            var seenHeaders = Set<String>()
            for list in conditions.compactMap(\.headers) {
                let label = list.map { "header \($0.name) = \($0.value.pattern)" }.joined(separator: " and ")
                guard seenHeaders.insert(label).inserted else { continue }
                let probe = HTTPHeaders(list.map { ($0.name, Self.probe($0.value)) })
                guard list.allSatisfy({ $0.value.matches(Self.probe($0.value)) }) else { continue }
                headers.append((probe, label))
            }

            let (count, overflow) = methods.count.multipliedReportingOverflow(by: paths.count)
            let (total, overflow2) = count.multipliedReportingOverflow(by: headers.count)
            guard !overflow, !overflow2, total <= PolicyDiff.maxTriggerContexts else {
                tooLarge = true
                return
            }
            contexts.reserveCapacity(total)
            for method in methods.indices {
                for path in paths.indices {
                    for header in headers.indices {
                        contexts.append(Context(method: method, path: path, headers: header))
                    }
                }
            }
        }

        /// A text the glob matches.
        static func probe(_ glob: Glob) -> String {
            glob.pattern.replacingOccurrences(of: "*", with: "x").replacingOccurrences(of: "?", with: "x")
        }

        enum Atom: Hashable {
            case status(Int)
            /// A code piece and, when it acts only with some statuses, which.
            case code(Int, String)
            case error(Int)
        }

        /// For each action but deliver, what leads there in `scope`: `status 500-502`, `code
        /// 1401`, `code 1400-1499 on POST`, `error timeout at /upload/*`.
        func triggers(_ scope: RuleGraph.Scope) -> [ActionKind: [String]] {
            describe(holds(scope))
        }

        /// Where each atom leads to each action, by asking the decision table about every
        /// context one by one: contexts × (statuses + codes × statuses) questions, so cubic in
        /// the number of rules. The reference for ``holds(_:)``, which asks one question per
        /// class of contexts no rule tells apart; the tests compare the two.
        func enumeratedHolds(_ scope: RuleGraph.Scope) -> [Atom: [ActionKind: ContextSet]] {
            let actions = scope.compiled.map(\.action)
            func action(_ index: Int?) -> ActionKind { index.map { actions[$0] } ?? .deliver }
            var holds: [Atom: [ActionKind: ContextSet]] = [:]
            let count = contexts.count
            func record(_ atom: Atom, _ kind: ActionKind, _ context: Int) {
                guard kind != .deliver else { return }
                holds[atom, default: [:]][kind, default: ContextSet(count: count)].insert(context)
            }
            for (contextIndex, context) in contexts.enumerated() {
                let method = methods[context.method].probe
                let path = paths[context.path].probe
                let headers = headers[context.headers].probe
                let byStatus = statuses.map { range in
                    action(
                        scope.classifier.match(
                            status: range.lowerBound, code: nil, headers: headers, method: method, path: path))
                }
                for (index, kind) in byStatus.enumerated() { record(.status(index), kind, contextIndex) }
                for (codeIndex, code) in codes.enumerated() {
                    var changed: [ActionKind: [Int]] = [:]
                    for (index, range) in statuses.enumerated() {
                        let kind = action(
                            scope.classifier.match(
                                status: range.lowerBound, code: code.probe, headers: headers, method: method,
                                path: path))
                        if kind != byStatus[index] { changed[kind, default: []].append(index) }
                    }
                    for (kind, indices) in changed {
                        let everywhere = statuses.indices.filter { byStatus[$0] != kind }
                        let qualifier =
                            indices == everywhere
                            ? "" : " with " + runs(indices, prefix: "status").joined(separator: ", ")
                        record(.code(codeIndex, qualifier), kind, contextIndex)
                    }
                }
                for (index, error) in TransportErrorClass.allCases.enumerated() {
                    record(
                        .error(index), action(scope.classifier.match(error: error, method: method, path: path)),
                        contextIndex)
                }
            }
            return holds
        }

        /// The atoms that lead to each action, grouped and written as text.
        func describe(_ holds: [Atom: [ActionKind: ContextSet]], only: ActionKind? = nil) -> [ActionKind: [String]] {
            // Per action, atoms that hold in the same contexts are written together, adjacent
            // intervals as one range.
            var out: [ActionKind: [(order: [Int], text: String)]] = [:]
            var groups: [ActionKind: [ContextSet: [Atom]]] = [:]
            for (atom, byAction) in holds {
                for (kind, contextList) in byAction where only == nil || kind == only {
                    groups[kind, default: [:]][contextList, default: []].append(atom)
                }
            }
            for (kind, byContexts) in groups {
                for (contextList, atoms) in byContexts {
                    let suffix = qualifier(contextList)
                    let statusIndices = atoms.compactMap { atom -> Int? in
                        if case .status(let index) = atom { return index }
                        return nil
                    }.sorted()
                    for run in consecutive(statusIndices) {
                        for text in runs(run, prefix: "status") {
                            out[kind, default: []].append(([0, run[0]], text + suffix))
                        }
                    }
                    var codesByQualifier: [String: [Int]] = [:]
                    for atom in atoms {
                        if case .code(let index, let withStatus) = atom {
                            codesByQualifier[withStatus, default: []].append(index)
                        }
                    }
                    for (withStatus, indices) in codesByQualifier {
                        for (order, text) in codeTexts(indices.sorted()) {
                            out[kind, default: []].append(([1, order], text + withStatus + suffix))
                        }
                    }
                    for atom in atoms {
                        if case .error(let index) = atom {
                            out[kind, default: []].append(
                                ([2, index], "error " + TransportErrorClass.allCases[index].rawValue + suffix))
                        }
                    }
                }
            }
            return out.mapValues { items in
                items.sorted {
                    ($0.order.lexicographicallyPrecedes($1.order)) || ($0.order == $1.order && $0.text < $1.text)
                }
                .map(\.text)
            }
        }

        /// Runs of consecutive indices.
        func consecutive(_ indices: [Int]) -> [[Int]] {
            var out: [[Int]] = []
            for index in indices {
                if let last = out.last?.last, last + 1 == index {
                    out[out.count - 1].append(index)
                } else {
                    out.append([index])
                }
            }
            return out
        }

        /// Status intervals (by index) as text: `status 503`, `status 502, status 503`,
        /// `status 500-599`, one item per run.
        func runs(_ indices: [Int], prefix: String) -> [String] {
            consecutive(indices).flatMap { run in
                Self.span(Int64(statuses[run[0]].lowerBound), Int64(statuses[run[run.count - 1]].upperBound), prefix)
            }
        }

        /// Code pieces (by index) as text, adjacent integers as one range, with each run's first index.
        func codeTexts(_ indices: [Int]) -> [(Int, String)] {
            var out: [(Int, String)] = []
            var run: (first: Int, lower: Int64, upper: Int64)?
            func flush() {
                if let run { out += Self.span(run.lower, run.upper, "code").map { (run.first, $0) } }
                run = nil
            }
            for index in indices {
                switch codes[index] {
                case .integer(let lower, let upper):
                    if let current = run, current.upper < Int64.max, current.upper + 1 == lower {
                        run = (current.first, current.lower, upper)
                    } else {
                        flush()
                        run = (index, lower, upper)
                    }
                case .text(let text):
                    flush()
                    out.append((index, "code " + text))
                }
            }
            flush()
            return out
        }

        static func span(_ lower: Int64, _ upper: Int64, _ prefix: String) -> [String] {
            if lower == upper { return ["\(prefix) \(lower)"] }
            if upper == lower + 1 { return ["\(prefix) \(lower)", "\(prefix) \(upper)"] }
            return ["\(prefix) \(lower)-\(upper)"]
        }

        /// The most contexts a qualifier names one by one before it says how many more.
        static let qualifierContexts = 8

        /// Where an item holds, when not in every context: ` on POST`, ` at /a/*`, ` on POST at
        /// /a/* or on PUT`.
        func qualifier(_ set: ContextSet) -> String {
            let total = set.count
            guard total < contexts.count else { return "" }
            // Which methods, paths and header sets the contexts use, as flags: a 1,000-rule diff
            // asks this of sets of 160,000 contexts, where hashed sets were a third of its time.
            var usedMethods = [Bool](repeating: false, count: methods.count)
            var usedPaths = [Bool](repeating: false, count: paths.count)
            var usedHeaders = [Bool](repeating: false, count: headers.count)
            set.forEach { index in
                let context = contexts[index]
                usedMethods[context.method] = true
                usedPaths[context.path] = true
                usedHeaders[context.headers] = true
            }
            func indices(_ used: [Bool]) -> Set<Int> { Set(used.indices.filter { used[$0] }) }
            let m = indices(usedMethods)
            let p = indices(usedPaths)
            let h = indices(usedHeaders)
            // The last method (unless the route lists its methods) and the first path and header
            // set stand for "every other one";
            // a set holding it is written as what it leaves out.
            func describe(_ chosen: Set<Int>, _ all: [String], other: Int?, _ word: String, _ but: String) -> String {
                guard chosen.count < all.count else { return "" }
                guard let other, chosen.contains(other) else {
                    return " \(word) " + chosen.sorted().map { all[$0] }.joined(separator: ", ")
                }
                return " \(but) " + all.indices.filter { !chosen.contains($0) }.map { all[$0] }.joined(separator: ", ")
            }
            func parts(_ ms: Set<Int>, _ ps: Set<Int>, _ hs: Set<Int>) -> String {
                describe(
                    ms, methods.map(\.label), other: methods.last?.label == "other methods" ? methods.count - 1 : nil,
                    "on", "on any method but")
                    + describe(ps, paths.map(\.label), other: 0, "at", "at any path but")
                    + describe(hs, headers.map(\.label), other: 0, "with", "without")
            }
            if m.count * p.count * h.count == total { return parts(m, p, h) }
            // Not a product: the contexts one by one, the first few, and how many more (a list of
            // every one was 30 MB for a generated 100-rule pair).
            var shown: [String] = []
            var index = 0
            for (wordIndex, word) in set.words.enumerated() where word != 0 && index < Self.qualifierContexts {
                var rest = word
                while rest != 0, index < Self.qualifierContexts {
                    let context = contexts[wordIndex * 64 + rest.trailingZeroBitCount]
                    shown.append(String(parts([context.method], [context.path], [context.headers]).dropFirst()))
                    rest &= rest - 1
                    index += 1
                }
            }
            let more = total - shown.count
            return " (" + shown.joined(separator: " or ")
                + (more > 0 ? ", and \(more) more request context\(more == 1 ? "" : "s")" : "") + ")"
        }
    }
}
