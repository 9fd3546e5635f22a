/// The per-host queue of `dispatch: { max-in-flight-per-host: N }`: at most N requests of one
/// host on the wire; the others wait here, in arrival order, and are signed when they leave.
///
/// A request holds a slot from the moment it is let out until it parks (for a backoff or a
/// refresh) or ends; an attempt that leads straight to another (a retry with a newer token) keeps
/// its slot. A request that has been on the wire before (a retry, a re-send after a refresh)
/// waits in a queue of its own that leaves first: it is older than every request still waiting
/// for its first attempt, and the storm behind it must not push it past its deadline. While a refresh is in flight, queued requests whose scope holds new requests
/// (`refresh.hold-new-requests`, the default) stay queued: they leave when it ends, signed with
/// its token. (OkHttp's `Dispatcher` promotes queued calls the same way, per host.)
///
/// Concurrency contract: a part of ``EngineState``; every method runs under the engine's lock
/// (`insideLock`), and the continuations it collects are resumed by the caller after unlocking.
struct Dispatcher {
    /// One host's requests on the wire and waiting.
    struct Host {
        var inFlight = 0
        /// Requests waiting for their first attempt, then those that were sent before.
        var fresh = Queue()
        var resent = Queue()

        var isIdle: Bool { inFlight == 0 && fresh.isEmpty && resent.isEmpty }
    }

    /// A FIFO of requests; taken from the front by index, compacted now and then.
    struct Queue {
        var items: [RequestMachine] = []
        /// The first entry still to look at.
        var head = 0

        var isEmpty: Bool { head == items.count }
        var waiting: ArraySlice<RequestMachine> { items[head...] }

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

    private(set) var hosts: [String: Host] = [:]

    /// Requests waiting for a slot (not those ended while queued, which are skipped later).
    var queued: Int {
        hosts.values.reduce(0) { count, host in
            count + (host.fresh.waiting + host.resent.waiting).count { $0.phase == .queued && $0.endReason == nil }
        }
    }

    /// Requests holding a slot.
    var inFlight: Int { hosts.values.reduce(0) { $0 + $1.inFlight } }

    /// Lets `machine` out now (`true`), or queues it behind the others of its host (`false`).
    mutating func acquire(insideLock machine: RequestMachine, host: String, limit: Int) -> Bool {
        if machine.holdsSlot { return true }
        var entry = hosts[host] ?? Host()
        defer { hosts[host] = entry }
        if entry.inFlight < limit, entry.fresh.isEmpty, entry.resent.isEmpty {
            entry.inFlight += 1
            machine.holdsSlot = true
            return true
        }
        if machine.attempt > 0 { entry.resent.items.append(machine) } else { entry.fresh.items.append(machine) }
        machine.phase = .queued
        return false
    }

    /// Takes a free slot for `machine` ahead of the queues, when there is one (a request that
    /// waited for a refresh after being on the wire).
    mutating func reserve(insideLock machine: RequestMachine, host: String) {
        guard !machine.holdsSlot, (hosts[host]?.inFlight ?? 0) < machine.dispatchLimit else { return }
        hosts[host, default: Host()].inFlight += 1
        machine.holdsSlot = true
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
        Self.promote(insideLock: &entry.resent, &entry.inFlight, refreshing: refreshing, into: &woken)
        if entry.resent.isEmpty {
            Self.promote(insideLock: &entry.fresh, &entry.inFlight, refreshing: refreshing, into: &woken)
        }
        entry.resent.compact()
        entry.fresh.compact()
        hosts[host] = entry.isIdle ? nil : entry
    }

    private static func promote(
        insideLock queue: inout Queue, _ inFlight: inout Int, refreshing: Bool,
        into woken: inout [UnsafeContinuation<Void, Never>]
    ) {
        while !queue.isEmpty {
            let machine = queue.items[queue.head]
            // Ended while queued (a logout, its caller, its deadline): it leaves by itself.
            if machine.endReason != nil || machine.phase != .queued {
                queue.head += 1
                continue
            }
            guard inFlight < machine.dispatchLimit else { return }
            if refreshing, machine.scope.refresh.holdNewRequests { return }
            queue.head += 1
            inFlight += 1
            machine.holdsSlot = true
            machine.phase = .running
            machine.wake = .dispatched
            if let parked = machine.parked.take() { woken.append(parked) }
        }
    }
}
