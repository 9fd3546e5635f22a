/// The per-host queues of `dispatch: { max-in-flight-per-host: N }`: at most N requests of one
/// host on the wire; the others wait here, in arrival order, and are signed when they leave.
///
/// A request holds a slot from the moment it is let out until it parks (for a backoff or a
/// refresh) or ends; an attempt that leads straight to another (a retry with a newer token) keeps
/// its slot. A request that has been on the wire before (a retry, a re-send after a refresh)
/// waits in a queue of its own that leaves first: it is older than every request still waiting
/// for its first attempt, and the storm behind it must not push it past its deadline. While a
/// refresh is in flight, queued requests whose scope holds new requests
/// (`refresh.hold-new-requests`, the default) stay queued: they leave when it ends, signed with
/// its token. (OkHttp's `Dispatcher` promotes queued calls the same way, per host.)
///
/// A part of ``EngineState``: the queues hold request numbers, and what a request needs here
/// (its host, its limit, whether it is held, whether it holds a slot) is in its slot.
struct Dispatcher {
    /// One host's requests on the wire and waiting.
    struct Host {
        var inFlight = 0
        /// Requests waiting for their first attempt, then those that were sent before.
        var fresh = Queue()
        var resent = Queue()

        var isIdle: Bool { inFlight == 0 && fresh.isEmpty && resent.isEmpty }
    }

    /// A FIFO of request numbers; taken from the front by index, compacted now and then.
    struct Queue {
        var items: [UInt64] = []
        /// The first entry still to look at.
        var head = 0

        var isEmpty: Bool { head == items.count }
        var waiting: ArraySlice<UInt64> { items[head...] }

        mutating func compact() {
            if head == items.count {
                items.removeAll(keepingCapacity: items.count < 1024)
                head = 0
            } else if head > 1024, head * 2 > items.count {
                items.removeFirst(head)
                head = 0
            }
        }
    }

    var hosts: [String: Host] = [:]

    /// Requests holding a slot.
    var inFlight: Int { hosts.values.reduce(0) { $0 + $1.inFlight } }
}

/// The dispatcher's transitions. Each runs under the engine's lock; the continuations it
/// collects are resumed by the caller after unlocking.
extension EngineState {
    /// Requests waiting for a dispatch slot (not those ended while queued, skipped later).
    var queuedCount: Int {
        dispatcher.hosts.values.reduce(0) { count, host in
            count
                + (host.fresh.waiting + host.resent.waiting).count { id in
                    slots[id].map { $0.phase.isQueued && $0.endReason == nil } ?? false
                }
        }
    }

    /// Lets request `id` out now (`true`), or queues it behind the others of its host (`false`).
    mutating func acquireDispatchSlot(_ id: UInt64) -> Bool {
        guard let slot = slots[id], let host = slot.host else { return true }
        if slot.holdsSlot { return true }
        var entry = dispatcher.hosts[host] ?? Dispatcher.Host()
        defer { dispatcher.hosts[host] = entry }
        if entry.inFlight < slot.dispatchLimit, entry.fresh.isEmpty, entry.resent.isEmpty {
            entry.inFlight += 1
            modifySlot(id) { $0.holdsSlot = true }
            return true
        }
        if slot.sent { entry.resent.items.append(id) } else { entry.fresh.items.append(id) }
        return false
    }

    /// Takes a free slot for request `id` ahead of the queues, when there is one (a request that
    /// waited for a refresh after being on the wire).
    mutating func reserveDispatchSlot(_ id: UInt64) {
        guard let slot = slots[id], let host = slot.host, !slot.holdsSlot,
            (dispatcher.hosts[host]?.inFlight ?? 0) < slot.dispatchLimit
        else { return }
        dispatcher.hosts[host, default: Dispatcher.Host()].inFlight += 1
        modifySlot(id) { $0.holdsSlot = true }
    }

    /// Gives back the slot request `id` holds (it has parked or ended) and lets the next
    /// queued requests of its host out.
    mutating func releaseDispatchSlot(_ id: UInt64, into woken: inout Actions) {
        guard let host = slots[id]?.host else { return }
        let held =
            modifySlot(id) { slot -> Bool in
                defer { slot.holdsSlot = false }
                return slot.holdsSlot
            } ?? false
        if held { dispatcher.hosts[host]?.inFlight -= 1 }
        promote(host, into: &woken)
    }

    /// Lets queued requests of every host out, as far as their limits allow (after a refresh).
    mutating func promoteAll(_ woken: inout Actions) {
        for host in Array(dispatcher.hosts.keys) { promote(host, into: &woken) }
    }

    /// Lets queued requests of `host` out while it has free slots, those sent before first; stops
    /// at a request that must wait for the refresh in flight (each queue keeps its order).
    private mutating func promote(_ host: String, into woken: inout Actions) {
        guard var entry = dispatcher.hosts[host] else { return }
        promote(&entry.resent, &entry.inFlight, into: &woken)
        if entry.resent.isEmpty { promote(&entry.fresh, &entry.inFlight, into: &woken) }
        entry.resent.compact()
        entry.fresh.compact()
        dispatcher.hosts[host] = entry.isIdle ? nil : entry
    }

    private mutating func promote(
        _ queue: inout Dispatcher.Queue, _ inFlight: inout Int,
        into woken: inout Actions
    ) {
        let refreshing = flight != nil
        while !queue.isEmpty {
            let id = queue.items[queue.head]
            guard let slot = slots[id], slot.endReason == nil, slot.phase.isQueued else {
                // Ended while queued (a logout, its caller, its deadline): it leaves by itself.
                queue.head += 1
                continue
            }
            guard inFlight < slot.dispatchLimit else { return }
            if refreshing, slot.holdsNewRequests { return }
            queue.head += 1
            inFlight += 1
            modifySlot(id) { slot in
                slot.holdsSlot = true
                // Its deadline's timer stays armed until its task runs: a firing then does nothing.
                slot.phase = .woken(.dispatched, timer: 0)
                if let parked = slot.parked.take() { woken.append(.resume(parked)) }
            }
        }
    }
}
