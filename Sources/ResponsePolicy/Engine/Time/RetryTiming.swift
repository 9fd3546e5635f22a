import Foundation

/// How long to wait before a retry: backoff, jitter and `Retry-After`.
enum RetryTiming {
    /// The wait before retry `n` (1-based): the server's `Retry-After` when honoured and present
    /// (capped at `max-delay`), else the backoff delay with jitter, capped at `max-delay` after
    /// the jitter (so a percentage jitter never takes a wait past the cap).
    static func delay(
        forRetry n: Int, settings: RetrySettings, response: HTTPResponse?, now: Date, random: any RandomSource
    ) -> Duration {
        if settings.honorRetryAfter, let header = response?.headers["Retry-After"],
            let requested = retryAfter(header, now: now)
        {
            guard let cap = settings.maxDelay else { return requested }
            return min(requested, cap)
        }
        let delay = settings.delay(forRetry: n)
        // Never past the longest the jitter allows (the draw is rounded to milliseconds), and
        // never past the cap: `longestWait` is what explain and the worst case state.
        return min(jittered(delay, settings.jitter, random: random), settings.longestWait(forRetry: n))
    }

    static func jittered(_ delay: Duration, _ jitter: RetrySettings.Jitter, random: any RandomSource) -> Duration {
        let seconds = delay.seconds
        let drawn: Double
        switch jitter {
        case .none: return delay
        case .full: drawn = seconds * random.nextUnit()
        case .equal: drawn = seconds / 2 + seconds / 2 * random.nextUnit()
        case .proportional(let p): drawn = seconds * (1 - p + 2 * p * random.nextUnit())
        }
        return .milliseconds(Int64((clampSeconds(drawn) * 1000).rounded()))
    }

    /// `Retry-After` as delay-seconds (RFC 9110 §10.2.3) or an HTTP-date; `nil` when neither.
    static func retryAfter(_ value: String, now: Date) -> Duration? {
        let text = value.trimmingCharacters(in: .whitespaces)
        if !text.isEmpty, text.utf8.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }) {
            guard let seconds = Int(text.prefix(10)) else { return nil }
            return .seconds(seconds)
        }
        for format in ["EEE, dd MMM yyyy HH:mm:ss zzz", "EEEE, dd-MMM-yy HH:mm:ss zzz", "EEE MMM d HH:mm:ss yyyy"] {
            let formatter = DateFormatter()
            formatter.locale = Locale(identifier: "en_US_POSIX")
            formatter.timeZone = TimeZone(identifier: "GMT")
            formatter.dateFormat = format
            if let date = formatter.date(from: text) {
                let seconds = date.timeIntervalSince(now)
                return .milliseconds(Int64((max(0, seconds) * 1000).rounded()))
            }
        }
        return nil
    }
}

/// The retry budget's sliding window: ten one-second buckets of requests and retries.
///
/// Why buckets: an exact window would keep a timestamp per request, unbounded under load; ten
/// buckets bound memory and cost O(1) per request, at the price of a window that slides in
/// one-second steps.
struct RetryBudgetWindow {
    private var requests = [Int](repeating: 0, count: 10)
    private var retries = [Int](repeating: 0, count: 10)
    private var currentSecond: Int64 = 0

    private mutating func advance(to now: Duration) {
        let second = now.components.seconds
        if second - currentSecond >= 10 {
            for i in 0..<10 {
                requests[i] = 0
                retries[i] = 0
            }
        } else {
            var s = currentSecond + 1
            while s <= second {
                let index = Int(s % 10)
                requests[index] = 0
                retries[index] = 0
                s += 1
            }
        }
        currentSecond = max(currentSecond, second)
    }

    mutating func recordRequest(at now: Duration) {
        advance(to: now)
        requests[Int(currentSecond % 10)] += 1
    }

    /// Takes one retry from the budget when `min + ratio × requests` allows it.
    mutating func takeRetry(at now: Duration, budget: RetrySettings.Budget) -> Bool {
        advance(to: now)
        let requestCount = requests.reduce(0, +)
        let retryCount = retries.reduce(0, +)
        guard Double(retryCount) < Double(budget.min) + budget.ratio * Double(requestCount) else { return false }
        retries[Int(currentSecond % 10)] += 1
        return true
    }
}
