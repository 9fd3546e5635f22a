import Foundation

/// What an engine holds right now, for ``PolicyMetrics``' gauges: counts and times only, never a
/// credential. Read under the engine's lock once per scrape, never on a request's path.
package struct EngineGauges: Sendable, Equatable {
    /// Requests that have not had their outcome yet.
    package var requestsInFlight = 0
    /// Requests waiting for the refresh in flight (held before sending, or re-sent after it).
    package var refreshWaiters = 0
    /// A refresh is in flight.
    package var refreshing = false
    /// Dispatch slots in use (`dispatch.max-in-flight-per-host`), all hosts together.
    package var dispatchInFlight = 0
    /// Requests queued for a dispatch slot.
    package var dispatchQueued = 0
    /// Seconds left in the logout cooldown (0: not in one).
    package var cooldownRemaining: Double = 0
    /// Credentials the token endpoint returned that still wait to be published to the fleet.
    package var publicationPending = false
    /// The credentials' generation (bumped by every refresh, sign-in and adoption).
    package var generation: UInt64 = 0
    /// The coordinator's generation of the credentials held (0: none shared yet).
    package var sharedGeneration: UInt64 = 0
    /// The coordination store reported trouble it has not recovered from.
    package var coordinationTrouble = false
    /// The coordinator's answers to this engine's refresh turns since it started, by
    /// `RefreshTurn.metricName` (`lease`, `adopted`, `published`, `failed_elsewhere`, `limited`,
    /// `unavailable`).
    package var coordinationTurns: [String: UInt64] = [:]

    package init() {}
}

extension PolicyEngine {
    /// The engine's gauges now (one lock).
    package var gauges: EngineGauges {
        let now = clock.now
        return state.withLock { state in
            var gauges = EngineGauges()
            gauges.requestsInFlight = state.slots.count
            gauges.refreshing = state.flight != nil
            gauges.refreshWaiters = state.flight.map { state.live($0).count } ?? 0
            gauges.dispatchInFlight = state.dispatcher.inFlight
            gauges.dispatchQueued = state.queuedCount
            if let until = state.loggedOutUntil, now < until { gauges.cooldownRemaining = (until - now).seconds }
            gauges.publicationPending = state.refresh.unpublished != nil
            gauges.generation = state.generation
            gauges.sharedGeneration = state.sharedGeneration
            gauges.coordinationTrouble = state.coordinationProblem != nil
            gauges.coordinationTurns = state.refresh.turnAnswers
            return gauges
        }
    }
}
