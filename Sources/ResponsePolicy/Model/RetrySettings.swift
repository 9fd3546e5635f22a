/// The `retry:` section: how often, after how long, and which requests may be sent again.
package struct RetrySettings: Sendable, Hashable {
    package enum Backoff: String, Sendable, Hashable, CaseIterable {
        /// Every wait is `initial`.
        case constant
        /// Wait n is `initial × n`.
        case linear
        /// Wait n is `initial × multiplier^(n−1)` ("progressive").
        case exponential
    }

    package enum Jitter: Sendable, Hashable, CustomStringConvertible {
        case none
        /// A uniform draw from [0, d].
        case full
        /// A uniform draw from [d/2, d].
        case equal
        /// A uniform draw from [d(1−p), d(1+p)], `p` a fraction (`"20%"` is 0.2).
        case proportional(Double)

        package var description: String {
            switch self {
            case .none: return "none"
            case .full: return "full"
            case .equal: return "equal"
            case .proportional(let p): return "\(formatNumber(p * 100))%"
            }
        }
    }

    package struct Budget: Sendable, Hashable {
        package var ratio: Double
        package var min: Int
        package init(ratio: Double, min: Int) {
            self.ratio = ratio
            self.min = min
        }
    }

    /// `3` by default.
    package var maxRetries: Int = 3
    package var backoff: Backoff = .exponential
    /// `1s` by default.
    package var initial: Duration = .seconds(1)
    /// `2` by default.
    package var multiplier: Double = 2
    /// `30s` by default; `nil` (`max-delay: none`) leaves the delay uncapped.
    package var maxDelay: Duration? = .seconds(30)
    package var jitter: Jitter = .none
    /// `honor` by default: a `Retry-After` header (seconds or HTTP-date) sets the wait, up to `max-delay`.
    package var honorRetryAfter: Bool = true
    /// `10s` by default; a slower attempt counts as `error: timeout`.
    package var attemptTimeout: Duration? = .seconds(10)
    /// The methods that may be retried. GET, HEAD, PUT, DELETE and OPTIONS are idempotent by
    /// RFC 9110 §9.2.2, so sending them twice is safe; POST and PATCH are not, so they are left
    /// out unless listed or the request carries an idempotency key.
    package var methods: [String] = ["GET", "HEAD", "PUT", "DELETE", "OPTIONS"]
    /// `Idempotency-Key` by default; `nil` (`idempotency-key: none`) turns the feature off.
    package var idempotencyKey: String? = "Idempotency-Key"
    /// `deliver` by default. Also accepts any action so lint can report a looping value.
    package var onExhausted: ActionKind = .deliver
    /// `120s` by default; `nil` (`deadline: none`) for no deadline. Long enough for the worst
    /// case of the other defaults (5 attempts of 10s, each possibly held 10s for a refresh, a
    /// 10s refresh, waits of 1s + 2s + 4s: 117s), so a policy at defaults passes `lint --strict`
    /// and the deadline only cuts what the settings did not plan for.
    package var deadline: Duration? = .seconds(120)
    /// `{ratio: 0.2, min: 100}` by default: in a sliding 10 s window retries may add 20 % of the
    /// requests plus 100 (10 per second), Finagle's default. Enough that a burst of requests
    /// meeting one transient error each is retried, not delivered as the error.
    package var budget: Budget? = Budget(ratio: 0.2, min: 100)

    package init() {}

    /// The wait before retry `n` (1-based) before jitter and `Retry-After`.
    package func delay(forRetry n: Int) -> Duration {
        let base: Double
        let initialSeconds = initial.seconds
        switch backoff {
        case .constant: base = initialSeconds
        case .linear: base = initialSeconds * Double(n)
        case .exponential: base = initialSeconds * pow(multiplier, Double(n - 1))
        }
        var seconds = base.isFinite ? base : Double.greatestFiniteMagnitude
        if let maxDelay { seconds = Swift.min(seconds, maxDelay.seconds) }
        return .seconds(clampSeconds(seconds))
    }

    /// The longest wait jitter can turn `delay` into, before the cap.
    package func worstCaseJittered(_ delay: Duration) -> Duration {
        if case .proportional(let p) = jitter { return delay * (1 + p) }
        return delay
    }

    /// The longest the backoff wait before retry `n` (1-based) can be: the delay with its
    /// longest jitter, capped at `max-delay` (the cap applies after jitter, so `max-delay: 8s`
    /// with `jitter: "20%"` never waits more than 8s).
    package func longestWait(forRetry n: Int) -> Duration {
        let jittered = worstCaseJittered(delay(forRetry: n))
        guard let maxDelay else { return jittered }
        return Swift.min(jittered, maxDelay)
    }
}

/// Seconds clamped to what a `Duration` can hold comfortably (100 years).
func clampSeconds(_ seconds: Double) -> Double {
    Swift.max(0, Swift.min(seconds, 3_153_600_000))
}

private func pow(_ base: Double, _ exponent: Double) -> Double {
    var result = 1.0
    var count = Int(exponent)
    while count > 0 {
        result *= base
        if !result.isFinite { return result }
        count -= 1
    }
    return result
}
