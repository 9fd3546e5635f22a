/// The `dispatch:` section: how many requests the engine lets out at once to one host.
///
/// Requests beyond the limit wait in the engine, in arrival order, and are signed when they
/// leave, so they carry the token that is current then (as OkHttp's `Dispatcher` holds calls per
/// host). Set it to the transport's connection count per host (URLSession's
/// `httpMaximumConnectionsPerHost`, 6 by default): more only queues inside the transport, where
/// a token refresh would wait behind the storm.
package struct DispatchSettings: Sendable, Hashable {
    /// `nil` (unlimited) by default, which sends every request as soon as it is made.
    package var maxInFlightPerHost: Int?

    package init(maxInFlightPerHost: Int? = nil) {
        self.maxInFlightPerHost = maxInFlightPerHost
    }
}
