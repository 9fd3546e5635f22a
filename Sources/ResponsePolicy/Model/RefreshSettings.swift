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
    /// `{count: 5, per: 30s}` by default: more refreshes than this in the window fail.
    package var limit: Limit? = Limit(count: 5, per: .seconds(30))
    /// `30s` by default: refresh before sending when the token expires this soon.
    package var ahead: Duration? = .seconds(30)
    /// `true` by default: while a refresh is in flight, a request that has not gone out yet (a new
    /// one, or one queued by `dispatch:`) waits for it and is signed with the fresh token, instead
    /// of going out with a token already known to be stale. `false` sends it with the old token.
    package var holdNewRequests = true

    package init() {}
}
