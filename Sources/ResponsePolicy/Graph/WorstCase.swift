/// The longest a request can take under a scope's settings: every attempt timing out, every
/// wait at its longest, every refresh at its timeout.
///
/// Used by `policy explain` and by the deadline lint. It is a bound, not a prediction: the
/// engine's `deadline` cuts a request short whatever this says.
///
/// Waits are the policy's own backoff (at its longest jitter). A server's `Retry-After` can
/// stretch each wait up to `max-delay`; that is reported apart (``totalWithRetryAfter``),
/// since it is the server's doing and the deadline is what bounds it.
package struct WorstCase: Sendable, Hashable {
    /// Attempts put on the wire: the first, every retry, every re-send after a refresh trigger.
    package var attempts: Int
    package var retries: Int
    package var refreshResends: Int
    /// The longest each retry's backoff wait can be, in order.
    package var waits: [Duration]
    /// The sum of the backoff waits.
    package var totalWait: Duration
    /// Attempts × attempt-timeout + waits + refresh timeouts; `nil` without an attempt timeout.
    package var total: Duration?
    /// Whether Retry-After can set the waits (`retry-after: honor` and retries reachable).
    package var honorsRetryAfter: Bool
    /// The waits when the server asks for the longest it may (each up to `max-delay`); `nil`
    /// when unbounded (`max-delay: none`).
    package var totalWaitWithRetryAfter: Duration?
    /// ``total`` with those waits; `nil` when unbounded.
    package var totalWithRetryAfter: Duration?

    package init(scope: RuleGraph.Scope) {
        // Read off the compiled rules: only a rule that can retry adds retries, each with its
        // effective settings (a rule's override, not the section's).
        let retrying = scope.compiled.filter(\.canRetry)
        // The retry settings giving the most retries (ties: the longest waits) bound the request.
        let retry =
            retrying.map(\.retry).max { a, b in
                (a.maxRetries, a.delay(forRetry: a.maxRetries)) < (b.maxRetries, b.delay(forRetry: b.maxRetries))
            } ?? scope.retry
        retries = retrying.isEmpty ? 0 : retry.maxRetries
        let refreshing = scope.compiled.filter { $0.action == .refresh && $0.again != nil }
        let refresh = refreshing.map(\.refresh).max { $0.maxPerRequest < $1.maxPerRequest } ?? scope.refresh
        refreshResends = refreshing.isEmpty ? 0 : refresh.maxPerRequest
        attempts = 1 + retries + refreshResends
        waits = (0..<retries).map { retry.worstCaseJittered(retry.delay(forRetry: $0 + 1)) }
        totalWait = waits.reduce(.zero, +)
        honorsRetryAfter = retries > 0 && retry.honorRetryAfter
        if honorsRetryAfter {
            totalWaitWithRetryAfter = retry.maxDelay.map { cap in waits.reduce(.zero) { $0 + max($1, cap) } }
        } else {
            totalWaitWithRetryAfter = totalWait
        }
        // The attempt timeout is the scope's (the engine arms it per attempt from the scope).
        let fixed = scope.retry.attemptTimeout.map { $0 * attempts + refresh.timeout * refreshResends }
        total = fixed.map { $0 + totalWait }
        totalWithRetryAfter = fixed.flatMap { fixed in totalWaitWithRetryAfter.map { fixed + $0 } }
    }
}
