import Foundation
import TestSupport
import Testing

@testable import ResponsePolicy

/// The product's central promise, checked at random: what `lint`, `explain` and `graph` read
/// (the compiled ``RuleGraph``) is what the engine does.
///
/// Random policies (rules with `then:` overrides, routes with their own rules and sections,
/// escalations to deliver, fail and logout, budgets, deadlines, method limits) × random
/// simulation scripts (statuses, business codes, transport errors, timeouts, failing refreshes
/// whose answer may match a logout rule), run by the real engine on the virtual clock. For
/// every request, every transition the engine took must be an edge of the compiled graph, the
/// transitions must chain (each starts where the previous one left the request), the outcome
/// must be where the last edge leads, and `unused-section` must not fire on a section the run
/// used. Each request must end within the worst case `explain` states for its scope (and its
/// deadline), and nothing may be sent once a logout is decided: not in the instant a failed
/// refresh logs out, nor during the cooldown.
struct FlowSoundnessTests {
    /// Cases per seed batch; four batches run in parallel, 2,400 valid policies in all.
    static let casesPerBatch = 600

    @Test(arguments: [1, 2, 3, 4] as [UInt64])
    func everyTransitionTheEngineTakesIsAnEdgeOfTheCompiledGraph(_ batch: UInt64) async throws {
        // A simulation blocks the thread it runs on: a batch runs on a thread of its own, never
        // on one of the concurrency pool's few (other suites need them meanwhile).
        let (report, taken) = await Self.onOwnThread { Self.runBatch(batch) }
        if let report { Issue.record(Comment(rawValue: report)) }
        // The generator reaches every kind of transition, so the checks were exercised.
        let expected: Set<RuleGraph.EdgeKind> = [
            .noMatch, .retry, .onExhausted, .onFailure, .budget, .notRetryable, .deadline,
        ]
        #expect(expected.isSubset(of: taken), "never taken: \(expected.subtracting(taken))")
    }

    /// Runs one seed's cases; the first failure as a report with its policy and events.
    static func runBatch(_ batch: UInt64) -> (String?, Set<RuleGraph.EdgeKind>) {
        var random = SeededGenerator(seed: batch &* 0x9E37_79B9_7F4A_7C15)
        var checked = 0
        var edgesTaken = Set<RuleGraph.EdgeKind>()
        var attempts = 0
        while checked < casesPerBatch {
            attempts += 1
            if attempts > casesPerBatch * 20 { return ("too few random policies load", edgesTaken) }
            let yaml = RandomPolicy.make(&random)
            guard let policy = try? Policy.load(yaml: yaml, file: "random.yaml") else { continue }
            let script = RandomScript.make(&random, policy: policy)
            let result: Simulator.Result
            do {
                result = try Simulator.run(policy: policy, script: script)
            } catch {
                return ("\(error)\n--- policy:\n\(yaml)", edgesTaken)
            }
            let failures = check(policy, script, result, yaml: yaml, taken: &edgesTaken)
            if !failures.isEmpty {
                let events = result.events.map(\.jsonLine).joined(separator: "\n")
                let report = failures.joined(separator: "\n")
                return ("\(report)\n--- policy:\n\(yaml)\n--- events:\n\(events)", edgesTaken)
            }
            checked += 1
        }
        return (nil, edgesTaken)
    }

    /// Runs `body` on a new thread and returns its result.
    static func onOwnThread<T: Sendable>(_ body: @escaping @Sendable () -> T) async -> T {
        await withCheckedContinuation { continuation in
            let thread = Thread { continuation.resume(returning: body()) }
            thread.stackSize = 8 << 20
            thread.start()
        }
    }

    /// Every failure found in one run, as text.
    static func check(
        _ policy: Policy, _ script: SimulationScript, _ result: Simulator.Result, yaml: String,
        taken: inout Set<RuleGraph.EdgeKind>
    ) -> [String] {
        var failures: [String] = []
        let graph = policy.graph
        var used = Set<String>()
        for request in script.requests {
            let scope = graph.scope(method: request.method, path: request.path)
            let events = result.events.filter { $0.request == request.id }
            // Where the request is in the graph: after a decision, the node it left the request at.
            var at: String? = nil
            var lastTarget: String? = nil
            for event in events {
                if let id = event.edge {
                    guard let edge = graph.edge(id: id) else {
                        failures.append("\(request.id): edge \(id) is not in the compiled graph")
                        continue
                    }
                    taken.insert(edge.kind)
                }
                switch event.kind {
                case .response:
                    if let name = event.rule {
                        guard let flow = scope.compiled.first(where: { $0.rule.name == name }) else {
                            failures.append("\(request.id): rule '\(name)' is not in scope \(scope.id)")
                            continue
                        }
                        if flow.rule.when.codes != nil { used.insert("classify") }
                        let classifier = scope.id + ".classify"
                        if !scope.edges.contains(where: {
                            $0.from == classifier && $0.to == flow.node && $0.kind == .match
                        }) {
                            failures.append("\(request.id): no match edge to \(flow.node)")
                        }
                        if !flow.edges.contains(where: { $0.from == flow.node && $0.to == flow.actionNode }) {
                            failures.append("\(request.id): no edge from \(flow.node) to its action")
                        }
                        if flow.action == .retry { used.insert("retry") }
                        if flow.action == .logout { used.insert("logout") }
                        if let id = event.edge, let edge = graph.edge(id: id) {
                            if edge.from != flow.actionNode {
                                failures.append("\(request.id): took \(id), which does not leave \(flow.actionNode)")
                            }
                            if edge.kind == .retry || edge.kind == .resend {
                                at = edge.to
                            } else {
                                let action = graph.nodes.first { $0.id == edge.to }?.action
                                if event.action != action {
                                    failures.append(
                                        "\(request.id): event says \(event.action?.rawValue ?? "-"), edge leads to \(edge.to)"
                                    )
                                }
                                if action == .logout { used.insert("logout") }
                                // The oracle: the rule as written (its override, else its scope's
                                // section) says where running out leads.
                                let written = Self.written(edge.kind, flow.rule, scope)
                                if let written, written != action {
                                    failures.append(
                                        "\(request.id): \(edge.kind.rawValue) led to \(edge.to), the rule says \(written)"
                                    )
                                }
                                lastTarget = edge.to
                            }
                        } else {
                            if event.action != flow.action {
                                failures.append(
                                    "\(request.id): event action \(event.action?.rawValue ?? "-") for rule action \(flow.action)"
                                )
                            }
                            lastTarget = flow.actionNode
                            at = flow.actionNode
                        }
                    } else {
                        let allowed = [scope.noMatchResponse.id, scope.noMatchError.id, scope.attemptDeadline?.id]
                        guard let id = event.edge, allowed.contains(id), let edge = graph.edge(id: id) else {
                            failures.append("\(request.id): a response with no rule took \(event.edge ?? "no edge")")
                            continue
                        }
                        lastTarget = edge.to
                    }
                case .send:
                    // A re-send must come through the loop edge of the action that sent it back.
                    if let node = at, node != scope.id + ".classify" {
                        let flow = scope.compiled.first { $0.actionNode == node }
                        if flow?.again == nil {
                            failures.append("\(request.id): sent again from \(node), which has no loop edge")
                        }
                    }
                    at = nil
                    lastTarget = nil
                case .refreshStart: used.insert("refresh")
                case .logout: used.insert("logout")
                case .outcome:
                    if let id = event.edge, let edge = graph.edge(id: id) {
                        // A decision after a refresh ended: it leaves the refresh rule's action.
                        guard let node = at, edge.from == node else {
                            failures.append("\(request.id): outcome edge \(id) does not leave \(at ?? "-")")
                            continue
                        }
                        if graph.nodes.first(where: { $0.id == edge.to })?.action == .logout { used.insert("logout") }
                        lastTarget = edge.to
                    }
                    if let target = lastTarget, let result = event.result,
                        !Self.reaches(graph, from: target, result)
                    {
                        failures.append("\(request.id): ended \(result.rawValue), but \(target) cannot lead there")
                    }
                default: break
                }
            }
        }
        failures += boundsHold(policy, script, result)
        // unused-section must stay silent about every section the run used.
        let analysis = Policy.analyze(
            bytes: Array(yaml.utf8), file: "random.yaml", catalog: PluginCatalog(), limits: .default)
        for diagnostic in analysis.diagnostics where diagnostic.rule == "unused-section" {
            for section in used where diagnostic.message.hasPrefix("'\(section)' is set") {
                failures.append(
                    "unused-section fired on '\(section)', which the simulation used: \(diagnostic.message)")
            }
        }
        return failures
    }

    /// Each request's time from its start to its outcome is within its scope's worst case (the
    /// compiled bound `explain` states) and its deadline; no request is sent once a logout is
    /// decided (between a failed refresh's end and the logout it causes, or in the cooldown).
    static func boundsHold(_ policy: Policy, _ script: SimulationScript, _ result: Simulator.Result) -> [String] {
        var failures: [String] = []
        let graph = policy.graph
        for request in script.requests {
            let scope = graph.scope(method: request.method, path: request.path)
            guard let outcome = result.events.first(where: { $0.request == request.id && $0.kind == .outcome })
            else {
                failures.append("\(request.id): no outcome")
                continue
            }
            let took = outcome.time - request.at
            if let bound = scope.worstCase.totalWithRetryAfter ?? scope.worstCase.total, took > bound {
                failures.append(
                    "\(request.id): took \(took.policyText), beyond the worst case \(bound.policyText) explain states")
            }
            if let deadline = scope.retry.deadline, took > deadline {
                failures.append("\(request.id): took \(took.policyText), beyond its deadline \(deadline.policyText)")
            }
        }
        // The shortest cooldown any logout of the policy has.
        let cooldowns = graph.scopes.flatMap { scope in [scope.logout.cooldown] + scope.compiled.map(\.logout.cooldown)
        }
        let shortest = cooldowns.min() ?? .zero
        var failedRefreshAt: Duration?
        var sentSinceFailure: [String] = []
        var loggedOutAt: Duration?
        for event in result.events {
            switch event.kind {
            case .refreshEnd where event.ok == false:
                failedRefreshAt = event.time
                sentSinceFailure = []
            case .send:
                if failedRefreshAt == event.time { sentSinceFailure.append(event.request ?? "?") }
                if let at = loggedOutAt, event.time < at + shortest {
                    failures.append(
                        "\(event.request ?? "?"): sent at \(event.time.policyText), in the cooldown of the logout at \(at.policyText)"
                    )
                }
            case .logout:
                if event.rule == nil, failedRefreshAt == event.time, !sentSinceFailure.isEmpty {
                    failures.append(
                        "\(sentSinceFailure.joined(separator: ", ")): sent between the failed refresh and the logout it caused"
                    )
                }
                loggedOutAt = event.time
            default: break
            }
        }
        return failures
    }

    /// Where an escalation must lead by the policy text, read from the decoded model.
    static func written(_ kind: RuleGraph.EdgeKind, _ rule: Rule, _ scope: RuleGraph.Scope) -> ActionKind? {
        switch (kind, rule.action) {
        case (.onExhausted, .retry), (.budget, .retry), (.notRetryable, .retry):
            return (rule.retry ?? scope.retry).onExhausted
        case (.onExhausted, .refresh): return (rule.refresh ?? scope.refresh).onExhausted
        case (.onFailure, .refresh): return (rule.refresh ?? scope.refresh).onFailure
        case (.deadline, _): return .fail
        default: return nil
        }
    }

    /// Whether the outcome fits the node the request's last decision led to. A request can
    /// also be ended from outside (another request's logout, the cooldown) while it waits.
    static func reaches(_ graph: RuleGraph, from node: String, _ result: PolicyEvent.Result) -> Bool {
        if result == .loggedOut || result == .cancelled { return true }
        let outcome = result == .delivered ? "delivered" : "failed"
        var seen: Set<String> = [node]
        var pending = [node]
        while let next = pending.popLast() {
            if next == outcome { return true }
            for edge in graph.edges where edge.from == next && edge.kind != .retry && edge.kind != .resend {
                if seen.insert(edge.to).inserted { pending.append(edge.to) }
            }
        }
        return false
    }

    // MARK: - The policies that must stop surprising

    static let escalation = """
        policy: 1
        name: esc
        rules:
          - name: transient
            when: { status: [503] }
            then: { do: retry, max-retries: 2, on-exhausted: logout }
        retry: { backoff: constant, initial: 1s }
        logout: { cooldown: 5s }
        """

    @Test func aRuleOverrideOfOnExhaustedIsOneEdgeForEngineLintGraphAndExplain() async throws {
        let policy = try Policy.load(yaml: Self.escalation, file: "esc.yaml")
        #expect(policy.warnings.isEmpty, "\(policy.warnings.map(\.description))")
        let scope = policy.graph.scopes[0]
        let flow = scope.compiled[0]
        #expect(flow.onExhausted?.edge.id == "default.rule.1.retry>on-exhausted>default.logout")
        #expect(flow.onExhausted?.logout.cooldown == .seconds(5))
        #expect(scope.reachableActions.contains(.logout))
        #expect(policy.graph.edge(id: "default.logout>cooldown>logged-out") != nil)
        let script = SimulationScript(requests: [
            .init(id: "a", responses: Array(repeating: .init(status: 503), count: 3))
        ])
        let result = try await Simulator.run(policy: policy, script: script)
        #expect(result.summary.loggedOut == 1 && result.summary.attempts == 3)
        let last = try #require(result.events.last { $0.kind == .response })
        #expect(last.action == .logout && last.reason == "on-exhausted")
        #expect(last.edge == flow.onExhausted?.edge.id)
    }

    /// With the old budget (10 + 10 %) 50 concurrent requests meeting 503, 503, 200 were mostly
    /// delivered as 503 after one attempt; the default (100 + 20 %) retries them all.
    @Test func theDefaultBudgetRetriesABurstOfTransientErrors() async throws {
        let policy = try Policy.load(
            yaml: """
                policy: 1
                name: burst
                retry: { backoff: constant, initial: 100ms }
                rules:
                  - { name: transient, when: { status: [503] }, then: retry }
                """)
        var request = SimulationScript.Request(id: "r")
        request.responses = [.init(status: 503), .init(status: 503), .init(status: 200)]
        let script = SimulationScript(
            requests: (1...50).map { index in
                var copy = request
                copy.id = "r-\(index)"
                return copy
            })
        let result = try await Simulator.run(policy: policy, script: script)
        #expect(result.summary.delivered == 50 && result.summary.attempts == 150)
        #expect(result.events.filter { $0.kind == .outcome }.allSatisfy { $0.status == 200 })
        #expect(!result.events.contains { $0.reason == "budget" })
    }

    @Test func codeRangesMatchIntegerBusinessCodes() throws {
        let policy = try Policy.load(
            yaml: """
                policy: 1
                name: ranges
                classify: { code: body.status }
                rules:
                  - { name: client, when: { code: ["1400-1499"] }, then: fail }
                  - { name: wide, when: { code: ["100000-999999"] }, then: fail }
                """)
        let scope = policy.graph.scopes[0]
        func match(_ code: String?) -> Int? {
            scope.classifier.match(status: 200, code: code, headers: HTTPHeaders(), method: "GET", path: "/")
        }
        #expect(match("1400") == 0 && match("1499") == 0 && match("1450") == 0)
        #expect(match("1500") == nil && match("01401") == nil && match("1399") == nil && match(nil) == nil)
        #expect(match("123456") == 1 && match("99999") == nil)
        for code in ["1400", "1499", "1500", "01401", "123456", "x"] {
            let reference = scope.rules.firstIndex {
                $0.when.matches(status: 200, code: code, headers: HTTPHeaders(), method: "GET", path: "/")
            }
            #expect(match(code) == reference, "code \(code)")
        }
    }

    /// A refresh rule with `max-per-request: 0` never refreshes for a request, but the generation
    /// rule still re-sends a request refused with a token that was replaced meanwhile (here by a
    /// sign-in), without counting it: the graph draws that loop edge, as for any refresh rule.
    @Test func aRefreshRuleWithNoRefreshesPerRequestStillReSendsAReplacedToken() async throws {
        let clock = VirtualClock()
        let transport = RecordingTransport { request, _ in
            guard request.headers["Authorization"] == "Bearer token-0" else { return response(#"{"status":0}"#) }
            try await clock.sleep(until: .seconds(2))  // answered after the sign-in
            return response(#"{"status":1401}"#)
        }
        let policy = """
            policy: 1
            name: test
            classify: { code: body.status }
            rules:
              - { name: token-expired, when: { code: [1401] }, then: { do: refresh, max-per-request: 0 } }
            refresh:
              use: oauth2
              with: { token-url: "https://auth.example.com/token", client-id: app }
            """
        let refresh = CountingRefresh()
        let sim = try SimulatedEngine(policy, transport: transport, refresh: refresh, clock: clock)
        let scheduler = sim.scheduler
        let result = try await sim.run { engine -> HTTPResponse? in
            let a = Task(executorPreference: scheduler) { try? await engine.send(HTTPRequest(url: testURL, id: "a")) }
            try await clock.sleep(until: .seconds(1))  // a is out with token-0
            engine.signIn(Credentials(accessToken: "signed-in", refreshToken: "new-session"))
            return await a.value
        }
        #expect(result?.status == 200)
        #expect(transport.requests.map { $0.headers["Authorization"] } == ["Bearer token-0", "Bearer signed-in"])
        #expect(refresh.calls == 0)
        let scope = try #require(try Policy.load(yaml: policy).graph.scopes.last)
        let flow = try #require(scope.compiled.first)
        let again = try #require(flow.again, "the engine re-sent from \(flow.actionNode), which has no loop edge")
        #expect(again.kind == .resend && again.from == flow.actionNode && again.to == scope.id + ".classify")
        #expect(scope.edges.contains(again))
        // Not a refresh a request waits for: the worst case counts none.
        #expect(WorstCase(scope: scope).refreshResends == 0 && WorstCase(scope: scope).refreshWait == .zero)
    }

    @Test func aRetryThatCanNeverHappenIsNotDrawnAsOne() throws {
        let policy = try Policy.load(
            yaml: """
                policy: 1
                name: posts
                retry: { idempotency-key: none }
                rules:
                  - { name: busy, when: { status: [503], method: [POST] }, then: { do: retry, max-retries: 1 } }
                """)
        let flow = policy.graph.scopes[0].compiled[0]
        #expect(!flow.canRetry && flow.again == nil && flow.neverRetried == ["POST"])
        #expect(policy.warnings.map(\.rule) == ["never-retried"])
        #expect(WorstCase(scope: policy.graph.scopes[0]).retries == 0)
    }
}

// MARK: - Generators

enum RandomPolicy {
    static let statuses = [401, 403, 429, 500, 502, 503]
    static let codes = ["1401", "202", "\"1400-1499\"", "7"]
    static let endings = ["deliver", "fail", "logout"]

    static func make(_ r: inout SeededGenerator) -> String {
        var text = "policy: 1\nname: random\n"
        let classify = r.chance(60)
        if classify { text += "classify: { code: body.status }\n" }
        text += "rules:\n" + rules(&r, classify: classify, prefix: "r")
        text += "refresh:\n  use: oauth2\n  with: { token-url: \"https://auth.example.com/token\", client-id: app }\n"
        text += "  timeout: 1s\n  max-per-request: \(r.int(1...2))\n"
        text += "  on-exhausted: \(r.pick(endings))\n  on-failure: \(r.pick(endings))\n"
        if r.chance(30) { text += "  share-window: 300ms\n" }
        text += "logout: { cooldown: \(r.pick(["500ms", "2s", "30s"])) }\n"
        text += "retry:\n  backoff: \(r.pick(["constant", "constant", "linear", "exponential"]))\n"
        text += "  initial: \(r.pick(["100ms", "300ms", "1s"]))\n"
        if r.chance(40) { text += "  jitter: \(r.pick(["full", "equal", "\"20%\"", "\"50%\""]))\n" }
        if r.chance(40) { text += "  max-delay: \(r.pick(["200ms", "500ms", "1s"]))\n" }
        if r.chance(30) { text += "  retry-after: ignore\n" }
        text += "  max-retries: \(r.int(0...3))\n  on-exhausted: \(r.pick(endings))\n  attempt-timeout: 1s\n"
        if r.chance(30) { text += "  deadline: \(r.pick(["1s", "2s"]))\n" }
        if r.chance(40) { text += "  budget: { ratio: 0, min: \(r.int(0...1)) }\n" }
        if r.chance(30) { text += "  idempotency-key: none\n" }
        if r.chance(20) { text += "  methods: [GET, POST]\n" }
        if r.chance(50) {
            text += "routes:\n  - match: { path: \"/upload/*\"\(r.chance(50) ? ", method: [POST]" : "") }\n"
            switch r.int(0...2) {
            case 0: text += "    rules: []\n"
            case 1: text += "    rules:\n" + rules(&r, classify: classify, prefix: "u", indent: "      ")
            default: text += "    retry: { max-retries: \(r.int(0...2)), on-exhausted: \(r.pick(endings)) }\n"
            }
        }
        return text
    }

    static func rules(_ r: inout SeededGenerator, classify: Bool, prefix: String, indent: String = "  ") -> String {
        var text = ""
        for index in 1...r.int(1...5) {
            var when: [String] = []
            switch r.int(0...3) {
            case 0 where classify: when.append("code: [\(r.pick(codes))]")
            case 1: when.append("error: [\(r.pick(["timeout", "connection", "timeout, connection"]))]")
            case 2: when.append("status: [\(r.pick(statuses))], error: [timeout]")
            default: when.append("status: [\(r.pick(statuses)), \(r.pick(statuses))]")
            }
            if r.chance(20) { when.append("method: [\(r.pick(["GET", "POST"]))]") }
            let then: String
            switch r.int(0...7) {
            case 0: then = "deliver"
            case 1: then = "fail"
            case 2: then = "logout"
            case 3: then = "{ do: logout, cooldown: 1s }"
            case 4: then = "refresh"
            case 5:
                then =
                    "{ do: refresh, max-per-request: \(r.int(1...2)), on-exhausted: \(r.pick(endings)), on-failure: \(r.pick(endings)) }"
            case 6: then = "retry"
            default:
                // Each rule its own backoff: a request's waits take, retry by retry, the settings of
                // the rule that matched, which the worst case must bound.
                var own = ""
                if r.chance(50) { own += ", initial: \(r.pick(["50ms", "400ms", "1200ms"]))" }
                if r.chance(30) { own += ", backoff: \(r.pick(["linear", "exponential"]))" }
                if r.chance(30) { own += ", jitter: \"\(r.pick(["10", "30"]))%\"" }
                if r.chance(20) { own += ", max-delay: \(r.pick(["300ms", "2s"]))" }
                then =
                    "{ do: retry, max-retries: \(r.int(0...3)), on-exhausted: \(r.pick(endings))\(r.chance(30) ? ", methods: [POST]" : "")\(own) }"
            }
            text += "\(indent)- { name: \(prefix)\(index), when: { \(when.joined(separator: ", ")) }, then: \(then) }\n"
        }
        return text
    }
}

enum RandomScript {
    static func make(_ r: inout SeededGenerator, policy: Policy) -> SimulationScript {
        var script = SimulationScript()
        for index in 1...r.int(1...4) {
            var request = SimulationScript.Request(id: "q\(index)")
            request.at = .milliseconds(r.int(0...6) * 50)
            request.method = r.chance(30) ? "POST" : "GET"
            request.path = r.chance(30) ? "/upload/x" : "/items"
            if r.chance(15) { request.headers = [("Idempotency-Key", "k\(index)")] }
            for _ in 0..<r.int(1...5) { request.responses.append(response(&r)) }
            script.requests.append(request)
        }
        script.refresh = (0..<r.int(1...3)).map { _ in
            var step = SimulationScript.RefreshStep()
            step.after = .milliseconds(r.pick([50, 100, 1500]))
            // A short-lived token makes later sends refresh ahead of expiry (no rule involved).
            if r.chance(20) { step.expiresIn = .seconds(20) }
            if r.chance(40) {
                step.result = .fail
                if r.chance(50) {
                    step.status = r.pick([400, 401, 200])
                    step.body = r.pick(["{\"status\":202}", "{\"status\":1401}", "{}"])
                }
            }
            return step
        }
        return script
    }

    static func response(_ r: inout SeededGenerator) -> SimulationScript.Response {
        var response = SimulationScript.Response()
        switch r.int(0...9) {
        case 0: response.error = .connection
        case 1: response.latency = .seconds(2)  // past the 1s attempt timeout
        case 2, 3:
            response.body = r.pick(["{\"status\":1401}", "{\"status\":202}", "{\"status\":1450}", "{\"status\":7}"])
        default:
            response.status = r.pick([200, 200, 401, 403, 429, 500, 502, 503])
            response.body = "{\"status\":0}"
            // The server may ask for its own wait (up to max-delay when honoured).
            if r.chance(15) { response.headers = [("Retry-After", r.pick(["0", "1", "3"]))] }
        }
        return response
    }
}
