/// What tests and tools may read of an engine's state: a copy taken under its lock, so no test
/// reaches into the engine's internals (which can then change without breaking them).
package struct EngineSnapshot: Sendable {
    package var credentials: Credentials?
    /// Bumped by every refresh, sign-in and adopted publication.
    package var generation: UInt64
    /// The coordinator's generation of the credentials held.
    package var sharedGeneration: UInt64
    /// A refresh is in flight.
    package var refreshing: Bool
    /// Requests waiting for the refresh in flight.
    package var refreshWaiters: Int
    /// Refreshes counted by `refresh.limit` in its window (whose tokens were refused at once).
    package var refreshCalls: Int
    /// Background work (logout calls, publications) started and not yet forgotten.
    package var backgroundWork: Int
    /// Requests registered, waiting for a refresh, holding a dispatch slot or queued for one:
    /// zero once every `send` has returned.
    package var leftovers: Int
    package var dispatchInFlight: Int
    package var dispatchQueued: Int
    /// Timers armed on the engine's timer service.
    package var timers: Int
    package var logoutReason: LogoutReason?
}

extension PolicyEngine {
    /// A copy of the engine's state for tests.
    package var debugSnapshot: EngineSnapshot {
        let timers = timers.count
        return state.withLock { state in
            EngineSnapshot(
                credentials: state.credentials, generation: state.generation,
                sharedGeneration: state.sharedGeneration, refreshing: state.flight != nil,
                refreshWaiters: state.flight.map { state.live($0).count } ?? 0,
                refreshCalls: state.refresh.unhelped.count,
                backgroundWork: state.background.count + state.finishedBackground.count, leftovers: state.leftovers,
                dispatchInFlight: state.dispatcher.inFlight, dispatchQueued: state.queuedCount, timers: timers,
                logoutReason: state.logoutReason)
        }
    }
}
