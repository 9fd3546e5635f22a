import Foundation

/// The time source the engine reads and sleeps on.
///
/// Injected so that tests and `policy simulate` run on a `VirtualClock` and never really sleep.
/// `now` is monotonic time since an arbitrary origin; `date` is wall-clock time, used only where
/// the outside world speaks in dates (`Retry-After: <HTTP-date>`, a token's `expires_at`).
///
/// Concurrency contract: called from any task. `sleep(until:)` must throw `CancellationError`
/// promptly when the sleeping task is cancelled.
public protocol PolicyClock: Sendable {
    /// Monotonic time since the clock's origin.
    var now: Duration { get }
    /// Wall-clock time.
    var date: Date { get }
    /// Returns when `now` reaches `deadline`; throws `CancellationError` when the task is cancelled.
    func sleep(until deadline: Duration) async throws
}

/// The real clock: `ContinuousClock` for time, the system for dates.
public struct SystemPolicyClock: PolicyClock {
    private let origin: ContinuousClock.Instant

    /// A clock whose `now` starts at zero.
    public init() { origin = ContinuousClock.now }

    /// Time since the clock was made.
    public var now: Duration { ContinuousClock.now - origin }

    /// The system's wall-clock time.
    public var date: Date { Date() }

    /// Sleeps until `now` reaches `deadline`; throws `CancellationError` when the task is cancelled.
    public func sleep(until deadline: Duration) async throws {
        try await ContinuousClock().sleep(until: origin + deadline, tolerance: nil)
    }
}
