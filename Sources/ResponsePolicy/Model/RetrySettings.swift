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

    /// `retry.budget`: in a sliding 10 s window, retries may add `ratio` × the requests plus `min`.
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
    package var budget: Budget? = .defaults

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

extension RetrySettings: SettingsSection {
    package static let defaults = RetrySettings()

    /// The keys of `retry:`, each stated once (see ``SettingsSection``).
    package static let keys: [SettingKey<RetrySettings>] = [
        .integer(
            "max-retries", \.maxRetries, 0...100, doc: "how often a request is sent again after its first attempt"),
        .choice(
            "backoff", \.backoff,
            doc:
                "how the wait grows: constant (initial), linear (initial × n) or exponential (initial × multiplier^(n−1))"
        ),
        .duration("initial", \.initial, doc: "the wait before the first retry"),
        .number(
            "multiplier", \.multiplier, 1...100, doc: "each wait over the one before, for exponential backoff",
            applies: { $0.backoff == .exponential }),
        .durationOrNone(
            "max-delay", \.maxDelay, doc: "the longest wait, after jitter and for a Retry-After too; none: no cap"),
        .custom(
            "jitter", \.jitter,
            schema: .object([
                (
                    "anyOf",
                    .array([
                        PolicySchema.enumeration(["none", "full", "equal"]),
                        .object([("type", "string"), ("pattern", "^(100(\\.0+)?|[0-9]{1,2}(\\.[0-9]+)?)%$")]),
                    ])
                )
            ]),
            type: "`none`, `full`, `equal` or a percentage from \"0%\" to \"100%\"",
            doc: "none, full (a draw in [0, d]), equal ([d/2, d]) or a percentage \"p%\" ([d(1−p), d(1+p)])",
            read: { decoder, input in decoder.jitter(input.node) }, text: { .text($0.description) }),
        .retryAfter(
            "retry-after", \.honorRetryAfter,
            doc:
                "honor: a Retry-After header (seconds or HTTP-date) sets the wait, up to max-delay; ignore: the backoff does"
        ),
        .durationOrNone(
            "attempt-timeout", \.attemptTimeout, reach: .request,
            doc: "one attempt, from the moment it leaves the engine; a slower one counts as error: timeout; or none"),
        .custom(
            "methods", \.methods, schema: PolicySchema.listOrOne(PolicySchema.method), type: "list of HTTP methods",
            doc: "the methods that may be retried; POST and PATCH only when listed (they are not idempotent)",
            read: { decoder, input in decoder.methods(input.node, input.key) },
            text: { .list($0.map { .text($0) }) }),
        .custom(
            "idempotency-key", \.idempotencyKey, schema: .object([("type", PolicySchema.textTypes)]),
            type: "header name or `none`",
            doc: "a header name, or none: a request carrying it may be retried whatever its method",
            read: { decoder, input in decoder.idempotencyKey(input) }, text: { .text($0 ?? "none") }),
        .action(
            "on-exhausted", \.onExhausted,
            doc: "where a request goes when its retries run out or it cannot be retried: deliver, fail or logout"),
        .durationOrNone(
            "deadline", \.deadline, reach: .request,
            doc: "the whole request, attempts and waits included; a wait that would end past it is not started; or none"
        ),
        .noneOr("budget", \.budget, doc: "retries at most min + ratio × requests in a sliding 10 s window, or none"),
    ]
}

extension RetrySettings.Budget: SettingsSection {
    /// `{ ratio: 0.2, min: 100 }`: Finagle's default.
    package static let defaults = RetrySettings.Budget(ratio: 0.2, min: 100)

    /// The keys of `retry.budget`.
    package static let keys: [SettingKey<RetrySettings.Budget>] = [
        .number("ratio", \.ratio, 0...1000, doc: "the share of requests that may be retried: 0.2 for 20 %"),
        .integer("min", \.min, 0...1_000_000, doc: "retries the window allows whatever the traffic"),
    ]
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
