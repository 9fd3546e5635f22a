import Foundation
import ResponsePolicy

/// Opens once a count is reached; a waiter before that suspends, one after returns at once.
final class Gate: @unchecked Sendable {
    // @unchecked: all state is read and written under `lock`.
    private let lock = NSLock()
    private var remaining: Int
    private var waiters: [CheckedContinuation<Void, Never>] = []

    init(count: Int) { remaining = count }

    /// Arrivals still awaited.
    var remainingCount: Int {
        lock.lock()
        defer { lock.unlock() }
        return remaining
    }

    func arrive() {
        lock.lock()
        remaining -= 1
        let ready = remaining == 0 ? waiters : []
        if remaining == 0 { waiters = [] }
        lock.unlock()
        for waiter in ready { waiter.resume() }
    }

    func wait() async {
        await withCheckedContinuation { continuation in
            lock.lock()
            if remaining <= 0 {
                lock.unlock()
                continuation.resume()
            } else {
                waiters.append(continuation)
                lock.unlock()
            }
        }
    }
}

/// 1401 for the old token (and counts it at the gate), `{"status":0}` for the refreshed one.
/// It never suspends, so it has nothing to cancel: it adopts `CancellableTransport` trivially.
struct StormTransport: CancellableTransport {
    func send(_ request: HTTPRequest, cancellation: AttemptCancellation) async throws -> HTTPResponse {
        try await send(request)
    }

    let gate: Gate
    let expired = HTTPResponse(status: 200, body: Data("{\"status\":1401}".utf8))
    let fine = HTTPResponse(status: 200, body: Data("{\"status\":0}".utf8))

    func send(_ request: HTTPRequest) async throws -> HTTPResponse {
        if request.headers["Authorization"] == "Bearer token-1" { return fine }
        gate.arrive()
        return expired
    }
}

/// Refreshes once every request waits for it (having hit its trigger, or held back from going
/// out while it runs), sampling memory at that moment: then all requests are in flight, parked
/// waiting for this refresh.
final class StormRefresh: RefreshPlugin {
    private let counters = Locked((calls: 0, inFlightRSS: 0.0))
    /// Whether every request waits for the refresh, set once the engine exists.
    let everyoneWaits = Locked<(@Sendable () -> Bool)?>(nil)

    var calls: Int { counters.withLock { $0.calls } }
    var inFlightRSS: Double { counters.withLock { $0.inFlightRSS } }

    func refresh(_ context: RefreshContext) async throws -> Credentials {
        counters.withLock { $0.calls += 1 }
        while !(everyoneWaits.withLock { $0 }?() ?? false) { await Task.yield() }
        // Let the last responses reach their waits.
        for _ in 0..<20 { await Task.yield() }
        let rss = residentMemory().current
        counters.withLock { $0.inFlightRSS = rss }
        return Credentials(accessToken: "token-1")
    }
}

/// 200 at once, never suspending: measures the engine, not the transport. A plain `Transport`:
/// the engine runs each attempt in a task of its own.
struct InstantTransport: Transport {
    let response = HTTPResponse(status: 200, body: Data("{\"status\":0}".utf8))
    func send(_ request: HTTPRequest) async throws -> HTTPResponse { response }
}

/// The same, adopting `CancellableTransport` (as `URLSessionTransport` does): attempts run inline.
struct InstantCancellableTransport: CancellableTransport {
    let response = HTTPResponse(status: 200, body: Data("{\"status\":0}".utf8))
    func send(_ request: HTTPRequest) async throws -> HTTPResponse { response }
    func send(_ request: HTTPRequest, cancellation: AttemptCancellation) async throws -> HTTPResponse { response }
}

extension Benchmarks {
    /// Bytes per task for `count` tasks parked on a continuation: what any caller's own waiting
    /// task costs, the floor under the engine's per-request figure.
    static func bareTaskBytes(count: Int) async -> Double {
        let gate = Gate(count: 1)
        let parked = Locked(0)
        let before = residentMemory().current
        var perTask = 0.0
        await withTaskGroup(of: Void.self) { group in
            for _ in 0..<count {
                group.addTask {
                    parked.withLock { $0 += 1 }
                    await gate.wait()
                }
            }
            while parked.withLock({ $0 }) < count { await Task.yield() }
            for _ in 0..<20 { await Task.yield() }
            perTask = max(0, residentMemory().current - before) / Double(count)
            gate.arrive()
        }
        return perTask
    }

    static func bareTaskBytesInChildProcess(count: Int) -> Double {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: CommandLine.arguments[0]).standardizedFileURL
        if !FileManager.default.isExecutableFile(atPath: process.executableURL?.path ?? "") {
            process.executableURL = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath()
        }
        process.arguments = ["--bare-task-bytes", String(count)]
        let pipe = Pipe()
        process.standardOutput = pipe
        do {
            try process.run()
        } catch {
            return .nan
        }
        let output = pipe.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return Double(String(decoding: output, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)) ?? .nan
    }

    /// 10,000 sends at once on an expired token. With `dispatch`, through that many slots per
    /// host: the queue waits for the refresh, so only the first wave goes out stale.
    static func storm(quick: Bool, dispatch: Int? = nil) async -> BenchResult {
        let count = quick ? 200 : 10_000
        let gate = Gate(count: count)
        let refresh = StormRefresh()
        var options = PolicyEngine.Options()
        options.refreshPlugin = refresh
        let text = Policy.defaultPolicyText + (dispatch.map { "\ndispatch: { max-in-flight-per-host: \($0) }\n" } ?? "")
        guard let policy = try? Policy.load(yaml: text) else { fatalError("default policy") }
        let engine = PolicyEngine(
            policy: policy, transport: StormTransport(gate: gate),
            credentials: MemoryCredentialStore(Credentials(accessToken: "token-0")), options: options)
        refresh.everyoneWaits.withLock { [weak engine] check in
            check = { [weak engine] in
                guard let snapshot = engine?.debugSnapshot else { return true }
                return snapshot.refreshWaiters + snapshot.dispatchQueued == count
            }
        }
        let request = HTTPRequest(url: URL(fileURLWithPath: "/profile"))
        let before = residentMemory().current
        let start = ContinuousClock.now
        let delivered = await withTaskGroup(of: Int.self) { group in
            for _ in 0..<count {
                group.addTask { (try? await engine.send(request)) == nil ? 0 : 1 }
            }
            return await group.reduce(0, +)
        }
        let wall = (ContinuousClock.now - start).nanoseconds / 1e6
        // In a fresh process of its own: measured in this one, the two would reuse each other's
        // freed memory and one of the figures would be meaningless.
        let counts: [(String, Double)] = [
            ("requests", Double(count)), ("delivered", Double(delivered)), ("refreshes", Double(refresh.calls)),
            // Attempts the server refused (signed with the old token); the others went out once.
            ("stale_attempts", Double(count - gate.remainingCount)),
        ]
        let memory = residentMemory()
        guard dispatch == nil else {
            return BenchResult(
                name: "storm-10k-dispatch-\(dispatch ?? 0)", value: wall, unit: "ms", baseline: nil, baselineName: nil,
                ratio: nil, ratioMeaning: "none", extra: counts + [("peak_rss_mib", memory.peak / 1_048_576)],
                goal: "refreshes == 1, stale_attempts <= 12")
        }
        // In a fresh process of its own: measured in this one, the two would reuse each other's
        // freed memory and one of the figures would be meaningless.
        let bare = bareTaskBytesInChildProcess(count: count)
        let perRequest = max(0, refresh.inFlightRSS - before) / Double(count)
        return BenchResult(
            name: "storm-10k", value: wall, unit: "ms", baseline: nil, baselineName: nil, ratio: nil,
            ratioMeaning: "none",
            extra: counts + [
                ("peak_rss_mib", memory.peak / 1_048_576), ("bytes_per_in_flight_request", perRequest),
                ("bytes_per_bare_waiting_task", bare),
                ("engine_bytes_per_in_flight_request", max(0, perRequest - bare)),
            ],
            goal: "< 1000 ms, refreshes == 1, < 2 KiB per in-flight request")
    }

    /// `engine-overhead` with and without `PolicyMetrics` observing, in the same rounds: what
    /// the metrics cost on the hot path (three events per delivered request, each counted).
    static func engineOverheadWithMetrics(quick: Bool) async -> BenchResult {
        guard let policy = try? Policy.load(yaml: Policy.defaultPolicyText) else { fatalError("default policy") }
        let request = HTTPRequest(url: URL(fileURLWithPath: "/profile"))
        let iterations = quick ? 200 : 100_000
        let rounds = quick ? 1 : 5
        let metrics = PolicyMetrics(policy: policy)
        var observed = PolicyEngine.Options()
        observed.observers = [metrics]
        let transport = InstantCancellableTransport()
        let plain = PolicyEngine(
            policy: policy, transport: transport, credentials: MemoryCredentialStore(Credentials(accessToken: "t")))
        let withMetrics = PolicyEngine(
            policy: policy, transport: transport, credentials: MemoryCredentialStore(Credentials(accessToken: "t")),
            options: observed)
        metrics.attach(withMetrics)
        var without = Double.infinity
        var with = Double.infinity
        for _ in 0..<rounds {
            var start = ContinuousClock.now
            for _ in 0..<iterations { blackHole(try? await plain.send(request)) }
            without = min(without, (ContinuousClock.now - start).nanoseconds / Double(iterations))
            start = ContinuousClock.now
            for _ in 0..<iterations { blackHole(try? await withMetrics.send(request)) }
            with = min(with, (ContinuousClock.now - start).nanoseconds / Double(iterations))
        }
        // A scrape of what was counted (its size and time), as Prometheus would take it.
        let scrapeStart = ContinuousClock.now
        let exposition = metrics.exposition()
        let scrape = (ContinuousClock.now - scrapeStart).nanoseconds / 1e6
        return BenchResult(
            name: "engine-overhead-metrics", value: with, unit: "ns", baseline: without,
            baselineName: "engine-overhead (no observer)", ratio: with / without,
            ratioMeaning: "with metrics ns / without ns, lower is better",
            extra: [
                ("added_ns", with - without), ("scrape_ms", scrape), ("scrape_bytes", Double(exposition.utf8.count)),
            ],
            goal: "<= 2.0")
    }

    static func engineOverhead(quick: Bool) async -> BenchResult {
        guard let policy = try? Policy.load(yaml: Policy.defaultPolicyText) else { fatalError("default policy") }
        let request = HTTPRequest(url: URL(fileURLWithPath: "/profile"))
        let iterations = quick ? 200 : 100_000
        let rounds = quick ? 1 : 5
        func engine(_ transport: any Transport) -> PolicyEngine {
            PolicyEngine(
                policy: policy, transport: transport, credentials: MemoryCredentialStore(Credentials(accessToken: "t")))
        }
        let inline = InstantCancellableTransport()
        let plain = InstantTransport()
        let inlineEngine = engine(inline)
        let plainEngine = engine(plain)
        var direct = Double.infinity
        var ours = Double.infinity
        var oursPlain = Double.infinity
        for _ in 0..<rounds {
            var start = ContinuousClock.now
            for _ in 0..<iterations { blackHole(try? await inline.send(request)) }
            direct = min(direct, (ContinuousClock.now - start).nanoseconds / Double(iterations))
            start = ContinuousClock.now
            for _ in 0..<iterations { blackHole(try? await inlineEngine.send(request)) }
            ours = min(ours, (ContinuousClock.now - start).nanoseconds / Double(iterations))
            start = ContinuousClock.now
            for _ in 0..<iterations { blackHole(try? await plainEngine.send(request)) }
            oursPlain = min(oursPlain, (ContinuousClock.now - start).nanoseconds / Double(iterations))
        }
        return BenchResult(
            name: "engine-overhead", value: ours, unit: "ns", baseline: direct, baselineName: "transport directly",
            ratio: ours / direct, ratioMeaning: "ours ns / direct ns, lower is better",
            extra: [
                ("added_ns", ours - direct), ("plain_transport_ns", oursPlain),
                ("plain_transport_added_ns", oursPlain - direct),
            ],
            goal: "< 2000 ns added")
    }
}
