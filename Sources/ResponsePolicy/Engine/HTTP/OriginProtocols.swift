/// Which origins answered over a protocol that multiplexes requests on one connection (HTTP/2,
/// HTTP/3): what `dispatch: auto` reads through a transport's `inFlightLimit(for:)`. Both shipped
/// transports keep one.
///
/// Bounded: a service that sends to origins its input names (webhooks, user-given URLs) must
/// not grow a table per origin for the life of the process. Past ``capacity`` origins, noting a
/// new one forgets another; a forgotten origin is back at the HTTP/1.1 limit until it answers
/// again.
///
/// Concurrency contract: any thread; one lock.
package struct OriginProtocols: Sendable {
    /// The most origins remembered.
    package static let capacity = 1_024

    private let table = Locked<[RedirectRules.Origin: Bool]>([:])

    package init() {}

    /// Whether `origin` last answered over a protocol that multiplexes; `nil` if not known.
    package func multiplexes(_ origin: RedirectRules.Origin) -> Bool? {
        table.withLock { $0[origin] }
    }

    /// Notes what `origin` answered over.
    package func note(_ origin: RedirectRules.Origin, multiplexes: Bool) {
        table.withLock { table in
            let known = table[origin]
            guard known != multiplexes else { return }
            if known == nil, table.count >= Self.capacity { table.remove(at: table.startIndex) }
            table[origin] = multiplexes
        }
    }

    /// Origins remembered.
    package var count: Int { table.withLock { $0.count } }
}
