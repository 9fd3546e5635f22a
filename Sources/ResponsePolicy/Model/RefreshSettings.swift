/// The `refresh:` section: how a fresh token is obtained and how often that may happen.
package struct RefreshSettings: Sendable, Hashable {
    package struct Limit: Sendable, Hashable {
        package var count: Int
        package var per: Duration
        package init(count: Int, per: Duration) {
            self.count = count
            self.per = per
        }
    }

    /// How a refresh retries transient trouble (`refresh.transient`): a 5xx, 408, 425 or 429
    /// answer, `temporarily_unavailable`, `slow_down`, no answer, a reset connection. The plugin is
    /// called again after `initial`, doubling up to `max-delay`, or after the answer's
    /// `Retry-After` (obeyed in full), for as long as `refresh.timeout` allows; the requests
    /// waiting for the refresh stay parked meanwhile. Trouble that outlasts the timeout fails those
    /// requests, and the session goes on: only a definitive answer
    /// (``RefreshFailure/Kind/definitive``) reaches `on-failure`.
    package struct Transient: Sendable, Hashable {
        /// `500ms` by default: the wait before the second call.
        package var initial: Duration = .milliseconds(500)
        /// `5s` by default: the longest backoff between two calls. A `Retry-After` is obeyed in
        /// full, however long: the server asked for no call before it ends.
        package var maxDelay: Duration = .seconds(5)
        /// `true` (`retry-after: honor`) by default: a `Retry-After` answer sets the wait.
        package var honorRetryAfter = true

        package init() {}

        /// The shortest wait between two calls, whatever `initial` or a `Retry-After: 0` say:
        /// an endpoint that keeps failing at once is not called in a tight loop.
        package static let minimumDelay = Duration.milliseconds(50)

        /// The wait before call `call + 1`, after `call` calls: the server's `requested` wait in
        /// full, or `initial × 2^(call−1)` capped at `max-delay`; never below ``minimumDelay``.
        package func delay(afterCall call: Int, requested: Duration?) -> Duration {
            if honorRetryAfter, let requested { return max(requested, Self.minimumDelay) }
            var delay = initial
            for _ in 1..<max(call, 1) where delay < maxDelay { delay = delay * 2 }
            return max(min(delay, maxDelay), Self.minimumDelay)
        }
    }

    /// The plugin that performs the refresh; `nil` when `use:` is missing (lint reports any
    /// `refresh` action then).
    package var plugin: PluginReference?
    /// `10s` by default; a slower refresh has failed.
    package var timeout: Duration = .seconds(10)
    /// `0s` (off) by default: a trigger on a request signed with the *current* token this soon
    /// after a refresh is re-sent without refreshing again. Only for servers where a new token
    /// takes a moment to propagate: a request signed with an older token is already recognised
    /// by the token generation and re-sent at once, whatever this says. A longer window re-sends
    /// a token that really expired again unchanged, which uses up `max-per-request`.
    package var shareWindow: Duration = .zero
    /// `1` by default: how often one request may be re-sent for refresh triggers.
    package var maxPerRequest: Int = 1
    /// `logout` by default.
    package var onExhausted: ActionKind = .logout
    /// `logout` by default.
    package var onFailure: ActionKind = .logout
    /// `{count: 5, per: 30s}` by default: more refreshes that did not help than this in the window
    /// fail. A refresh did not help when the token it replaces was refused before any response
    /// signed with it was accepted (a loop: a new token refused at once); healthy rotations, a
    /// token used until it expired, are not counted however often they come.
    package var limit: Limit? = Limit(count: 5, per: .seconds(30))
    /// `30s` by default: refresh before sending when the token expires this soon, and never
    /// sooner than half the token's lifetime as issued (a token living 20 s is refreshed ahead
    /// 10 s before it expires): a token the last refresh just issued is never refreshed ahead.
    package var ahead: Duration? = .seconds(30)
    /// Retries of transient refresh trouble within `timeout`; `nil` (`transient: none`) fails the
    /// refresh at the first transient answer (still without ending the session).
    package var transient: Transient? = Transient()
    /// `true` by default: while a refresh is in flight, a request that has not gone out yet (a new
    /// one, or one queued by `dispatch:`) waits for it and is signed with the fresh token, instead
    /// of going out with a token already known to be stale. `false` sends it with the old token.
    package var holdNewRequests = true

    package init() {}
}
