import Foundation
import ResponsePolicy
import ResponsePolicyCurl
import ResponsePolicyURLSession

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// `--only storm-http`: storms through the real `URLSessionTransport` against a loopback server
/// (`scripts/storm-server.py`, started here), with the policy's defaults (`dispatch: auto`)
/// beside `dispatch: unlimited` (the default before it) as the baseline, in the same run.
///
/// - `storm-http-401-N`, `storm-http-1401-N`: N requests at once on an expired token (the server
///   answers 401, or 200 `{"status":1401}`). Reported: the refresh lag the *server* sees (first
///   stale request answered → token call arrived), median of the repetitions; the requests the
///   server saw (goal ≤ N + 12), refreshes, failed requests.
/// - `storm-http-202-N`: N requests on a valid token; the server answers the (N/10 + 1)-th OK
///   request with `{"status":202}` (session revoked). Reported: responses the server answered OK
///   before the 202 that did not reach their caller (goal 0), requests that reached the server
///   after the engine saw the 202 (goal 0), and what `cancel-in-flight` cancelled on the wire.
///
/// Heavy (tens of thousands of requests): never in the default run, and the test suite runs it
/// only with `--quick` (N = 50, one repetition).
extension Benchmarks {
    static func stormHTTP(
        quick: Bool, repetitions: Int, baselineRepetitions: Int? = nil, sizes chosen: [Int]? = nil, curl: Bool = false
    ) async -> [BenchResult] {
        stormCurl.set(curl)
        guard let server = StormServer.start() else {
            FileHandle.standardError.write(
                Data("storm-http: could not start scripts/storm-server.py (python3, run from the repository)\n".utf8))
            return []
        }
        defer { server.stop() }
        let sizes = quick ? [50] : chosen ?? [1_000, 5_000]
        let reps = quick ? 1 : repetitions
        let baseReps = quick ? 1 : max(0, baselineRepetitions ?? repetitions)
        var results: [BenchResult] = []
        for size in sizes {
            for expired in ["401", "1401"] {
                var ours: [StormRun] = []
                var baseline: [StormRun] = []
                for rep in 0..<max(reps, baseReps) {
                    if rep < reps {
                        ours.append(await expiredStorm(server, size: size, expired: expired, dispatch: nil))
                    }
                    if rep < baseReps {
                        baseline.append(
                            await expiredStorm(server, size: size, expired: expired, dispatch: "unlimited"))
                    }
                }
                let lag = stormMedian(ours.map(\.lagMs))
                let baseLag = stormMedian(baseline.map(\.lagMs))
                results.append(
                    BenchResult(
                        name: "storm-http-\(expired)-\(size)", value: lag, unit: "ms lag",
                        baseline: baseLag, baselineName: "dispatch: unlimited", ratio: baseLag / lag,
                        ratioMeaning: "unlimited lag / default lag, higher is better",
                        extra: [
                            ("n", Double(size)),
                            ("requests_median", stormMedian(ours.map { Double($0.apiCalls) })),
                            ("requests_max", Double(ours.map(\.apiCalls).max() ?? 0)),
                            // What the engine sent in the repetition with the most requests: the
                            // rest of the server's count was re-sent by the transport on its own.
                            (
                                "engine_sends_in_that_rep",
                                Double(ours.max { $0.apiCalls < $1.apiCalls }?.engineSends ?? 0)
                            ),
                            ("stale_answers_max", Double(ours.map(\.staleAnswers).max() ?? 0)),
                            ("lag_max_ms", ours.map(\.lagMs).max() ?? .nan),
                            ("refreshes_max", Double(ours.map(\.tokenCalls).max() ?? 0)),
                            ("failed_max", Double(ours.map(\.failed).max() ?? 0)),
                            ("wall_ms_median", stormMedian(ours.map(\.wallMs))),
                            ("baseline_requests_median", stormMedian(baseline.map { Double($0.apiCalls) })),
                            ("baseline_requests_max", Double(baseline.map(\.apiCalls).max() ?? 0)),
                            ("baseline_failed_max", Double(baseline.map(\.failed).max() ?? 0)),
                            ("baseline_wall_ms_median", stormMedian(baseline.map(\.wallMs))),
                        ],
                        goal: "lag <= 50 ms, requests <= \(size + 12), 1 refresh"))
            }
            var ours: [LogoutRun] = []
            var baseline: [LogoutRun] = []
            for rep in 0..<max(reps, baseReps) {
                if rep < reps { ours.append(await logoutStorm(server, size: size, dispatch: nil)) }
                if rep < baseReps { baseline.append(await logoutStorm(server, size: size, dispatch: "unlimited")) }
            }
            let lost = Double(ours.map(\.okLost).max() ?? 0)
            let late = Double(ours.map(\.lateArrivals).max() ?? 0)
            results.append(
                BenchResult(
                    name: "storm-http-202-\(size)", value: lost, unit: "OK answers lost",
                    baseline: Double(baseline.map(\.okLost).max() ?? 0), baselineName: "dispatch: unlimited",
                    ratio: nil, ratioMeaning: "counts, worst of the repetitions",
                    extra: [
                        ("n", Double(size)),
                        ("ok_before_202", Double(ours.map(\.okBefore).min() ?? 0)),
                        ("arrivals_after_engine_saw_202_max", late),
                        ("sends_after_logout_max", Double(ours.map(\.sendsAfterLogout).max() ?? 0)),
                        ("cancelled_on_wire_max", Double(ours.map(\.cancelledOnWire).max() ?? 0)),
                        ("never_sent_median", stormMedian(ours.map { Double($0.neverSent) })),
                        ("requests_median", stormMedian(ours.map { Double($0.apiCalls) })),
                        ("baseline_ok_before_202", Double(baseline.map(\.okBefore).min() ?? 0)),
                        ("baseline_arrivals_after_engine_saw_202_max", Double(baseline.map(\.lateArrivals).max() ?? 0)),
                        ("baseline_cancelled_on_wire_max", Double(baseline.map(\.cancelledOnWire).max() ?? 0)),
                        ("baseline_requests_median", stormMedian(baseline.map { Double($0.apiCalls) })),
                    ],
                    goal: "0 OK answers lost, 0 arrivals after the engine saw the 202"))
        }
        return results
    }

    struct StormRun {
        var apiCalls = 0
        /// Attempts the engine sent (its `send` events), and the answers it classified as expiry.
        var engineSends = 0
        var staleAnswers = 0
        var tokenCalls = 0
        var lagMs = Double.nan
        var failed = 0
        var wallMs = 0.0
    }

    struct LogoutRun {
        var okBefore = 0
        var okLost = 0
        var lateArrivals = 0
        var sendsAfterLogout = 0
        var cancelledOnWire = 0
        var neverSent = 0
        var apiCalls = 0
    }

    static func policy(port: Int, dispatch: String?) -> Policy? {
        let text = """
            policy: 1
            name: storm-http
            classify: { code: body.status }
            rules:
              - { name: token-expired, when: { code: [1401] }, then: refresh }
              - { name: forced-logout, when: { code: [202] }, then: logout }
              - { name: unauthorized, when: { status: [401] }, then: refresh }
            refresh:
              use: oauth2
              with: { token-url: "http://127.0.0.1:\(port)/oauth/token", client-id: bench }
            """ + (dispatch.map { "\ndispatch: { max-in-flight-per-host: \($0) }\n" } ?? "\n")
        return try? Policy.load(yaml: text, file: "storm-http.yaml")
    }

    /// N sends at once (`/api/items/<i>`) through a fresh engine and transport; returns each
    /// one's result.
    static func storm(
        _ server: StormServer, size: Int, dispatch: String?, observer: (any PolicyObserver)?,
        transport: (any Transport)? = nil
    ) async -> (results: [Result<HTTPResponse, PolicyEngineError>], wallMs: Double) {
        guard let policy = policy(port: server.port, dispatch: dispatch),
            let base = URL(string: "http://127.0.0.1:\(server.port)/api/items")
        else { return ([], 0) }
        var options = PolicyEngine.Options()
        if let observer { options.observers = [observer] }
        let engine = PolicyEngine(
            policy: policy, transport: transport ?? makeStormTransport(),
            credentials: MemoryCredentialStore(Credentials(accessToken: "access-0", refreshToken: "refresh-0")),
            options: options)
        let start = ContinuousClock.now
        let results = await withTaskGroup(of: Result<HTTPResponse, PolicyEngineError>.self) { group in
            for index in 0..<size {
                let url = base.appendingPathComponent(String(index))
                group.addTask {
                    do throws(PolicyEngineError) {
                        return .success(try await engine.send(HTTPRequest(url: url)))
                    } catch {
                        return .failure(error)
                    }
                }
            }
            var all: [Result<HTTPResponse, PolicyEngineError>] = []
            all.reserveCapacity(size)
            for await result in group { all.append(result) }
            return all
        }
        let wall = ContinuousClock.now - start
        await engine.waitForBackgroundWork()
        return (results, wall.milliseconds)
    }

    static func expiredStorm(_ server: StormServer, size: Int, expired: String, dispatch: String?) async -> StormRun {
        guard await server.reset(["expired": expired, "token": "expired"]) else { return StormRun() }
        let counter = SendCounter()
        let (results, wall) = await storm(server, size: size, dispatch: dispatch, observer: counter)
        let stats = server.stats() ?? [:]
        var run = StormRun()
        (run.engineSends, run.staleAnswers) = counter.counts
        run.apiCalls = stats["api_calls"] as? Int ?? 0
        run.tokenCalls = stats["token_calls"] as? Int ?? 0
        run.lagMs = (stats["lag_ms"] as? NSNumber)?.doubleValue ?? .nan
        run.failed = results.count { if case .failure = $0 { true } else { false } } + (size - results.count)
        run.wallMs = wall
        return run
    }

    /// Counts the engine's attempts and the answers it classified as expiry (401 or 1401): when
    /// the server counts more requests than the engine sent, the transport re-sent some itself.
    final class SendCounter: PolicyObserver, @unchecked Sendable {
        // Guarded by `lock`; one lock per event, in ours and the baseline alike.
        private let lock = NSLock()
        private var sends = 0
        private var stale = 0

        func observe(_ event: PolicyEvent) {
            guard event.kind == .send || event.kind == .response else { return }
            lock.lock()
            defer { lock.unlock() }
            if event.kind == .send {
                sends += 1
            } else if event.status == 401 || event.code == "1401" {
                stale += 1
            }
        }

        var counts: (sends: Int, stale: Int) {
            lock.lock()
            defer { lock.unlock() }
            return (sends, stale)
        }
    }

    /// Records the wall-clock time the engine saw the 202, and what happened on the wire after.
    final class LogoutWatch: PolicyObserver, @unchecked Sendable {
        // Guarded by `lock`; a plain class so the observer costs one lock per event.
        private let lock = NSLock()
        private var sawLogoutAt: Date?
        private var sendsAfter = 0
        private var responses = 0
        private var sendCount = 0

        func observe(_ event: PolicyEvent) {
            lock.lock()
            defer { lock.unlock() }
            switch event.kind {
            case .response where event.code == "202" && sawLogoutAt == nil:
                sawLogoutAt = Date()
            case .send:
                sendCount += 1
                if sawLogoutAt != nil { sendsAfter += 1 }
            case .response:
                responses += 1
            default:
                break
            }
        }

        var snapshot: (Date?, Int, Int, Int) {
            lock.lock()
            defer { lock.unlock() }
            return (sawLogoutAt, sendsAfter, responses, sendCount)
        }
    }

    static func logoutStorm(_ server: StormServer, size: Int, dispatch: String?) async -> LogoutRun {
        guard await server.reset(["token": "valid", "logout_after": size / 10]) else { return LogoutRun() }
        let watch = LogoutWatch()
        let stamping = StampingTransport(makeStormTransport())
        let (results, _) = await storm(server, size: size, dispatch: dispatch, observer: watch, transport: stamping)
        let stats = server.stats() ?? [:]
        let (sawAt, sendsAfter, responses, sends) = watch.snapshot
        var delivered = Set<Int>()
        for case .success(let response) in results {
            let body = try? JSONSerialization.jsonObject(with: response.body) as? [String: Any]
            if let seq = body?["seq"] as? Int { delivered.insert(seq) }
        }
        let before = (stats["ok_before_202"] as? [Int]) ?? []
        var run = LogoutRun()
        run.okBefore = before.count
        run.okLost = before.count { !delivered.contains($0) }
        // A request reaching the server after its 202 counts only when it left the engine after
        // the engine saw the 202 (one already on its way over another connection does not).
        let arrivals = (stats["arrivals_after_202"] as? [String]) ?? []
        if let sawAt {
            let sent = stamping.sentAt
            run.lateArrivals = arrivals.count { path in sent[path].map { $0 > sawAt } ?? true }
        }
        run.sendsAfterLogout = sendsAfter
        // Attempts that went out and never got a response the engine classified: cancelled on
        // the wire by the logout (`cancel-in-flight`).
        run.cancelledOnWire = max(0, sends - responses)
        run.neverSent = size - sends
        run.apiCalls = stats["api_calls"] as? Int ?? 0
        return run
    }

    /// `--transport curl`: the storms over `CurlTransport` instead of `URLSessionTransport`.
    static let stormCurl = LockedBox(false)

    static func makeStormTransport() -> any CancellableTransport {
        stormCurl.get() ? CurlTransport() : URLSessionTransport()
    }

    static func stormMedian(_ values: [Double]) -> Double {
        let sorted = values.filter { !$0.isNaN }.sorted()
        guard !sorted.isEmpty else { return .nan }
        let middle = sorted.count / 2
        return sorted.count % 2 == 1 ? sorted[middle] : (sorted[middle - 1] + sorted[middle]) / 2
    }
}

extension Duration {
    var milliseconds: Double {
        Double(components.seconds) * 1_000 + Double(components.attoseconds) * 1e-15
    }
}

/// A transport, with the moment each path was handed to it (the attempt left the engine).
final class StampingTransport: CancellableTransport {
    let inner: any CancellableTransport
    private let stamps = LockedBox<[String: Date]>([:])

    init(_ inner: any CancellableTransport) { self.inner = inner }

    var sentAt: [String: Date] { stamps.get() }
    var sessionCallTransport: any Transport { inner.sessionCallTransport }
    var connectionsPerHost: Int? { inner.connectionsPerHost }
    func inFlightLimit(for url: URL) -> Int? { inner.inFlightLimit(for: url) }

    func send(_ request: HTTPRequest) async throws -> HTTPResponse {
        stamp(request)
        return try await inner.send(request)
    }

    func send(_ request: HTTPRequest, cancellation: AttemptCancellation) async throws -> HTTPResponse {
        stamp(request)
        return try await inner.send(request, cancellation: cancellation)
    }

    private func stamp(_ request: HTTPRequest) {
        let now = Date()
        stamps.modify { $0[request.url.path] = $0[request.url.path] ?? now }
    }
}

/// `scripts/storm-server.py` in a child process; its stdin is a pipe, so it exits with us.
final class StormServer: @unchecked Sendable {
    // Set once in `start`, read-only afterwards.
    let process: Process
    let input: Pipe
    let port: Int

    private init(process: Process, input: Pipe, port: Int) {
        self.process = process
        self.input = input
        self.port = port
    }

    static func start() -> StormServer? {
        let script =
            ProcessInfo.processInfo.environment["POLICY_STORM_SERVER"]
            ?? FileManager.default.currentDirectoryPath + "/scripts/storm-server.py"
        guard FileManager.default.fileExists(atPath: script) else { return nil }
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = ["python3", script]
        let input = Pipe()
        let output = Pipe()
        process.standardInput = input
        process.standardOutput = output
        guard (try? process.run()) != nil else { return nil }
        // The first line is `PORT <n>`.
        var line = Data()
        while !line.contains(UInt8(ascii: "\n")) {
            let chunk = output.fileHandleForReading.availableData
            if chunk.isEmpty { break }
            line.append(chunk)
        }
        let text = String(decoding: line, as: UTF8.self)
        guard text.hasPrefix("PORT "), let port = Int(text.dropFirst(5).prefix { $0.isNumber }) else {
            process.terminate()
            return nil
        }
        return StormServer(process: process, input: input, port: port)
    }

    func stop() {
        try? input.fileHandleForWriting.close()
        process.waitUntilExit()
    }

    /// A blocking request to the server's control routes (off the storm's path).
    private func call(_ method: String, _ path: String, body: [String: Any]? = nil) -> [String: Any]? {
        guard let url = URL(string: "http://127.0.0.1:\(port)\(path)") else { return nil }
        var request = URLRequest(url: url)
        request.httpMethod = method
        if let body { request.httpBody = try? JSONSerialization.data(withJSONObject: body) }
        let done = DispatchSemaphore(value: 0)
        let answer = LockedBox<Data?>(nil)
        let task = URLSession.shared.dataTask(with: request) { data, _, _ in
            answer.set(data)
            done.signal()
        }
        task.resume()
        done.wait()
        guard let data = answer.get() else { return nil }
        return try? JSONSerialization.jsonObject(with: data) as? [String: Any]
    }

    /// Zeroes the counters for the next storm, once the previous one's stragglers are in: a
    /// storm's transport can still be delivering requests after every send returned (the
    /// baseline's timed-out ones), and counted after the reset they were charged to the next
    /// storm (up to 90 "stale" requests in one repetition of five, over `CurlTransport`).
    /// Waits until the count holds still for 300 ms, 10 s at most.
    func reset(_ scenario: [String: Any]) async -> Bool {
        var last = stats()?["api_calls"] as? Int
        for _ in 0..<33 {
            try? await Task.sleep(for: .milliseconds(300))
            let now = stats()?["api_calls"] as? Int
            if now == last { break }
            last = now
        }
        return call("POST", "/_reset", body: scenario) != nil
    }
    func stats() -> [String: Any]? { call("GET", "/_stats") }
}

/// A value shared with a URLSession completion handler.
final class LockedBox<Value>: @unchecked Sendable {
    // Guarded by `lock`.
    private let lock = NSLock()
    private var value: Value

    init(_ value: Value) { self.value = value }
    func set(_ newValue: Value) {
        lock.lock()
        value = newValue
        lock.unlock()
    }
    func modify(_ body: (inout Value) -> Void) {
        lock.lock()
        body(&value)
        lock.unlock()
    }
    func get() -> Value {
        lock.lock()
        defer { lock.unlock() }
        return value
    }
}
