/// The longest a request can take under a scope's settings: every attempt timing out, every
/// wait at its longest, every refresh at its timeout.
///
/// Used by `policy explain` and by the deadline lint. It is a bound, not a prediction: the
/// engine's `deadline` cuts a request short whatever this says.
public struct WorstCase: Sendable, Hashable {
    /// Attempts put on the wire: the first, every retry, every re-send after a refresh trigger.
    public var attempts: Int
    public var retries: Int
    public var refreshResends: Int
    /// The longest each retry's wait can be, in order.
    public var waits: [Duration?]
    /// The sum of the waits; `nil` when a wait is unbounded (`max-delay: none` with Retry-After).
    public var totalWait: Duration?
    /// Attempts × attempt-timeout + waits + refresh timeouts; `nil` when unbounded.
    public var total: Duration?

    public init(scope: RuleGraph.Scope) {
        let reachable = scope.reachableActions
        let retryRules = scope.rules.filter { $0.action == .retry }
        // The retry settings giving the most retries (ties: the longest waits) bound the request.
        let retry =
            retryRules.map { scope.retry(for: $0) }.max { a, b in
                (a.maxRetries, a.delay(forRetry: a.maxRetries)) < (b.maxRetries, b.delay(forRetry: b.maxRetries))
            } ?? scope.retry
        retries = reachable.contains(.retry) ? retry.maxRetries : 0
        let refresh =
            scope.rules.filter { $0.action == .refresh }.map { scope.refresh(for: $0) }.max {
                $0.maxPerRequest < $1.maxPerRequest
            } ?? scope.refresh
        refreshResends = reachable.contains(.refresh) ? refresh.maxPerRequest : 0
        attempts = 1 + retries + refreshResends
        waits = (0..<retries).map { index -> Duration? in
            let jittered = retry.worstCaseJittered(retry.delay(forRetry: index + 1))
            guard retry.honorRetryAfter else { return jittered }
            guard let cap = retry.maxDelay else { return nil }
            return max(jittered, cap)
        }
        totalWait = waits.reduce(Duration.zero as Duration?) { sum, wait in
            guard let sum, let wait else { return nil }
            return sum + wait
        }
        if let totalWait, let attemptTimeout = retry.attemptTimeout {
            total = attemptTimeout * attempts + totalWait + refresh.timeout * refreshResends
        } else {
            total = nil
        }
    }
}

extension RuleGraph.Scope {
    /// The actions a request in this scope can reach: rules' actions and their escalations.
    public var reachableActions: Set<ActionKind> {
        var reached: Set<ActionKind> = [.deliver]
        var pending = rules.map(\.action)
        while let action = pending.popLast() {
            guard reached.insert(action).inserted else { continue }
            switch action {
            case .retry: pending.append(retry.onExhausted)
            case .refresh: pending += [refresh.onExhausted, refresh.onFailure]
            default: break
            }
        }
        return reached
    }
}
