import Foundation
import ResponsePolicyTesting
import TestSupport
import Testing

@testable import ResponsePolicy

/// The refresh flight driven as a value (``RefreshFlight`` in ``EngineState``): thousands of
/// seeded random sequences of refresh triggers, the token endpoint's answers of every kind (a pair,
/// a pair whose token cannot be sent, a token type the authorizer does not send, a definitive
/// answer, transient trouble with and without `Retry-After`, no answer at all, sometimes after the
/// server ran the call), the flight's timers, the coordinator's turns (shared sessions), logouts,
/// sign-ins, news from the fleet and accepted responses. No threads, no clock,
/// no engine: the test performs the work the transitions name, as the shell would.
///
/// The oracle is a token server that rotates refresh tokens and records every one presented after
/// it was spent. Checked after every step:
/// - no refresh token is presented twice, except the one a call that got no answer presented
///   (the server may have run it: the documented reuse);
/// - at most one token call is out for the session's credentials;
/// - the session ends only at a definitive answer of the server (or a logout the test makes);
/// - every pair the server returned to the engine is the engine's refresh token afterwards (kept,
///   whatever was odd in it, however late it came);
/// - no token call before a `Retry-After` ends;
/// - one token call per refresh, plus one per transient answer it was given.
struct RefreshFlightModelTests {
    /// A token server that rotates: each refresh token it accepts is spent, a new one issued.
    struct TokenServer {
        /// The refresh token it accepts now.
        var current = "r0"
        var spent: Set<String> = []
        var issued = 0
        /// Refresh tokens presented after they were spent.
        var reuses: [String] = []
        /// Tokens spent by a call whose answer the engine never saw: presenting them again is the
        /// documented reuse.
        var ranUnanswered: Set<String> = []

        /// Runs a refresh_token grant: a new pair, or `nil` (`invalid_grant`).
        mutating func refresh(_ token: String?) -> Credentials? {
            guard let token else { return nil }
            if spent.contains(token) {
                reuses.append(token)
                return nil
            }
            guard token == current else { return nil }
            spent.insert(token)
            issued += 1
            current = "r\(issued)"
            return Credentials(accessToken: "a\(issued)", refreshToken: current)
        }
    }

    struct Counts: CustomStringConvertible {
        var steps = 0, calls = 0, pairs = 0, late = 0, kept = 0, definitive = 0, transient = 0, retryAfter = 0
        var unanswered = 0, refusals = 0, logouts = 0, serverLogouts = 0, turns = 0, adoptions = 0, signIns = 0

        mutating func add(_ other: Counts) {
            steps += other.steps
            calls += other.calls
            pairs += other.pairs
            late += other.late
            kept += other.kept
            definitive += other.definitive
            transient += other.transient
            retryAfter += other.retryAfter
            unanswered += other.unanswered
            refusals += other.refusals
            logouts += other.logouts
            serverLogouts += other.serverLogouts
            turns += other.turns
            adoptions += other.adoptions
            signIns += other.signIns
        }

        var description: String {
            "\(steps) steps, \(calls) token calls, \(pairs) pairs (\(late) after the timeout, \(kept) kept unusable), "
                + "\(definitive) definitive, \(transient) transient (\(retryAfter) with Retry-After), "
                + "\(unanswered) unanswered, \(refusals) refused without a call, \(turns) turns, \(adoptions) adoptions, "
                + "\(signIns) sign-ins, \(logouts) logouts (\(serverLogouts) at a definitive answer)"
        }
    }

    static let epoch = Date(timeIntervalSince1970: 1_700_000_000)

    /// One sequence: a state, a token server, what is out, and what the checks remember.
    struct Model {
        var state: EngineState
        var random: SeededGenerator
        var server = TokenServer()
        var now = Duration.zero
        var counts = Counts()
        var failures: [String] = []
        let shared: Bool
        var settings = RefreshSettings()
        let scope: RuleGraph.Scope
        let refreshRule: Int

        /// What the flight has out, and what the server does with it.
        var call: RefreshFlight.Call?
        var callAt = Duration.zero
        var turn: UInt64?
        var timer: RefreshFlight.Timer?
        /// Calls per flight, and the transient answers each was given.
        var calls: [UInt64: (calls: Int, transient: Int)] = [:]
        /// The newest refresh token the server handed the engine (what it must hold now).
        var received: String? = "r0"
        /// No call before this (a `Retry-After`).
        var embargo = Duration.zero
        var nextRequest: UInt64 = 0
        /// A logout the test itself makes (not the server's): allowed to end the session.
        var ownLogout = false

        init(seed: UInt64, shared: Bool) throws {
            let runtime = PolicyRuntime(
                policy: try Policy.loadDefault(), registry: PluginRegistry(),
                transport: RecordingTransport { _, _ in response("") }, environment: [:],
                overrides: PolicyEngine.Overrides(refresh: nil, logout: nil, observers: []))
            state = EngineState(runtime: runtime)
            state.credentials = Credentials(accessToken: "a0", refreshToken: "r0")
            random = SeededGenerator(seed: seed)
            self.shared = shared
            scope = try #require(runtime.policy.graph.scopes.last)
            refreshRule = try #require(scope.compiled.first { $0.action == .refresh }?.index)
            settings.timeout = .seconds(random.int(1...10))
            settings.limit = RefreshSettings.Limit(count: 3, per: .seconds(10))
            settings.shareWindow = .zero
        }

        mutating func fail(_ text: String) {
            if failures.count < 5 { failures.append("t=\(now.policyText) step \(counts.steps): \(text)") }
        }

        var date: Date { RefreshFlightModelTests.epoch.addingTimeInterval(now.seconds) }

        mutating func run(steps: Int) {
            for _ in 0..<steps {
                counts.steps += 1
                let before = (state.loggedOutUntil, state.signInEpoch)
                ownLogout = false
                step()
                check(before)
            }
        }

        mutating func step() {
            switch random.int(0...99) {
            case 0..<30: trigger()
            case 30..<55: if call != nil { answer() } else { trigger() }
            case 55..<62: if let turn { answerTurn(turn) }
            case 67..<80: fireTimer()
            case 80..<83: logout()
            case 83..<85: signIn()
            case 85..<88: adopt()
            case 88..<92:
                var ignored: Actions = []
                state.accepted(state.generation, into: &ignored)
            case 92 where shared && random.int(0...3) == 0:
                // Another process's token call was asked to wait (the fleet's announcement, issue 29).
                let end = now + .seconds(random.int(1...12))
                state.refresh.heardRetryAfter(until: end, reason: "HTTP 429 elsewhere", now: now)
                embargo = max(embargo, end)
            default: now += .milliseconds(random.int(0...3_000))
            }
            // Woken waiters leave (their own decisions are tested elsewhere).
            for (id, slot) in state.slots where slot.phase.isWoken { state.slots[id] = nil }
        }

        /// A request meets a refresh trigger, signed with the current token or an older one.
        mutating func trigger() {
            nextRequest += 1
            let id = nextRequest
            state.register(id, host: nil, dispatchLimit: .max, holdsNewRequests: false)
            let failed = state.generation - UInt64(random.int(0...min(1, Int(state.generation))))
            let decision = state.trigger(
                failedGeneration: failed, settings: settings, proactive: random.chance(10), now: now, request: id,
                coordination: shared ? .shared(waits: true, unavailable: false) : .local)
            switch decision {
            case .loggedOut, .retryNow:
                state.slots[id] = nil
            case .refused:
                counts.refusals += 1
                state.slots[id] = nil
            case .join(_, let rearm):
                perform(state.join(id, route: EngineState.RefreshRoute(scope: scope, rule: refreshRule)))
                if let rearm { perform([.refresh(.arm(rearm))]) }
            case .start(let flight, let step):
                calls[flight.id] = (0, 0)
                perform(state.join(id, route: EngineState.RefreshRoute(scope: scope, rule: refreshRule)))
                perform(state.flightStep(step, now: now, date: date))
            }
        }

        /// The call out is answered: the server runs it (a pair, or invalid_grant for a dead
        /// token), or answers without running it (503, sometimes with Retry-After), or the engine
        /// gets no answer (the server may have run it).
        mutating func answer() {
            guard let out = call else { return }
            call = nil
            let presented = out.credentials?.refreshToken
            let answer: RefreshFlight.Answer
            switch random.int(0...99) {
            case 0..<55:
                if let pair = server.refresh(presented) {
                    if now - callAt > settings.timeout { counts.late += 1 }
                    switch random.int(0...9) {
                    case 0:
                        // A token that cannot be sent: the pair's refresh token is still kept.
                        counts.kept += 1
                        let odd = Credentials(accessToken: "a\n\(server.issued)", refreshToken: pair.refreshToken)
                        answer = .pair(odd, lifetime: nil)
                    case 1:
                        // A token type the authorizer does not send.
                        counts.kept += 1
                        answer = .failed(
                            RefreshFailure("a mac token", kind: .transient, keeping: pair), logsOut: false)
                    default:
                        counts.pairs += 1
                        answer = .pair(pair, lifetime: random.chance(50) ? Double(random.int(0...60)) : nil)
                    }
                    noteReceived(pair, flight: out.flight)
                } else {
                    counts.definitive += 1
                    answer = .failed(
                        RefreshFailure("invalid_grant", response: HTTPResponse(status: 400), kind: .definitive),
                        logsOut: false)
                }
            case 55..<80:
                counts.transient += 1
                calls[out.flight]?.transient += 1
                var wait: Duration?
                if random.chance(30) {
                    counts.retryAfter += 1
                    wait = .seconds(random.int(0...30))
                    embargo = max(embargo, now + (wait ?? .zero))
                }
                answer = .failed(
                    RefreshFailure("temporarily_unavailable", response: HTTPResponse(status: 503), retryAfter: wait),
                    logsOut: false)
            default:
                counts.unanswered += 1
                calls[out.flight]?.transient += 1
                if random.chance(50), let presented, server.refresh(presented) != nil {
                    // Run by the server, the answer lost on the way: the pair is gone for good.
                    server.ranUnanswered.insert(presented)
                }
                answer = .failed(RefreshFailure("no answer", kind: .transient), logsOut: false)
            }
            let step = state.refresh.answered(
                out.flight, call: out.number, answer, state.sessionFacts(at: now), now: now, date: date)
            if case .end(let ending) = step, case .failure(let failure) = ending.outcome, failure.isDefinitive,
                !ending.trouble
            {
                definitiveEnding = true
            }
            perform(state.flightStep(step, now: now, date: date))
        }

        /// Whether the step just taken ended a flight with a definitive answer of the server.
        var definitiveEnding = false

        /// A pair the server returned: the engine must hold its refresh token from now on, unless
        /// it was for a session a sign-in replaced (the server's old family).
        mutating func noteReceived(_ pair: Credentials, flight: UInt64) {
            let signIn = ([state.refresh.current].compactMap { $0 } + state.refresh.detached).first { $0.id == flight }?
                .signInEpoch
            if signIn == state.signInEpoch { received = pair.refreshToken }
        }

        mutating func answerTurn(_ id: UInt64) {
            turn = nil
            counts.turns += 1
            let answer: RefreshTurn
            switch random.int(0...9) {
            case 0...5: answer = .lease(RefreshLease(fencingToken: UInt64(counts.turns), generation: 0))
            case 6: answer = .unavailable("the store is down")
            case 7: answer = .failedElsewhere("invalid_grant")
            case 8:
                if random.int(0...3) > 0 {
                    answer = .limited
                } else {
                    // Another process was asked to wait (issue 29): no call from here before it ends.
                    let seconds = random.int(1...12)
                    answer = .retryAfter(until: date.addingTimeInterval(Double(seconds)), reason: "HTTP 429 elsewhere")
                    embargo = max(embargo, now + .seconds(seconds))
                }
            default:
                // Another process refreshed meanwhile: the server rotated for it.
                guard let pair = server.refresh(server.current) else { return }
                received = pair.refreshToken
                answer = .published(SharedSession(credentials: pair, generation: state.sharedGeneration + 1))
            }
            perform(state.flightStep(state.refresh.turn(id, answer, now: now, date: date), now: now, date: date))
        }

        mutating func fireTimer() {
            guard let timer else { return }
            now = max(now, timer.at)
            self.timer = nil
            let step = state.refresh.timerFired(timer.flight, token: timer.token, state.sessionFacts(at: now), now: now)
            perform(state.flightStep(step, now: now, date: date))
        }

        mutating func logout() {
            ownLogout = true
            var actions: Actions = []
            state.endSession(
                cooldown: .seconds(random.int(1...20)), cancelInFlight: true, reason: .host("test"), trigger: nil,
                context: nil, plugin: nil, publishes: false, now: now, date: date, into: &actions)
            counts.logouts += 1
            perform(actions)
        }

        /// The host signs in anew: a new family at the server.
        mutating func signIn() {
            counts.signIns += 1
            server.issued += 1
            server.current = "s\(server.issued)"
            state.signIn(Credentials(accessToken: "sa\(server.issued)", refreshToken: server.current))
            received = server.current
        }

        /// Another process of the fleet refreshed and published (only while nothing is out here:
        /// the lease keeps two processes from calling at once).
        mutating func adopt() {
            guard shared, call == nil, turn == nil else { return }
            guard let pair = server.refresh(server.current) else { return }
            counts.adoptions += 1
            received = pair.refreshToken
            let session = SharedSession(credentials: pair, generation: state.sharedGeneration + 1)
            if case .adopted(let answered) = state.adopt(session, now: now), let answered {
                var woken: Actions = []
                state.endWaits(answered, .adopted, into: &woken)
                if !answered.isOut { woken.append(.refresh(.disarm(answered.id))) }
                perform(woken)
            }
        }

        /// Performs the work the transitions name, as the shell does.
        mutating func perform(_ actions: Actions) {
            for action in actions {
                guard case .refresh(let work) = action else { continue }
                switch work {
                case .call(let out):
                    // (The fleet's news comes here only while nothing is out: the lease keeps two
                    // processes from calling at once.)
                    if call != nil { fail("a second token call while one is out") }
                    if now < embargo { fail("a token call \((embargo - now).policyText) before Retry-After ends") }
                    counts.calls += 1
                    calls[out.flight, default: (0, 0)].calls += 1
                    if let (made, transient) = calls[out.flight], made > 1 + transient {
                        fail("flight \(out.flight): \(made) calls for \(transient) transient answers")
                    }
                    call = out
                    callAt = now
                case .ask(let id, _, _): turn = id
                case .arm(let armed): timer = armed
                case .disarm(let id): if timer?.flight == id { timer = nil }
                case .publishPending, .endTurn, .noteAccepted, .problem: break
                }
            }
        }

        mutating func check(_ before: (Duration?, UInt64)) {
            defer { definitiveEnding = false }
            if let reused = server.reuses.last, !server.ranUnanswered.contains(reused) {
                fail("refresh token \(reused) was presented after it was spent")
                server.reuses.removeLast()
            }
            if state.loggedOutUntil != before.0, state.loggedOutUntil != nil, !ownLogout {
                if definitiveEnding { counts.serverLogouts += 1 } else { fail("the session ended without the server") }
            }
            if let received, state.signInEpoch == before.1, state.credentials?.refreshToken != received,
                !server.ranUnanswered.contains(received)
            {
                fail(
                    "the engine holds \(state.credentials?.refreshToken ?? "none"), the server last gave it \(received)"
                )
            }
        }
    }

    static func run(seeds: Range<UInt64>, steps: Int, shared: Bool) throws -> (Counts, [String]) {
        var total = Counts()
        var failures: [String] = []
        for seed in seeds {
            var model = try Model(seed: seed &* 0x9E37_79B9_7F4A_7C15 &+ 3, shared: shared)
            model.run(steps: steps)
            total.add(model.counts)
            if !model.failures.isEmpty {
                failures.append("seed \(seed) (shared: \(shared)):\n" + model.failures.joined(separator: "\n"))
                if failures.count >= 3 { break }
            }
        }
        return (total, failures)
    }

    @Test(arguments: [false, true])
    func randomAnswersNeverBurnARefreshTokenOrEndTheSessionWithoutTheServer(shared: Bool) throws {
        let (total, failures) = try Self.run(seeds: 0..<2_000, steps: 300, shared: shared)
        #expect(failures.isEmpty, "\(failures.joined(separator: "\n\n"))")
        // The paths are reached: late pairs, kept pairs, Retry-After, unanswered calls, refusals,
        // logouts at a definitive answer (and with a coordinator: turns and adoptions).
        #expect(total.calls > 10_000 && total.pairs > 2_000 && total.late > 50 && total.kept > 500, "\(total)")
        #expect(total.retryAfter > 500 && total.unanswered > 1_000 && total.refusals > 1_000, "\(total)")
        // (With a coordinator most dead tokens are the fleet's news, adopted before any waiter
        // meets them: fewer logouts at a definitive answer.)
        #expect(total.serverLogouts > (shared ? 4 : 100), "\(total)")
        if shared { #expect(total.turns > 10_000 && total.adoptions > 5_000, "\(total)") }
        print("refresh flight, \(shared ? "shared" : "local"): \(total)")
    }
}
