/// The longest a request can take under a scope's compiled rules: every attempt timing out, every
/// wait at its longest, every refresh at its timeout. A bound, computed once by the compiler and
/// read by `policy explain`, the deadline lint and the property test that checks the engine
/// against it.
///
/// Why per retry index: a request has one retry counter, whichever rule matched, and each wait
/// uses the settings of the rule that matched that time. So the n-th wait is the longest n-th
/// wait of any rule that can still retry at n (503 → 3 retries from 1s and 502 → 2 retries of
/// 12s give 12s, 12s, 4s, not 1s, 2s, 4s).
///
/// The terms, each attempt at most:
/// - its own time on the wire: the scope's `attempt-timeout`;
/// - one wait for a refresh before it goes out (``heldWaits``): held for a refresh in flight, a
///   refresh ahead of the token's expiry, or signing in; up to the longest `refresh.timeout` of
///   the policy (the refresh may be another scope's);
/// - a re-send after a refresh trigger first waits for that refresh (``refreshResends``), up to
///   the longest `timeout` of the scope's refreshing rules;
/// - the backoff waits at their longest jitter, capped at `max-delay` (``waits``).
///
/// A server's `Retry-After` can stretch each wait up to `max-delay`; that is reported apart
/// (``totalWithRetryAfter``), since it is the server's doing and the deadline bounds it.
/// The deadline cuts a request short whatever this says.
package struct WorstCase: Sendable, Hashable {
    /// Attempts put on the wire: the first, every retry, every re-send after a refresh the request
    /// waited for. Not counted: the generation rule's re-sends (a trigger on a token another
    /// request's refresh already replaced); how many depends on the others, and only the deadline
    /// bounds them (`explain` says so).
    package var attempts: Int
    package var retries: Int
    package var refreshResends: Int
    /// The longest each retry's backoff wait can be, in order (the maximum over the rules that
    /// can retry that many times).
    package var waits: [Duration]
    /// The sum of the backoff waits.
    package var totalWait: Duration
    /// The scope's attempt timeout (`nil`: none, and the total is unbounded).
    package var attemptTimeout: Duration?
    /// Attempts that may each wait for a refresh before going out (0 when nothing in the policy
    /// refreshes), and the longest such wait.
    package var heldWaits: Int
    package var heldWait: Duration
    /// The longest wait for the refresh a trigger started or joined.
    package var refreshWait: Duration
    /// Attempts × attempt-timeout + held waits + refresh waits + backoff waits; `nil` without an
    /// attempt timeout.
    package var total: Duration?
    /// Whether Retry-After can set the waits (`retry-after: honor` and retries reachable).
    package var honorsRetryAfter: Bool
    /// The waits when the server asks for the longest it may (each up to `max-delay`); `nil`
    /// when unbounded (`max-delay: none`).
    package var totalWaitWithRetryAfter: Duration?
    /// ``total`` with those waits; `nil` when unbounded.
    package var totalWithRetryAfter: Duration?

    /// - Parameters:
    ///   - compiled: the scope's compiled rules.
    ///   - attemptTimeout: the scope's `attempt-timeout`.
    ///   - heldFor: the longest refresh any request of the policy can be held for (the longest
    ///     `refresh.timeout` with a plugin); `nil` when nothing refreshes.
    ///   - holds: whether the scope holds requests during a refresh or refreshes before sending.
    init(compiled: [RuleGraph.CompiledRule], attemptTimeout: Duration?, heldFor: Duration?, holds: Bool) {
        let retrying = compiled.filter(\.canRetry).map(\.retry)
        retries = retrying.map(\.maxRetries).max() ?? 0
        let refreshing = compiled.filter { $0.action == .refresh && $0.refresh.maxPerRequest > 0 }.map(\.refresh)
        refreshResends = refreshing.map(\.maxPerRequest).max() ?? 0
        refreshWait = refreshing.map(\.timeout).max() ?? .zero
        attempts = 1 + retries + refreshResends
        self.attemptTimeout = attemptTimeout
        if let heldFor, holds {
            heldWaits = attempts
            heldWait = heldFor
        } else {
            heldWaits = 0
            heldWait = .zero
        }
        var waits: [Duration] = []
        var stretched: [Duration?] = []
        for n in stride(from: 1, through: retries, by: 1) {
            let able = retrying.filter { $0.maxRetries >= n }
            waits.append(able.map { $0.longestWait(forRetry: n) }.max() ?? .zero)
            // With Retry-After honoured the server sets the wait, up to max-delay (none: unbounded).
            var longest: Duration? = .zero
            for r in able {
                let wait = r.longestWait(forRetry: n)
                let own: Duration? = r.honorRetryAfter ? r.maxDelay.map { max($0, wait) } : wait
                longest = own.flatMap { own in longest.map { max($0, own) } }
            }
            stretched.append(longest)
        }
        self.waits = waits
        totalWait = waits.reduce(.zero, +)
        honorsRetryAfter = retries > 0 && retrying.contains(where: \.honorRetryAfter)
        totalWaitWithRetryAfter = stretched.reduce(Duration?.some(.zero)) { sum, wait in
            sum.flatMap { sum in wait.map { sum + $0 } }
        }
        let fixed = attemptTimeout.map { timeout in
            timeout * attempts + heldWait * heldWaits + refreshWait * refreshResends
        }
        total = fixed.map { $0 + totalWait }
        totalWithRetryAfter = fixed.flatMap { fixed in totalWaitWithRetryAfter.map { fixed + $0 } }
    }

    /// The worst case of a compiled scope (the one the compiler stored).
    package init(scope: RuleGraph.Scope) { self = scope.worstCase }

    /// The terms of ``total``, each with what it is and how long it lasts, largest first: what
    /// the deadline lint names in its hint.
    package var terms: [(name: String, duration: Duration)] {
        var out: [(String, Duration)] = []
        if let attemptTimeout {
            out.append(
                (
                    "\(attempts) attempt\(attempts == 1 ? "" : "s") × attempt-timeout \(attemptTimeout.policyText)",
                    attemptTimeout * attempts
                ))
        }
        if heldWaits > 0 {
            out.append(
                (
                    "\(heldWaits) wait\(heldWaits == 1 ? "" : "s") for a refresh before sending × refresh.timeout \(heldWait.policyText)",
                    heldWait * heldWaits
                ))
        }
        if refreshResends > 0 {
            out.append(
                (
                    "\(refreshResends) refresh\(refreshResends == 1 ? "" : "es") for a trigger × refresh.timeout \(refreshWait.policyText)",
                    refreshWait * refreshResends
                ))
        }
        if retries > 0 {
            out.append(
                (
                    "\(retries) backoff wait\(retries == 1 ? "" : "s") (\(waits.map(\.policyText).joined(separator: " + ")))",
                    totalWait
                ))
        }
        return out.sorted { $0.1 > $1.1 }
    }
}
