import Foundation
import ResponsePolicyTesting
import TestSupport
import Testing

@testable import ResponsePolicy

/// A request's decisions driven as a value, under random policies: seeded random policies (the
/// soundness test's generator) × seeded random event orders, each request's every step one of
/// ``EngineState``'s request transitions — the top of its loop (`proceed`), its attempt's end
/// (`attemptEnded`), a refresh trigger (`refreshTrigger`), the end of a park (`afterPark`, which
/// runs the after-refresh tree), an escalation edge (`follow`), a rule's `logout` — and the
/// refresh's end (`refreshEnded`). No threads, no engine: the test performs the ``Action``s the
/// transitions return (timers on a heap of its own, refreshes it ends at a time it draws within
/// their timeout, attempts it answers within their timeout or lets time out), as the shell would.
///
/// Checked for every request of every case:
/// - its waits are within the compiled worst case `policy explain` prints (``WorstCase``): each
///   backoff wait within the n-th wait, its attempts, re-sends after a refresh and waits before
///   sending within their counts, and its whole time within the total and its deadline;
/// - every edge it reports taking (a `response` or `outcome` event) is an edge of its scope's
///   compiled flow, leaving the node of the rule that matched;
/// - nothing is sent once a logout is decided, and a logout is decided only when the server said
///   so: never on a transient refresh failure or coordination trouble.
struct RequestDecisionsModelTests {
    /// An observer, so the transitions make their events (they make none for an engine nobody
    /// watches); the test reads them from the `emit` actions.
    struct Watching: PolicyObserver {
        func observe(_ event: PolicyEvent) {}
    }

    struct Counts: CustomStringConvertible {
        var cases = 0, requests = 0, sends = 0, backoffs = 0, refreshes = 0, logouts = 0, refreshLogouts = 0
        var held = 0, edges = 0

        mutating func add(_ other: Counts) {
            cases += other.cases
            requests += other.requests
            sends += other.sends
            backoffs += other.backoffs
            refreshes += other.refreshes
            logouts += other.logouts
            refreshLogouts += other.refreshLogouts
            held += other.held
            edges += other.edges
        }

        var description: String {
            "\(cases) cases, \(requests) requests, \(sends) sends, \(backoffs) backoffs, \(refreshes) refreshes, "
                + "\(held) held, \(logouts) logouts (\(refreshLogouts) at a refresh's end), \(edges) edges checked"
        }
    }

    @Test(arguments: 0..<8)
    func randomPoliciesAndEventsStayWithinTheCompiledFlow(batch: Int) throws {
        let seeds = (0..<400).map { UInt64(batch * 400 + $0) &* 0x2545_F491_4F6C_DD1D &+ 11 }
        let (total, failures) = try Self.run(seeds) { model, random in model.run(requests: random.int(1...6)) }
        #expect(failures.isEmpty, "\(failures.joined(separator: "\n\n"))")
        // The paths are reached: sends, backoffs, refreshes, held requests, logouts.
        #expect(total.sends > 1_000 && total.backoffs > 15 && total.refreshes > 50, "\(total)")
        // (Logouts at a refresh's end are rare here, 20 % of refreshes being definitive: the biased
        // test below reaches them by the dozen.)
        #expect(total.logouts > 20 && total.held > 20 && total.edges > 20, "\(total)")
        print("request decisions under random policies (batch \(batch)): \(total)")
    }

    /// Biased to issue 18's interleaving: many requests held during a refresh that fails
    /// definitively on an edge that logs out, the woken requests run in random order. With the
    /// old order put back (the waiters woken before the logout is decided) this fails with
    /// "sent after a failed refresh's logout was decided".
    @Test func heldRequestsNeverEscapeAFailedRefreshsLogoutUnderRandomPolicies() throws {
        let seeds = (0..<600).map { UInt64($0) &* 0x9E37_79B9_7F4A_7C15 &+ 5 }
        let (total, failures) = try Self.run(seeds, definitive: 80, shared: 0, late: 0) { model, random in
            model.run(requests: random.int(4...10), within: 2)
        }
        #expect(failures.isEmpty, "\(failures.joined(separator: "\n\n"))")
        // (A definitive answer for the same credentials holds four times longer each time, so fewer
        // refreshes fail than before that: 39 logouts at a refresh's end here.)
        #expect(total.refreshLogouts > 30 && total.held > 200, "\(total)")
        print("held requests and failed refreshes under random policies: \(total)")
    }

    /// Runs one model per seed on a random policy drawn from it; the counts of all, and the
    /// failures of the first three seeds that failed (each with its policy, to replay it).
    static func run(
        _ seeds: [UInt64], definitive: Int = 20, shared: Int = 30, late: Int = 10,
        _ body: (inout Model, inout SeededGenerator) -> Void
    ) throws -> (Counts, [String]) {
        var total = Counts()
        var failures: [String] = []
        for seed in seeds {
            var random = SeededGenerator(seed: seed)
            let yaml = RandomPolicy.make(&random)
            guard let policy = try? Policy.load(yaml: yaml, file: "random.yaml") else { continue }
            var model = try Model(policy: policy, seed: seed, definitive: definitive, shared: shared, late: late)
            body(&model, &random)
            total.add(model.counts)
            if !model.failures.isEmpty {
                failures.append(
                    "seed \(seed):\n" + model.failures.prefix(5).joined(separator: "\n") + "\n--- policy:\n\(yaml)")
                if failures.count >= 3 { break }
            }
        }
        return (total, failures)
    }

    /// One case: a policy, an engine state, its requests, a clock, a timer heap and a refresh.
    struct Model {
        let policy: Policy
        var state: EngineState
        var random: SeededGenerator
        let randomSource: SeededRandomSource
        var now = Duration.zero
        let epoch = Date(timeIntervalSince1970: 1_700_000_000)
        var counts = Counts()
        var failures: [String] = []

        /// What the test keeps of a request (what its driver keeps, and what the checks need).
        struct Request {
            let id: UInt64
            let path: String
            let method: String
            let scope: RuleGraph.Scope
            let scopeIndex: Int
            let context: RequestContext
            let start: Duration
            var loop = EngineState.RequestLoop()
            var lastResponse: HTTPResponse?
            var failure: TransportError?
            var code: String?
            /// On the wire: its attempt's cancellation, and when its answer comes.
            var attempt: AttemptCancellation?
            var answerAt: Duration?
            var parkedAt: Duration?
            var attempts = 0
            /// Re-sends of the generation rule (a trigger on a token older than the current one):
            /// not counted by `max-per-request`, nor by the worst case's attempts.
            var uncounted = 0
            var held = 0
            var done = false
        }

        var requests: [UInt64: Request] = [:]
        var arrivals: [(at: Duration, path: String, method: String)] = []
        var heap: [UInt64: (token: UInt64, at: Duration)] = [:]
        /// What the refresh flight has out (a plugin call, a coordinator turn) and when it answers.
        enum Out { case call(RefreshFlight.Call), turn(UInt64) }
        var refresh: (out: Out, at: Duration)?
        /// The refresh flight's timer.
        var flightTimer: RefreshFlight.Timer?
        /// Whether the requests of this case share their session through a coordinator (turns,
        /// publications, coordination trouble) rather than alone.
        let shared: Bool
        /// A logout the compiled edges say a refresh's end decided, and until when its cooldown runs
        /// (the oracle: read from the flow, not from the state).
        var decided: (at: Duration, until: Duration)?

        /// Percent of refreshes that fail definitively.
        let definitive: Int
        /// Percent of token calls answered after their flight's timeout (its waiters released).
        let late: Int

        init(policy: Policy, seed: UInt64, definitive: Int = 20, shared: Int = 30, late: Int = 10) throws {
            self.late = late
            self.policy = policy
            self.definitive = definitive
            let runtime = PolicyRuntime(
                policy: policy, registry: PluginRegistry(),
                transport: RecordingTransport { _, _ in response("") }, environment: [:],
                overrides: PolicyEngine.Overrides(refresh: nil, logout: nil, observers: [Watching()]))
            state = EngineState(runtime: runtime)
            random = SeededGenerator(seed: seed ^ 0xABCD)
            self.shared = random.chance(shared)
            randomSource = SeededRandomSource(seed: seed)
            if random.chance(80) {
                state.credentials = Credentials(
                    accessToken: "t0",
                    expiresAt: random.chance(20) ? epoch.addingTimeInterval(Double(random.int(0...3))) : nil)
            }
        }

        mutating func fail(_ text: String) { failures.append("t=\(now.policyText): \(text)") }

        /// Runs `count` requests arriving within `within` seconds until each has its outcome.
        mutating func run(requests count: Int, within: Int = 1) {
            counts.cases = 1
            for _ in 0..<count {
                let path = random.pick(["/a", "/upload/x", "/b"])
                arrivals.append(
                    (.milliseconds(random.int(0...8 * within) * 100), path, random.pick(["GET", "POST"])))
            }
            arrivals.sort { $0.at < $1.at }
            var steps = 0
            while steps < 5_000 {
                steps += 1
                // Requests woken (or ended while parked) run at the current time, in random order,
                // interleaved with whatever else happens now.
                let runnable = requests.values.filter { request in
                    guard !request.done, request.attempt == nil, let slot = state.slots[request.id] else {
                        return false
                    }
                    return slot.phase.isWoken || slot.endReason != nil
                }.map(\.id).sorted()
                let next = nextTime()
                if !runnable.isEmpty, next.map({ $0 > now }) ?? true || random.chance(50) {
                    wake(random.pick(runnable))
                    continue
                }
                guard let at = next else { break }
                now = max(now, at)
                fire()
            }
            if steps >= 5_000 { fail("did not settle") }
            for request in requests.values where !request.done { fail("request \(request.id) never had an outcome") }
            if state.leftovers != 0 { fail("\(state.leftovers) leftovers") }
        }

        /// The earliest thing due: an arrival, an answer, a timer, the refresh's end.
        func nextTime() -> Duration? {
            var times: [Duration] = []
            if let arrival = arrivals.first { times.append(arrival.at) }
            times += requests.values.compactMap(\.answerAt)
            times += heap.values.map(\.at)
            if let refresh { times.append(refresh.at) }
            if let flightTimer { times.append(flightTimer.at) }
            return times.min()
        }

        /// Does one thing due now.
        mutating func fire() {
            var due: [Int] = []
            if arrivals.first?.at == now { due.append(0) }
            let answering = requests.values.filter { $0.answerAt == now }.map(\.id).sorted()
            if !answering.isEmpty { due.append(1) }
            let firing = heap.filter { $0.value.at <= now }.map(\.key).sorted()
            if !firing.isEmpty { due.append(2) }
            if let refresh, refresh.at <= now { due.append(3) }
            if let flightTimer, flightTimer.at <= now { due.append(4) }
            guard !due.isEmpty else { return }
            switch random.pick(due) {
            case 0: arrive()
            case 1: answer(random.pick(answering))
            case 2:
                let id = random.pick(firing)
                guard let (token, _) = heap.removeValue(forKey: id) else { return }
                perform(state.timerFired(id, token: token), for: id)
            case 3: endRefresh()
            default:
                guard let timer = flightTimer else { return }
                flightTimer = nil
                flightStep(
                    state.refresh.timerFired(timer.flight, token: timer.token, state.sessionFacts(at: now), now: now))
            }
        }

        mutating func arrive() {
            let arrival = arrivals.removeFirst()
            let id = UInt64(requests.count + 1)
            let graph = policy.graph
            let index = graph.scopeIndex(method: arrival.method, path: arrival.path)
            let scope = graph.scopes[index]
            let context = RequestContext(
                number: id, explicitID: nil, runtime: state.runtime, start: now, method: arrival.method,
                path: arrival.path)
            requests[id] = Request(
                id: id, path: arrival.path, method: arrival.method, scope: scope, scopeIndex: index, context: context,
                start: now)
            counts.requests += 1
            state.register(
                id, host: nil, dispatchLimit: .max, holdsNewRequests: scope.refresh.holdNewRequests,
                deadline: scope.deadline.map { now + $0 })
            transition(id) { state, event, loop, actions in state.proceed(event, &loop, into: &actions) }
        }

        /// Runs one transition of request `id`, as its driver does, and does what it decided.
        mutating func transition(
            _ id: UInt64, answerLogsOut: Bool? = nil, trigger: Bool = false,
            _ body: (inout EngineState, EngineState.RequestEvent, inout EngineState.RequestLoop, inout Actions) ->
                EngineState.Next
        ) {
            guard var request = requests[id] else { return }
            var departure = EngineState.Departure()
            departure.beforeSending = EngineState.RefreshRoute(scope: request.scope, rule: nil)
            let plugins = state.runtime.scopes[request.scopeIndex]
            departure.signsIn = plugins.signsIn
            departure.refreshes = plugins.refresh != nil
            departure.ahead = request.scope.refreshAhead
            departure.attemptTimeout = request.scope.attemptTimeout
            departure.coordination = shared ? .shared(waits: true, unavailable: false) : .local
            let event = EngineState.RequestEvent(
                id: id, scope: request.scope, scopeIndex: request.scopeIndex, context: request.context, now: now,
                date: epoch.addingTimeInterval(now.seconds), departure: departure, lastResponse: request.lastResponse,
                failure: request.failure, code: request.code, answerLogsOut: answerLogsOut)
            var actions = Actions()
            let resends = request.loop.refreshResends
            let next = body(&state, event, &request.loop, &actions)
            if trigger, case .send = next, request.loop.refreshResends == resends { request.uncounted += 1 }
            requests[id] = request
            perform(actions, for: id)
            apply(next, id, departure.attempt)
        }

        mutating func apply(_ next: EngineState.Next, _ id: UInt64, _ attempt: AttemptCancellation) {
            guard var request = requests[id] else { return }
            let worst = request.scope.worstCase
            switch next {
            case .send:
                counts.sends += 1
                if state.isLoggedOut(at: now) { fail("request \(id) sent in the cooldown") }
                if let decided, now >= decided.at, now < decided.until {
                    fail("request \(id) sent after a failed refresh's logout was decided at \(decided.at.policyText)")
                }
                request.attempts += 1
                if request.attempts > worst.attempts + request.uncounted {
                    fail(
                        "request \(id): attempt \(request.attempts), the worst case has \(worst.attempts) "
                            + "(+ \(request.uncounted) re-sent by the generation rule)")
                }
                if request.loop.refreshResends > worst.refreshResends {
                    fail(
                        "request \(id): \(request.loop.refreshResends) re-sends after a refresh, the worst case has \(worst.refreshResends)"
                    )
                }
                request.attempt = attempt
                // Answered within its attempt timeout, or not, and then it times out.
                let timeout = request.scope.attemptTimeout ?? .seconds(2)
                request.answerAt = now + .milliseconds(random.int(0...Int(timeout.seconds * 1_200)))
                request.parkedAt = nil
            case .park:
                request.parkedAt = now
                if case .held? = state.slots[id]?.phase {
                    counts.held += 1
                    request.held += 1
                    if request.held > worst.heldWaits {
                        fail("request \(id): held \(request.held) times, the worst case has \(worst.heldWaits)")
                    }
                }
            case .finish:
                request.done = true
                if state.slots[id] != nil { fail("request \(id) finished with its slot kept") }
                if heap[id] != nil { fail("request \(id) finished with its timer on the heap") }
                let took = now - request.start
                if let bound = worst.totalWithRetryAfter ?? worst.total, took > bound {
                    fail("request \(id) took \(took.policyText), beyond the worst case \(bound.policyText)")
                }
                if let deadline = request.scope.deadline, took > deadline {
                    fail("request \(id) took \(took.policyText), beyond its deadline \(deadline.policyText)")
                }
            case .judge(let rule, let failure):
                requests[id] = request
                let logsOut = failure.response.map { judged($0, request) == .logout } ?? false
                transition(id, answerLogsOut: logsOut) { state, event, loop, actions in
                    state.refreshFailed(event, &loop, rule: rule, failure, into: &actions)
                }
                return
            }
            requests[id] = request
        }

        /// The action of the rule a token endpoint's answer matches in `request`'s scope.
        func judged(_ response: HTTPResponse, _ request: Request) -> ActionKind? {
            request.scope.classifier.match(
                status: response.status, code: nil, headers: response.headers, method: request.method,
                path: request.path
            ).map { request.scope.rules[$0].action }
        }

        /// Request `id`'s attempt ends: a response, an error, or (its timer cancelled it) nothing;
        /// classified as the shell classifies it, then the one transition the engine runs decides
        /// (``EngineState/attemptEnded(_:_:_:into:)``).
        mutating func answer(_ id: UInt64, cancelled: Bool = false) {
            guard var request = requests[id], request.attempt != nil else { return }
            request.attempt = nil
            request.answerAt = nil
            requests[id] = request
            var classified = EngineState.Classified()
            let result: AttemptResult
            let scope = request.scope
            if cancelled {
                result = .cancelled
                classified.rule = scope.classifier.match(error: .timeout, method: request.method, path: request.path)
            } else if random.chance(15) {
                result = .error(TransportError(.connection))
                classified.rule = scope.classifier.match(error: .connection, method: request.method, path: request.path)
            } else {
                let status = random.chance(40) ? 200 : random.pick(RandomPolicy.statuses)
                let code = random.chance(30) ? random.pick(["1401", "202", "7"]) : nil
                result = .response(HTTPResponse(status: status))
                classified.code = code
                classified.rule = scope.classifier.match(
                    status: status, code: code, headers: [:], method: request.method, path: request.path)
            }
            if let rule = classified.rule, scope.compiled[rule].action == .retry {
                classified.retryable = scope.compiled[rule].retry.methods.contains(request.method)
            }
            let end = EngineState.AttemptEnd(result: result, classified: classified, random: randomSource)
            // (A re-send straight from the attempt's end is the generation rule's: not counted.)
            transition(id, trigger: true) { state, event, loop, actions in
                state.attemptEnded(event, &loop, end, into: &actions)
            }
        }

        /// A woken (or ended) request runs on: the end of its park.
        mutating func wake(_ id: UInt64) {
            guard let slot = state.slots[id] else { return }
            var transient = false
            if case .woken(.flight(let result, _), _) = slot.phase {
                switch result {
                case .failed(let failure) where !failure.isDefinitive: transient = true
                case .unavailable: transient = true
                default: break
                }
            }
            let logoutsBefore = counts.logouts
            if let parkedAt = requests[id]?.parkedAt, let request = requests[id] {
                // A wait for a refresh lasts at most its timeout (the refresh's, or the deadline's).
                let waited = now - parkedAt
                let longest = max(request.scope.worstCase.heldWait, request.scope.worstCase.refreshWait)
                if case .refresh = request.loop.waitingFor, waited > longest, longest > .zero,
                    slot.deadline.map({ now < $0 }) ?? true
                {
                    fail(
                        "request \(id) waited \(waited.policyText) for a refresh, the worst case \(longest.policyText)")
                }
            }
            transition(id) { state, event, loop, actions in state.afterPark(event, &loop, into: &actions) }
            if transient, counts.logouts > logoutsBefore {
                fail("request \(id): a transient refresh failure or coordination trouble logged the session out")
            }
        }

        /// What the refresh flight has out answers: the plugin's call (new tokens, a definitive
        /// answer, sometimes the token endpoint's, which a logout rule may match, or transient
        /// trouble, sometimes with a `Retry-After`) or the coordinator's turn (a lease, or
        /// coordination trouble).
        mutating func endRefresh() {
            guard let (out, _) = refresh else { return }
            refresh = nil
            let date = epoch.addingTimeInterval(now.seconds)
            switch out {
            case .call(let call):
                let answer: RefreshFlight.Answer
                switch random.int(0...99) {
                case ..<definitive:
                    let response = random.chance(50) ? HTTPResponse(status: random.pick([400, 401, 403])) : nil
                    var logsOut = false
                    if let response, let request = requests[call.starter.context.number] {
                        logsOut = judged(response, request) == .logout
                    }
                    answer = .failed(
                        RefreshFailure("invalid_grant", response: response, kind: .definitive), logsOut: logsOut)
                case ..<(definitive + (100 - definitive) / 2):
                    answer = .pair(Credentials(accessToken: "t\(now)"), lifetime: nil)
                default:
                    let wait: Duration? = random.chance(30) ? .milliseconds(random.int(0...20_000)) : nil
                    answer = .failed(RefreshFailure("unavailable", kind: .transient, retryAfter: wait), logsOut: false)
                }
                flightStep(
                    state.refresh.answered(
                        call.flight, call: call.number, answer, state.sessionFacts(at: now), now: now, date: date))
            case .turn(let id):
                let turn: RefreshTurn
                switch random.int(0...9) {
                case 0...5: turn = .lease(RefreshLease(fencingToken: UInt64(random.int(1...1_000)), generation: 0))
                case 6, 7: turn = .unavailable("the store is unavailable")
                case 8: turn = .failedElsewhere("invalid_grant")
                default:
                    turn =
                        random.int(0...1) == 0
                        ? .limited
                        : .retryAfter(
                            until: date.addingTimeInterval(Double(random.int(1...60))), reason: "HTTP 429 elsewhere")
                }
                flightStep(state.refresh.turn(id, turn, now: now, date: date))
            }
        }

        /// Performs a step of the refresh flight as the shell does, checking the oracle: a definitive
        /// failure (never transient trouble or coordination trouble) decides a logout when a
        /// waiter's failure edge (its rule's, its refresh-answer's, or the scope's before sending)
        /// is a logout.
        mutating func flightStep(_ step: RefreshFlight.Step) {
            var transient = false
            if case .end(let ending) = step, case .failure(let failure) = ending.outcome {
                transient = !failure.isDefinitive || ending.trouble
                if failure.isDefinitive, !ending.trouble, !state.isLoggedOut(at: now),
                    ending.flight.sessionEpoch == state.sessionEpoch,
                    let escalation = Self.loggingOut(state, ending.flight, answerLogsOut: ending.answerLogsOut)
                {
                    decided = (now, now + escalation.logout.cooldown)
                }
            }
            if case .release = step { transient = true }
            let cooldown = state.loggedOutUntil
            let actions = state.flightStep(step, now: now, date: epoch.addingTimeInterval(now.seconds))
            perform(actions, for: nil)
            if state.loggedOutUntil != cooldown {
                counts.refreshLogouts += 1
                if transient { fail("a refresh's transient failure or coordination trouble logged the session out") }
            }
        }

        /// The first waiter's failure edge that is a logout, in request order.
        static func loggingOut(_ state: EngineState, _ flight: EngineState.Flight, answerLogsOut: Bool)
            -> RuleGraph.Escalation?
        {
            for id in state.live(flight) {
                if let escalation = state.slots[id]?.refreshRoute?.escalation(answerLogsOut: answerLogsOut),
                    escalation.action == .logout
                {
                    return escalation
                }
            }
            return nil
        }

        /// Performs a transition's actions as the shell does.
        mutating func perform(_ actions: Actions, for id: UInt64?) {
            for action in actions {
                switch action {
                case .resume: break  // the request runs when the test picks it (its slot says woken)
                case .cancel(let attempt):
                    // The transport returns at once: the attempt ends with no result.
                    attempt.cancel()
                    for owner in requests.values.filter({ $0.attempt?.isCancelled == true }).map(\.id).sorted() {
                        answer(owner, cancelled: true)
                    }
                case .arm(let at, let token):
                    guard let id else {
                        fail("a timer armed for no request")
                        continue
                    }
                    heap[id] = (token, at)
                case .disarm:
                    if let id { heap[id] = nil }
                case .emit(let event):
                    check(event)
                case .save, .publish:
                    break
                case .refresh(let work):
                    switch work {
                    case .call(let call):
                        if refresh != nil { fail("a second token call while one is out") }
                        counts.refreshes += 1
                        // Answered within its flight's timeout, or a little past it (a late answer
                        // is still kept; its waiters were released at the deadline).
                        let timeout = Int((state.refresh.current?.settings.timeout ?? .seconds(10)).seconds * 1_000)
                        let after = random.chance(late) ? random.int(timeout...timeout * 2) : random.int(0...timeout)
                        refresh = (.call(call), now + .milliseconds(after))
                    case .ask(let id, _, _):
                        if refresh != nil { fail("a turn asked while the flight has something out") }
                        refresh = (.turn(id), now + .milliseconds(random.int(0...300)))
                    case .arm(let timer):
                        flightTimer = timer
                    case .disarm(let id):
                        if flightTimer?.flight == id { flightTimer = nil }
                    case .endTurn, .publishPending, .noteAccepted, .problem:
                        break
                    }
                }
            }
        }

        /// An event a transition made: the edges it names are compiled edges of its scope,
        /// leaving the rule that matched; a logout is counted.
        mutating func check(_ event: PolicyEvent) {
            if event.kind == .logout { counts.logouts += 1 }
            if event.kind == .wait, let delay = event.delay,
                let number = event.request.flatMap({ UInt64($0.dropFirst()) }), var request = requests[number]
            {
                // A backoff started (the retry is counted in the same transition).
                counts.backoffs += 1
                let worst = request.scope.worstCase
                let index = request.loop.retries - 1
                if index < 0 || index >= worst.waits.count || delay > worst.waits[index] {
                    fail(
                        "request \(number): backoff \(index + 1) of \(delay.policyText), the worst case says "
                            + "\(worst.waits.map(\.policyText))")
                }
                request.parkedAt = now
                requests[number] = request
            }
            guard let edge = event.edge else { return }
            counts.edges += 1
            guard let number = event.request.flatMap({ UInt64($0.dropFirst()) }), let request = requests[number] else {
                return fail("an edge \(edge) of no request")
            }
            let edges = request.scope.edges
            guard let compiled = edges.first(where: { $0.id == edge }) else {
                return fail("request \(number) took \(edge), not an edge of its scope's compiled flow")
            }
            if event.kind == .response, let name = event.rule,
                let rule = request.scope.compiled.first(where: { $0.rule.name == name }),
                !compiled.from.hasPrefix(rule.node)
            {
                fail("request \(number): rule '\(name)' took \(edge), which leaves another node")
            }
        }
    }
}
