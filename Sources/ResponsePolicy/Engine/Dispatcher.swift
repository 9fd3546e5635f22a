/// The per-host queue of `dispatch: { max-in-flight-per-host: N }`: at most N requests of one
/// host on the wire; the others wait here, in arrival order, and are signed when they leave.
///
/// A request holds a slot from the moment it is let out until it parks (for a backoff or a
/// refresh) or ends; an attempt that leads straight to another (a retry with a newer token) keeps
/// its slot. While a refresh is in flight, queued requests whose scope holds new requests
/// (`refresh.hold-new-requests`, the default) stay queued: they leave when it ends, signed with
/// its token. (OkHttp's `Dispatcher` promotes queued calls the same way, per host.)
///
/// Concurrency contract: a part of ``EngineState``; every method runs under the engine's lock
/// (`insideLock`), and the continuations it collects are resumed by the caller after unlocking.
struct Dispatcher {
    /// One host's requests on the wire and waiting.
    struct Host {
        var inFlight = 0
        var queue: [RequestMachine] = []
        /// The first entry of `queue` still to look at.
        var head = 0

        var isIdle: Bool { inFlight == 0 && head == queue.count }
    }

    private(set) var hosts: [String: Host] = [:]

    /// Requests waiting for a slot (not those ended while queued, which are skipped later).
    var queued: Int {
        hosts.values.reduce(0) { count, host in
            count + host.queue[host.head...].count { $0.phase == .queued && $0.endReason == nil }
        }
    }

    /// Requests holding a slot.
    var inFlight: Int { hosts.values.reduce(0) { $0 + $1.inFlight } }

    /// Lets `machine` out now (`true`), or queues it behind the others of its host (`false`).
    mutating func acquire(insideLock machine: RequestMachine, host: String, limit: Int) -> Bool {
        if machine.holdsSlot { return true }
        var entry = hosts[host] ?? Host()
        defer { hosts[host] = entry }
        if entry.inFlight < limit, entry.head == entry.queue.count {
            entry.inFlight += 1
            machine.holdsSlot = true
            return true
        }
        entry.queue.append(machine)
        machine.phase = .queued
        return false
    }

    /// Gives back the slot `machine` holds (if any) and lets the next queued requests out.
    mutating func release(
        insideLock machine: RequestMachine, host: String, refreshing: Bool,
        into woken: inout [UnsafeContinuation<Void, Never>]
    ) {
        if machine.holdsSlot {
            machine.holdsSlot = false
            hosts[host]?.inFlight -= 1
        }
        promote(insideLock: host, refreshing: refreshing, into: &woken)
    }

    /// Lets queued requests of every host out, as far as their limits allow (after a refresh).
    mutating func promoteAll(insideLock refreshing: Bool, into woken: inout [UnsafeContinuation<Void, Never>]) {
        for host in Array(hosts.keys) { promote(insideLock: host, refreshing: refreshing, into: &woken) }
    }

    /// Lets queued requests of `host` out while it has free slots; stops at a request that must
    /// wait for the refresh in flight (the queue keeps its order).
    private mutating func promote(
        insideLock host: String, refreshing: Bool, into woken: inout [UnsafeContinuation<Void, Never>]
    ) {
        guard var entry = hosts[host] else { return }
        while entry.head < entry.queue.count {
            let machine = entry.queue[entry.head]
            // Ended while queued (a logout, its caller): it leaves by itself.
            if machine.endReason != nil || machine.phase != .queued {
                entry.head += 1
                continue
            }
            guard entry.inFlight < machine.dispatchLimit else { break }
            if refreshing, machine.scope.refresh.holdNewRequests { break }
            entry.head += 1
            entry.inFlight += 1
            machine.holdsSlot = true
            machine.phase = .running
            machine.wake = .dispatched
            if let parked = machine.parked.take() { woken.append(parked) }
        }
        if entry.head == entry.queue.count {
            entry.queue.removeAll(keepingCapacity: entry.queue.count < 1024)
            entry.head = 0
        } else if entry.head > 1024, entry.head * 2 > entry.queue.count {
            entry.queue.removeFirst(entry.head)
            entry.head = 0
        }
        hosts[host] = entry.isIdle ? nil : entry
    }
}
