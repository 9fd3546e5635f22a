import Foundation
import TestSupport
import Testing

@testable import ResponsePolicy

/// The session's transitions (`EngineState+Session.swift`) driven as a value: random sequences
/// of refresh triggers, refresh ends, logouts, sign-ins and coordinator publications, no threads,
/// no clock, checked after every step against what must always hold.
struct SessionStateModelTests {
    private static func runtime() throws -> PolicyRuntime {
        PolicyRuntime(
            policy: try Policy.loadDefault(), registry: PluginRegistry(),
            transport: RecordingTransport { _, _ in response("") }, environment: [:],
            overrides: PolicyEngine.Overrides(refresh: nil, logout: nil, observers: []))
    }

    private static let epoch = Date(timeIntervalSince1970: 1_700_000_000)

    /// What the test remembers besides the state.
    private struct Model {
        var now: Duration = .zero
        var open: EngineState.Flight?
        /// When refreshes were found not to have helped (a trigger on the token this engine's own
        /// call issued, before any response accepted it): what `limit` counts, once per generation.
        var unhelped: [Duration] = []
        var counted: Set<UInt64> = []
        /// The generation the last successful call of this engine issued.
        var issued: UInt64 = 0
        /// A definitive answer, for the generation it was given for, when, and how long it holds
        /// (`refresh.timeout`, four times longer for each further one for the same credentials).
        var definitive: (generation: UInt64, at: Duration, hold: Duration)?
        var cooldownUntil: Duration?
        var tokens = 0
    }

    @Test(arguments: 0..<40)
    func randomSequencesKeepTheSessionInvariants(seed: Int) throws {
        var random = SeededGenerator(seed: UInt64(seed) &* 0x9E37_79B9 &+ 1)
        var state = EngineState(runtime: try Self.runtime())
        state.credentials = Credentials(accessToken: "token-0")
        var model = Model()
        var settings = RefreshSettings()
        settings.limit = RefreshSettings.Limit(count: 3, per: .seconds(10))
        // Transient trouble ends the refresh at once (no backoff to drive here).
        settings.transient = nil

        for step in 0..<400 {
            let before = (state.generation, state.sharedGeneration, state.sessionEpoch)
            let loggedOut = state.isLoggedOut(at: model.now)
            let context = "seed \(seed) step \(step)"
            switch random.int(0...9) {
            case 0, 1, 2:
                // A refresh trigger, signed with the current token or an older one.
                let failed = state.generation - UInt64(random.int(0...min(2, Int(state.generation))))
                settings.shareWindow = random.int(0...1) == 0 ? .zero : .seconds(1)
                let proactive = random.int(0...4) == 0
                let hadFlight = state.flight
                if random.int(0...3) == 0 {
                    var ignored: Actions = []
                    state.accepted(state.generation, into: &ignored)
                }
                // The oracle of refresh.limit: only a token this engine's call issued, refused before
                // any response accepted it, counts (never the initial token, a failure, an adoption).
                let unhelped =
                    !proactive && state.generation > 0 && state.generation == model.issued
                    && state.acceptedGeneration < state.generation
                let remembered =
                    model.definitive.map {
                        $0.generation == state.generation && model.now - $0.at < $0.hold
                    } ?? false
                let decision = state.trigger(
                    failedGeneration: failed, settings: settings, proactive: proactive, now: model.now)
                let reachesLimit =
                    hadFlight == nil && !loggedOut && failed == state.generation && !remembered && unhelped
                if reachesLimit, !model.counted.contains(state.generation) {
                    model.counted.insert(state.generation)
                    model.unhelped.append(model.now)
                }
                let recent = model.unhelped.filter { model.now - $0 < .seconds(10) }
                switch decision {
                case .loggedOut:
                    #expect(loggedOut, "\(context): refused outside a cooldown")
                case .retryNow:
                    #expect(!loggedOut, "\(context)")
                case .join(let id, _):
                    #expect(!loggedOut && failed == state.generation, "\(context)")
                    #expect(hadFlight?.id == id, "\(context): joined a flight that was not in flight")
                case .start(let flight, let step):
                    #expect(!loggedOut, "\(context): a refresh started during the cooldown")
                    #expect(failed == state.generation, "\(context): an older token started a refresh")
                    #expect(hadFlight == nil, "\(context): a second refresh in flight")
                    #expect(state.flight?.id == flight.id && flight.credentials == state.credentials, "\(context)")
                    #expect(!remembered, "\(context): a definitive failure was asked again at once")
                    #expect(!(unhelped && recent.count >= 3), "\(context): a refresh loop past refresh.limit")
                    if case .call(let call, _, _) = step {
                        #expect(
                            call.credentials == state.credentials, "\(context): the call presents other credentials")
                    } else {
                        Issue.record("\(context): a local refresh that does not call the plugin first")
                    }
                    model.open = flight
                case .refused(let failure, let refusal):
                    #expect(hadFlight == nil && !loggedOut, "\(context)")
                    #expect(!failure.isDefinitive, "\(context): a refusal without a call reaches on-failure")
                    switch refusal {
                    case .remembered: #expect(remembered, "\(context): remembered what was not answered")
                    case .limit:
                        #expect(unhelped, "\(context): refresh.limit counted a healthy rotation or the initial token")
                        #expect(recent.count >= 3, "\(context): limited below the limit")
                    case .retryAfter: Issue.record("\(context): no Retry-After was answered")
                    }
                }
                #expect(recent.count <= 3 || !unhelped, "\(context): more refreshes than refresh.limit in its window")
            case 3, 4:
                // The refresh in flight ends: a pair, a definitive answer, or transient trouble.
                guard let flight = model.open else { continue }
                let draw = random.int(0...3)
                model.tokens += 1
                let fresh = Credentials(accessToken: "token-\(model.tokens)")
                let sameSession = flight.sessionEpoch == state.sessionEpoch
                // Ended by a logout with no sign-in since: the server rotated the refresh token,
                // so the new tokens are kept, though the session stays logged out.
                let noSignInSince = flight.signInEpoch == state.signInEpoch
                let held = state.credentials
                let answer: RefreshFlight.Answer
                switch draw {
                case 0: answer = .failed(RefreshFailure("invalid_grant", kind: .definitive), logsOut: false)
                case 1: answer = .failed(RefreshFailure("no", kind: .transient), logsOut: false)
                default: answer = .pair(fresh, lifetime: nil)
                }
                let (step, _) = state.answerFlight(answer, of: flight.id, now: model.now, date: Self.epoch)
                guard let ending = step.ending else {
                    Issue.record("\(context): a local flight's answer did not end it (transient: none)")
                    continue
                }
                model.open = nil
                #expect(ending.flight.id == flight.id, "\(context)")
                #expect(state.flight == nil, "\(context): the flight outlived its end")
                let succeeded = draw >= 2
                if succeeded && sameSession {
                    #expect(state.credentials == fresh && state.generation == before.0 + 1, "\(context)")
                    model.issued = state.generation
                } else if succeeded && noSignInSince {
                    #expect(state.credentials == fresh && state.generation == before.0 + 1, "\(context)")
                } else {
                    #expect(state.credentials == held && state.generation == before.0, "\(context)")
                }
                if draw == 0, sameSession {
                    let again = model.definitive?.generation == state.generation
                    let hold =
                        again ? min((model.definitive?.hold ?? settings.timeout) * 4, .seconds(3600)) : settings.timeout
                    model.definitive = (state.generation, model.now, hold)
                }
            case 5:
                // A logout here (or, from elsewhere, one that may only extend the cooldown).
                let extendOnly = random.int(0...1) == 0
                let cooldown = Duration.seconds(random.int(1...20))
                let started = state.startCooldown(
                    until: model.now + cooldown, untilDate: Self.epoch.addingTimeInterval(cooldown.seconds),
                    reason: .host("test"), extendOnly: extendOnly, now: model.now)
                if loggedOut && !extendOnly { #expect(!started, "\(context): two logouts for one") }
                if started {
                    #expect(state.sessionEpoch == before.2 + 1 && state.isLoggedOut(at: model.now), "\(context)")
                    model.cooldownUntil = model.now + cooldown
                } else {
                    #expect(state.sessionEpoch == before.2, "\(context)")
                }
            case 6:
                model.tokens += 1
                state.signIn(Credentials(accessToken: "signed-\(model.tokens)"))
                #expect(!state.isLoggedOut(at: model.now) && state.generation == before.0 + 1, "\(context)")
            case 7:
                // A publication from elsewhere: newer, as old, or older; new credentials or the same.
                let generation = UInt64(max(0, Int(state.sharedGeneration) + random.int(-1...2)))
                model.tokens += 1
                let credentials =
                    random.int(0...2) == 0 ? state.credentials : Credentials(accessToken: "shared-\(model.tokens)")
                let flight = state.flight
                let adoption = state.adopt(
                    SharedSession(credentials: credentials, generation: generation), now: model.now)
                switch adoption {
                case .ignored:
                    #expect(generation <= before.1 || credentials == nil, "\(context): newer news ignored")
                    #expect(state.generation == before.0 && state.sharedGeneration == before.1, "\(context)")
                case .numbered:
                    #expect(state.generation == before.0 && state.sharedGeneration == generation, "\(context)")
                case .adopted(let answered):
                    #expect(generation > before.1 && state.credentials == credentials, "\(context)")
                    if let answered {
                        #expect(answered.id == flight?.id && state.flight == nil, "\(context)")
                        // Its own end comes later and must change nothing.
                        model.open = answered
                    }
                }
            default:
                model.now += .milliseconds(random.int(0...3_000))
            }
            #expect(state.generation >= before.0, "\(context): the generation went back")
            #expect(state.sharedGeneration >= before.1, "\(context): the shared generation went back")
            #expect(state.sessionEpoch >= before.2, "\(context): the session epoch went back")
            #expect((state.flight == nil) || (state.flight?.id == model.open?.id), "\(context): an unknown flight")
        }
    }
}
