import Foundation
import Testing

@testable import ResponsePolicy

/// The request-side transitions of ``EngineState`` (slots, the dispatcher, a refresh's waiters,
/// timers, a caller's cancellation, a logout's sweep, a failed refresh's logout) driven as a
/// value: random event sequences, no threads, no continuations, checked after every step. Every
/// change to a slot is one of the transitions the shell calls (`gate`, `attemptBegan`,
/// `attemptEnded`, `startBackoff`, `deadlineArmed`, `woke`, `finished`, …): no copy of shell code.
struct RequestSlotsModelTests {
    private static func runtime() throws -> PolicyRuntime {
        PolicyRuntime(
            policy: try Policy.loadDefault(), registry: PluginRegistry(),
            transport: RecordingTransport { _, _ in response("") }, environment: [:],
            overrides: PolicyEngine.Overrides(refresh: nil, logout: nil, observers: []))
    }

    @Test(arguments: 0..<40)
    func randomSequencesKeepTheRequestInvariants(seed: Int) throws {
        var random = SplitMix64(seed: UInt64(seed) &* 0x5851_F42D &+ 7)
        var state = EngineState(runtime: try Self.runtime())
        // The default policy's top-level scope and its first refresh rule, for a waiter's route.
        let scope = try #require(state.runtime.policy.graph.scopes.last)
        let refreshRule = try #require(scope.compiled.first { $0.action == .refresh }?.index)
        let limit = random.int(1...4)
        var settings = RefreshSettings()
        settings.limit = nil
        settings.shareWindow = .zero
        var now = Duration.zero
        var next: UInt64 = 0
        var token: UInt64 = 0
        var ended: Set<UInt64> = []

        func live() -> [UInt64] { state.slots.keys.sorted().filter { !ended.contains($0) } }
        func pick() -> UInt64? {
            let ids = live()
            return ids.isEmpty ? nil : ids[random.int(0...ids.count - 1)]
        }

        for step in 0..<500 {
            let context = "seed \(seed) step \(step)"
            switch random.int(0...11) {
            case 0, 1:
                // A request reaches the top of its loop: held during a refresh, queued, or out.
                next += 1
                let hold = random.int(0...3) != 0
                state.register(next, host: "h", dispatchLimit: limit, holdsNewRequests: hold)
                let refreshing = state.flight != nil
                let (gate, _, _) = state.gate(
                    insideLock: next, cancelled: false, mayHold: true, beforeSending: nil, now: now, date: Date())
                #expect(gate != .held || (hold && refreshing), "\(context): held with no refresh to wait for")
                #expect(gate != .go || !state.isLoggedOut(at: now), "\(context): sent during the cooldown")
                if gate == .loggedOut {
                    _ = state.end(insideLock: next, .loggedOut)
                } else if gate == .go {
                    token += 1
                    let began = state.attemptBegan(insideLock: next, cancellation: AttemptCancellation(), token: token)
                    #expect(began, "\(context)")
                } else if random.int(0...1) == 0 {
                    // Held or queued with a deadline: its timer is armed while it waits.
                    token += 1
                    let armed = state.deadlineArmed(insideLock: next, token: token)
                    #expect(armed, "\(context)")
                }
            case 2, 3:
                // An attempt ends; it triggers a refresh, backs off, or the request finishes.
                guard let id = pick(), state.slots[id]?.phase == .onWire else { continue }
                _ = state.attemptEnded(insideLock: id, responseArrived: random.int(0...1) == 0, callerCancelled: false)
                var woken: [UnsafeContinuation<Void, Never>] = []
                switch random.int(0...2) {
                case 0:
                    switch state.decideRefresh(
                        failedGeneration: state.generation, settings: settings, proactive: false, now: now)
                    {
                    case .join, .start:
                        // Its rule's failure edges (the default policy's refresh rule logs out).
                        state.join(insideLock: id, route: EngineState.RefreshRoute(scope: scope, rule: refreshRule))
                    default: break
                    }
                case 1:
                    token += 1
                    let start = state.startBackoff(
                        insideLock: id, budget: nil, until: now + .seconds(1), deadline: nil, token: token, now: now)
                    #expect(start == .started || state.slots[id]?.endReason != nil, "\(context)")
                default:
                    ended.insert(id)
                }
                // It parks (its dispatch slot goes to the next request), or ends.
                if ended.contains(id) {
                    state.finished(insideLock: id, into: &woken)
                } else {
                    state.releaseDispatchSlot(insideLock: id, into: &woken)
                }
            case 4:
                // The refresh ends: every waiter is woken. A failure that logs out does so in the
                // same step, before any waiter is woken: then no request can go out.
                guard let flight = state.flight else { continue }
                let fails = random.int(0...2) == 0
                let outcome: Result<Credentials, RefreshFailure> =
                    fails ? .failure(RefreshFailure("invalid_grant")) : .success(Credentials(accessToken: "t\(step)"))
                let end = state.refreshEnded(flight, outcome: outcome, shared: nil, now: now)
                let waiting = try #require(end.waiting, "\(context): the flight in flight was not the one ended")
                if case .failed(let failure) = end.result,
                    let (trigger, _) = state.logOutForFailedRefresh(
                        insideLock: waiting, failure, answerLogsOut: false, now: now, date: Date())
                {
                    #expect(state.slots[trigger]?.decidedLogout != nil, "\(context): the trigger lost its logout")
                    for id in state.slots.keys where id != trigger {
                        let (gate, _, _) = state.gate(
                            insideLock: id, cancelled: false, mayHold: true, beforeSending: nil, now: now, date: Date())
                        #expect(gate != .go, "\(context): request \(id) may go out after the logout was decided")
                    }
                }
                _ = state.endWaits(insideLock: waiting, end.result)
                #expect(state.flight == nil, "\(context)")
                for id in state.slots.keys where state.slots[id]?.awaitedFlight == flight.id {
                    Issue.record("\(context): request \(id) still waits for an ended refresh")
                }
            case 5:
                // A timer fires: the armed one, or a stale one.
                guard let id = pick(), let armed = state.slots[id]?.armedTimer else { continue }
                let fired = random.int(0...1) == 0 ? armed : armed &+ 1
                _ = state.timerFired(insideLock: id, token: fired)
                if fired != armed || armed == 0 {
                    #expect(state.slots[id]?.armedTimer == armed, "\(context): a stale timer changed a request")
                }
            case 6:
                // The caller cancels.
                guard let id = pick() else { continue }
                _ = state.end(insideLock: id, .cancelled)
                #expect(state.slots[id]?.endReason != nil && state.slots[id]?.armedTimer == 0, "\(context)")
            case 7:
                // A logout.
                let cancelInFlight = random.int(0...1) == 0
                guard
                    state.startCooldown(
                        until: now + .seconds(5), untilDate: Date(), reason: .host("x"), extendOnly: false, now: now)
                else { continue }
                _ = state.endRequests(insideLock: nil, cancelInFlight: cancelInFlight)
                // Every request ends, but one on the wire when `cancel-in-flight` is off, and one
                // already woken (it meets the cooldown at the top of its loop).
                for (id, slot) in state.slots where slot.endReason == nil && slot.wake == nil {
                    #expect(
                        !cancelInFlight && (slot.phase == .onWire || slot.phase == .running),
                        "\(context): request \(id) (\(slot.phase)) outlived the logout")
                }
            case 8, 9:
                // A woken or ended request runs its loop on (afterPark) and finishes if ended.
                guard let id = pick(), let slot = state.slots[id], slot.wake != nil || slot.endReason != nil,
                    slot.phase != .onWire
                else { continue }
                _ = state.woke(insideLock: id)
                #expect(state.slots[id]?.armedTimer == 0 && state.slots[id]?.awaitedFlight == nil, "\(context)")
                var woken: [UnsafeContinuation<Void, Never>] = []
                state.finished(insideLock: id, into: &woken)
                ended.insert(id)
            default:
                now += .milliseconds(random.int(0...2_000))
                if random.int(0...3) == 0 { state.signIn(Credentials(accessToken: "s\(step)")) }
            }

            // The dispatcher's count is the slots that hold one, never above the limit.
            let holding = state.slots.values.filter(\.holdsSlot).count
            #expect(holding == state.dispatcher.inFlight, "\(context): slots held \(holding) != counted")
            #expect(state.dispatcher.inFlight <= limit, "\(context): more than the limit on the wire")
            let onWire = state.slots.values.filter { $0.phase == .onWire }.count
            #expect(onWire <= limit, "\(context): \(onWire) on the wire, limit \(limit)")
            // Every queued request is in a queue; every waiter waits for the refresh in flight.
            let queuedIDs = Set(
                state.dispatcher.hosts.values.flatMap { Array($0.fresh.waiting) + Array($0.resent.waiting) })
            for (id, slot) in state.slots {
                if slot.phase == .queued, slot.endReason == nil, slot.wake == nil {
                    #expect(queuedIDs.contains(id), "\(context): request \(id) queued in no queue")
                }
                if let awaited = slot.awaitedFlight {
                    #expect(awaited == state.flight?.id, "\(context): request \(id) waits for a refresh not in flight")
                }
                // A timer is armed only where one is needed: on the wire (its timeout), in a
                // backoff, or while it waits for a refresh or a dispatch slot (its deadline).
                if slot.armedTimer != 0 {
                    // (Promoted from a queue, it is running with its wake set and its deadline
                    // still armed until it runs: a firing then finds it running and does nothing.)
                    #expect(slot.phase != .running || slot.wake != nil, "\(context): a timer armed while running")
                }
            }
            #expect(state.queuedCount <= state.slots.count, "\(context)")
        }
    }
}
