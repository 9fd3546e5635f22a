/// A route no request reaches because an earlier route always catches its requests.
struct ShadowedRouteRule: LintRule {
    static let description = LintRuleDescription(
        id: "shadowed-route",
        summary: "a route is shadowed by an earlier route that matches every request it matches",
        rationale: "The first matching route wins, so the later route's settings and rules never apply.",
        severity: .warning,
        triggering: [
            exampleHeader + """
                routes:
                  - match: { path: "/api/*" }
                    retry: { max-retries: 1 }
                  - match: { path: "/api/upload", method: [POST] }
                    retry: { max-retries: 0 }
                """
        ],
        nonTriggering: [
            exampleHeader + """
                routes:
                  - match: { path: "/api/upload", method: [POST] }
                    retry: { max-retries: 0 }
                  - match: { path: "/api/*" }
                    retry: { max-retries: 1 }
                """
        ])

    func check(_ context: LintContext) -> [Diagnostic] {
        var findings: [Diagnostic] = []
        let routes = context.parts.routes
        var index = RouteCoverIndex()
        var budget = Glob.coverBudget  // bounds the glob-against-glob work of the whole run
        for position in routes.indices {
            let route = routes[position]
            if let earlier = index.firstCovering(route, in: routes, budget: &budget) {
                findings.append(
                    .warning(
                        Self.description.id,
                        "route \(position + 1) never applies: route \(earlier + 1) comes first and matches every request it does",
                        at: route.range,
                        notes: [.init(range: routes[earlier].range, message: "route \(earlier + 1) is here")]))
            }
            index.add(route, at: position)
        }
        return findings
    }

    /// Whether every request `b` matches, `a` matches too.
    static func covers(_ a: Route, _ b: Route) -> Bool {
        var budget = Int.max
        return covers(a, b, budget: &budget)
    }

    /// ``covers(_:_:)`` within a budget of glob steps: `false` once it ran out.
    static func covers(_ a: Route, _ b: Route, budget: inout Int) -> Bool {
        if let methods = a.methods {
            guard let other = b.methods, other.allSatisfy(methods.contains) else { return false }
        }
        if let path = a.path {
            guard let other = b.path, other.isCovered(by: path, budget: &budget) else { return false }
        }
        return true
    }
}

/// The earlier routes of a policy, indexed by what a covering route must have, so each route is
/// compared with a few candidates rather than every route before it (that was quadratic: 5,000
/// routes took 1.9 s of CPU, 10,000 took 45 s).
///
/// Why it is exact for the usual shapes: a glob's *literal prefix* is its text before the first
/// `*` or `?`. A route `a` can cover a route `b` only if `a`'s literal prefix is a prefix of `b`'s
/// (`b` matches some path that leaves any longer literal at its first wildcard), and a route with
/// no path has the empty prefix. So the earlier routes sit in a trie of their literal prefixes,
/// and `b`'s candidates are on the one walk down its own prefix. At each node, a route whose path
/// is its prefix then `*` (`/api/*`, or no path at all) covers every later route below that node
/// with the methods it allows: only the first such route per set of methods is kept. Other routes
/// (`/api/v?/*/x`) are kept, the first 64 per node, and each candidate is checked with
/// ``Glob/isCovered(by:budget:)``, all of them within one budget of glob steps per file
/// (``Glob/coverBudget``): only a file built to be slow reaches a bound, and then a later route
/// is not reported as shadowed rather than lint taking quadratic time.
struct RouteCoverIndex {
    private struct Node {
        var children: [Unicode.Scalar: Int32] = [:]
        /// The first route per set of methods (`nil`: any method) whose path is this node's prefix
        /// and `*`, or which has no path (the root).
        var prefixRoutes: [[String]?: Int] = [:]
        /// The first routes (at most ``RouteCoverIndex/perNode``) with other patterns whose literal
        /// prefix ends here.
        var others: [Int] = []
    }

    /// At most this many general patterns are kept per literal prefix.
    static let perNode = 64

    private var nodes = [Node()]
    /// The first route per set of methods with no path: only these cover a route with no path
    /// (as ``ShadowedRouteRule/covers(_:_:)`` has it, `*` does not).
    private var pathless: [[String]?: Int] = [:]
    /// The first position of each (methods, path): a route equal to an earlier one is covered by it.
    private var exact: [ExactKey: Int] = [:]

    private struct ExactKey: Hashable {
        var methods: [String]?
        var path: Glob?
    }

    /// The scalars of `glob` before its first `*` or `?`, and whether the rest is exactly `*`.
    private static func prefix(_ glob: Glob?) -> (prefix: Substring.UnicodeScalarView, prefixStar: Bool) {
        guard let glob else { return (Substring("").unicodeScalars, true) }
        let scalars = Substring(glob.pattern).unicodeScalars
        guard let wildcard = scalars.firstIndex(where: { $0 == "*" || $0 == "?" }) else { return (scalars, false) }
        let rest = scalars[wildcard...]
        return (scalars[..<wildcard], rest.count == 1 && rest.first == "*")
    }

    private static func sortedMethods(_ methods: [String]?) -> [String]? {
        methods.map { Array(Set($0)).sorted() }
    }

    /// Records `route` at `position` (positions are added in ascending order).
    mutating func add(_ route: Route, at position: Int) {
        let methods = Self.sortedMethods(route.methods)
        let key = ExactKey(methods: methods, path: route.path)
        guard exact[key] == nil else { return }  // an equal earlier route already covers what this one would
        exact[key] = position
        let (prefix, prefixStar) = Self.prefix(route.path)
        var node = 0
        for scalar in prefix {
            if let child = nodes[node].children[scalar] {
                node = Int(child)
            } else {
                nodes.append(Node())
                nodes[node].children[scalar] = Int32(nodes.count - 1)
                node = nodes.count - 1
            }
        }
        if route.path == nil {
            if pathless[methods] == nil { pathless[methods] = position }
        }
        if prefixStar {
            if nodes[node].prefixRoutes[methods] == nil { nodes[node].prefixRoutes[methods] = position }
        } else if nodes[node].others.count < Self.perNode {
            nodes[node].others.append(position)
        }
    }

    /// The first earlier route that matches every request `route` matches, if one is found.
    func firstCovering(_ route: Route, in routes: [Route], budget: inout Int) -> Int? {
        let methods = Self.sortedMethods(route.methods)
        var best = exact[ExactKey(methods: methods, path: route.path)]
        func consider(_ candidate: Int, budget: inout Int) {
            guard candidate < (best ?? Int.max) else { return }
            if ShadowedRouteRule.covers(routes[candidate], route, budget: &budget) { best = candidate }
        }
        for (allowed, candidate) in pathless where candidate < (best ?? Int.max) {
            if let allowed {
                guard let methods, methods.allSatisfy(allowed.contains) else { continue }
            }
            best = candidate
        }
        // A route with no path is covered only by one with no path.
        guard route.path != nil else { return best }
        let (prefix, _) = Self.prefix(route.path)
        var node = 0
        var iterator = prefix.makeIterator()
        while true {
            for (allowed, candidate) in nodes[node].prefixRoutes where candidate < (best ?? Int.max) {
                // A path of this prefix and `*` (or none) matches every path below: methods decide.
                if let allowed {
                    guard let methods, methods.allSatisfy(allowed.contains) else { continue }
                }
                best = candidate
            }
            for candidate in nodes[node].others { consider(candidate, budget: &budget) }
            guard let scalar = iterator.next(), let child = nodes[node].children[scalar] else { break }
            node = Int(child)
        }
        return best
    }
}
