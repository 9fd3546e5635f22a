import Foundation

@testable import ResponsePolicy

/// What the session model tests need of the refresh flight: a trigger as a request's transition
/// makes one, and a flight's call answered, each applied to the state as the shell applies it.
extension EngineState {
    /// A refresh trigger of request `id` (a local flight, no coordinator), as `awaitRefresh` asks it.
    mutating func trigger(
        failedGeneration: UInt64, settings: RefreshSettings, proactive: Bool, now: Duration, request id: UInt64 = 0,
        coordination: RefreshFlight.Coordination = .local
    ) -> RefreshFlight.TriggerDecision {
        let context = RequestContext(
            number: id, explicitID: nil, runtime: runtime, start: now, method: "GET", path: "/")
        let trigger = RefreshFlight.Trigger(
            failedGeneration: failedGeneration, settings: settings, proactive: proactive, reason: "test",
            starter: RefreshFlight.Starter(context: context, scopeIndex: runtime.policy.graph.scopes.count - 1),
            coordination: coordination)
        return refresh.trigger(trigger, sessionFacts(at: now), now: now)
    }

    /// The flight in progress's call answered with `answer`, applied in one transition; the step it
    /// took and the actions to perform.
    mutating func answerFlight(
        _ answer: RefreshFlight.Answer, of id: UInt64? = nil, now: Duration, date: Date
    ) -> (RefreshFlight.Step, Actions) {
        let flight =
            id.map { id in ([refresh.current].compactMap { $0 } + refresh.detached).first { $0.id == id } }
            ?? refresh.current
        guard let flight, case .calling(let call) = flight.phase else { return (.none, []) }
        let step = refresh.answered(flight.id, call: call, answer, sessionFacts(at: now), now: now, date: date)
        return (step, flightStep(step, now: now, date: date))
    }
}

extension RefreshFlight.Step {
    /// The ending, when the step ended the flight.
    var ending: RefreshFlight.Ending? {
        if case .end(let ending) = self { return ending }
        return nil
    }
}
