import Foundation
import ResponsePolicy

/// Runs recorded traffic through one policy, or two side by side, on the virtual clock: each
/// recorded request is sent at its recorded offset and each of its attempts is answered with the
/// recorded answer to that attempt (the last one repeats), after its recorded latency. A refresh
/// is answered as the recording's token call that started nearest to it (or as ``Options/refresh``
/// says); the logout plugin does nothing. Everything else is the real engine, as in ``Simulator``.
///
/// Memory is bounded by the requests in flight, not by the recording: the source is read as the
/// clock moves, each request's answers are dropped once every policy has its outcome, finished
/// tasks are discarded, and events are handed to `onEvent` as they happen.
///
/// With two policies, both engines get every request at the same virtual time, each with its own
/// refresh plugin and counts; ``RequestReport/outcomes`` holds each one's outcome, in order.
package enum Replayer {
    package enum RefreshMode: String, Sendable, CaseIterable {
        /// As the recording's nearest token call (new tokens when it has none).
        case recorded
        /// New tokens every time.
        case ok
        /// A definitive failure every time (400 `invalid_grant`).
        case fail
        /// No answer every time (transient trouble).
        case transient
    }

    package struct Options: Sendable {
        package var refresh = RefreshMode.recorded
        /// How long each token call takes; the recorded duration (or `100ms`) by default.
        package var refreshAfter: Duration?
        package var seed: UInt64 = 1

        package init() {}
    }

    /// What one policy made of one request.
    package struct Outcome: Sendable, Equatable {
        package var result: PolicyEvent.Result?
        package var status: Int?
        package var code: String?
        package var reason: String?
        package var attempts = 0

        /// Whether a recorded outcome says the same: the same last status and code (or error), and
        /// the same result where the recording names one.
        package func matches(_ recorded: RecordedOutcome) -> Bool {
            if let expected = recorded.result, expected != result { return false }
            // A caller whose request a logout ended gets no response, whatever was on the wire.
            // (or whose attempt the recording shows unanswered: a cancelled attempt looks like that).
            if result == .loggedOut || result == .cancelled { return recorded.result != nil || recorded.error != nil }
            if recorded.error != nil { return status == nil && result != .delivered }
            return status == recorded.status && code == recorded.code
        }

        /// `delivered 200 code 0`, `logged-out 200 code 202 (…)`.
        package var text: String {
            var out = result?.rawValue ?? "unfinished"
            if let status { out += " \(status)" }
            if let code { out += " code \(code)" }
            if let reason { out += " (\(reason))" }
            return out
        }
    }

    /// One request once every policy has its outcome.
    package struct RequestReport: Sendable {
        package var id: String
        package var method: String
        package var path: String
        package var at: Duration
        package var position: TextPosition?
        package var recorded: RecordedOutcome
        package var outcomes: [Outcome]
    }

    package struct Result: Sendable {
        package var summaries: [Simulator.Summary]
        package var stats: ReplayStats
        /// Requests or refresh waiters left after the run (0, or the engine leaked).
        package var leftovers: Int
    }

    package enum Failure: Error, CustomStringConvertible {
        case input(ReplayInputError)
        case stalled(at: Duration)

        package var description: String {
            switch self {
            case .input(let error): return error.description
            case .stalled(let t):
                return
                    "the replay stalled at t=\(PolicyEvent.seconds(t))s: requests wait for something that never happens"
            }
        }
    }

    /// Replays `source` through each of `policies` (one or two).
    package static func run(
        policies: [Policy], source: any ReplaySource, options: Options = Options(),
        onEvent: @escaping @Sendable (Int, PolicyEvent) -> Void = { _, _ in },
        onRequest: @escaping @Sendable (RequestReport) -> Void = { _ in }
    ) throws(Failure) -> Result {
        let clock = VirtualClock()
        let scheduler = SimulationScheduler(clock: clock, externalWorkGracePeriod: .zero)
        let book = Book(engines: policies.count, onRequest: onRequest)
        let reader = SourceBox(source)
        var engines: [PolicyEngine] = []
        var refreshes: [ReplayRefresh] = []
        var observers: [ReplayObserver] = []
        for (index, policy) in policies.enumerated() {
            let refresh = ReplayRefresh(reader: reader, options: options, clock: clock)
            let observer = ReplayObserver(index: index, book: book, onEvent: onEvent)
            var engineOptions = PolicyEngine.Options()
            engineOptions.clock = clock
            engineOptions.taskExecutor = scheduler.executor
            engineOptions.random = SeededRandomSource(seed: options.seed)
            engineOptions.observers = [observer]
            engineOptions.refreshPlugin = refresh
            engineOptions.logoutPlugin = NoLogout()
            engineOptions.environment = [:]
            engines.append(
                PolicyEngine(
                    policy: policy, transport: ReplayTransport(index: index, book: book, clock: clock),
                    credentials: MemoryCredentialStore(Credentials(accessToken: "\(TokenServer.prefix)0")),
                    options: engineOptions))
            refreshes.append(refresh)
            observers.append(observer)
        }
        let running = engines
        do {
            try scheduler.run {
                await withDiscardingTaskGroup { group in
                    while let item = reader.next() {
                        if item.request.at > clock.now { try? await clock.sleep(until: item.request.at) }
                        let request = book.register(item)
                        for engine in running {
                            group.addTask { _ = try? await engine.send(request) }
                        }
                    }
                }
                for engine in running { await engine.waitForBackgroundWork() }
            }
        } catch {
            throw .stalled(at: clock.now)
        }
        if let error = reader.failure { throw .input(error) }
        var summaries: [Simulator.Summary] = []
        for (index, observer) in observers.enumerated() {
            var summary = observer.summary
            summary.requests = reader.stats.requests
            summary.refreshes = refreshes[index].calls
            summaries.append(summary)
        }
        return Result(
            summaries: summaries, stats: reader.stats, leftovers: engines.reduce(0) { $0 + $1.leftovers })
    }

    /// ``run(policies:source:options:onEvent:onRequest:)`` on a thread of its own (it blocks the
    /// thread it runs on, which must not be one of the concurrency pool's few).
    package static func run(
        policies: [Policy], source: any ReplaySource, options: Options = Options(),
        onEvent: @escaping @Sendable (Int, PolicyEvent) -> Void = { _, _ in },
        onRequest: @escaping @Sendable (RequestReport) -> Void = { _ in }
    ) async throws(Failure) -> Result {
        let box = SourceHandOver(source)
        let outcome: Swift.Result<Result, Failure> = await withCheckedContinuation { continuation in
            let thread = Thread {
                do throws(Failure) {
                    continuation.resume(
                        returning: .success(
                            try run(
                                policies: policies, source: box.source, options: options, onEvent: onEvent,
                                onRequest: onRequest)))
                } catch {
                    continuation.resume(returning: .failure(error))
                }
            }
            thread.stackSize = 8 << 20
            thread.start()
        }
        return try outcome.get()
    }
}

/// Hands a source to the replay's thread (used there alone).
private final class SourceHandOver: @unchecked Sendable {
    // @unchecked: the caller gives up the source; only the replay's thread touches it after.
    let source: any ReplaySource
    init(_ source: any ReplaySource) { self.source = source }
}

/// The recording behind a lock: the feeder reads requests, refreshes read token calls.
final class SourceBox: @unchecked Sendable {
    // @unchecked: every use of `source` is inside `lock`.
    private let lock = NSLock()
    private let source: any ReplaySource
    private(set) var failure: ReplayInputError?

    init(_ source: any ReplaySource) { self.source = source }

    /// The next request; `nil` at the end or after a malformed place (kept in ``failure``).
    func next() -> ReplayRequest? {
        lock.withLock { () -> ReplayRequest? in
            guard failure == nil else { return nil }
            do throws(ReplayInputError) {
                return try source.next()
            } catch {
                failure = error
                return nil
            }
        }
    }

    func tokenCalls(since: Duration) -> [RecordedTokenCall] { lock.withLock { source.tokenCalls(since: since) } }

    var stats: ReplayStats { lock.withLock { source.stats } }
}

/// Each request's recorded answers and the outcomes so far, by id, until every engine is done
/// with it.
final class Book: Sendable {
    struct Entry {
        var report: Replayer.RequestReport
        var responses: [SimulationScript.Response]
        var generations: [Int?]
        /// Per engine, the index of the answer its next attempt gets.
        var attempts: [Int]
        var remaining: Int
    }

    private let entries = Locked<[String: Entry]>([:])
    let engines: Int
    let onRequest: @Sendable (Replayer.RequestReport) -> Void

    init(engines: Int, onRequest: @escaping @Sendable (Replayer.RequestReport) -> Void) {
        self.engines = engines
        self.onRequest = onRequest
    }

    /// Keeps the request's answers; returns the request to send.
    func register(_ item: ReplayRequest) -> HTTPRequest {
        let request = item.request
        let report = Replayer.RequestReport(
            id: request.id, method: request.method, path: request.path, at: request.at, position: item.position,
            recorded: item.recorded, outcomes: Array(repeating: Replayer.Outcome(), count: engines))
        entries.withLock {
            $0[request.id] = Entry(
                report: report, responses: request.responses, generations: item.generations,
                attempts: Array(repeating: 0, count: engines),
                remaining: engines)
        }
        var headers = HTTPHeaders(request.headers)
        if request.body != nil, headers["Content-Type"] == nil { headers.set("Content-Type", "application/json") }
        let url =
            URL(string: "https://replay.invalid" + (request.path.hasPrefix("/") ? "" : "/") + request.path)
            ?? URL(fileURLWithPath: "/")
        return HTTPRequest(
            method: request.method, url: url, headers: headers, body: request.body.map { Data($0.utf8) },
            id: request.id)
    }

    /// The answer to engine `engine`'s next attempt of request `id`, signed after `refreshes`
    /// refreshes (`nil`: unknown): the next recorded answer, past those the recording got with a
    /// credential older than that (a server accepts the newer token); the last one repeats.
    func answer(_ id: String, engine: Int, refreshes: Int?) -> SimulationScript.Response? {
        entries.withLock { entries in
            guard var entry = entries[id], let last = entry.responses.last else { return nil }
            var index = entry.attempts[engine]
            if let refreshes {
                while index < entry.responses.count - 1, index < entry.generations.count,
                    let generation = entry.generations[index], generation < refreshes
                {
                    index += 1
                }
            }
            entry.attempts[engine] = index + 1
            entries[id] = entry
            return index < entry.responses.count ? entry.responses[index] : last
        }
    }

    /// Engine `engine`'s attempt count for `id` went up (a `send` event).
    func sent(_ id: String, engine: Int) {
        entries.withLock { $0[id]?.report.outcomes[engine].attempts += 1 }
    }

    /// Engine `engine`'s outcome for `id`; the report goes out when every engine has one.
    func finished(_ id: String, engine: Int, _ event: PolicyEvent) {
        let done: Replayer.RequestReport? = entries.withLock { entries in
            guard var entry = entries[id] else { return nil }
            entry.report.outcomes[engine].result = event.result
            entry.report.outcomes[engine].status = event.status
            entry.report.outcomes[engine].code = event.code
            entry.report.outcomes[engine].reason = event.reason
            entry.remaining -= 1
            if entry.remaining == 0 {
                entries[id] = nil
                return entry.report
            }
            entries[id] = entry
            return nil
        }
        if let done { onRequest(done) }
    }
}

/// The recorded server: attempt n of a request gets its n-th recorded answer (the last repeats),
/// after that answer's recorded latency.
struct ReplayTransport: Transport {
    let index: Int
    let book: Book
    let clock: VirtualClock

    func send(_ request: HTTPRequest) async throws -> HTTPResponse {
        guard let answer = book.answer(request.id ?? "", engine: index, refreshes: TokenServer.token(in: request))
        else {
            // A request the recording never saw go out (refused during a cooldown there).
            try await clock.sleep(until: clock.now + .milliseconds(1))
            throw TransportError(.connection, "the recording has no answer for this request")
        }
        try await clock.sleep(until: clock.now + (answer.latency ?? .milliseconds(50)))
        if let error = answer.error { throw TransportError(error, "recorded") }
        return HTTPResponse(status: answer.status, headers: HTTPHeaders(answer.headers), body: Data(answer.body.utf8))
    }
}

/// Counts what the summary needs, tells the book of attempts and outcomes, forwards events.
final class ReplayObserver: PolicyObserver {
    let index: Int
    let book: Book
    let onEvent: @Sendable (Int, PolicyEvent) -> Void
    private let counts = Locked(Simulator.Summary())

    init(index: Int, book: Book, onEvent: @escaping @Sendable (Int, PolicyEvent) -> Void) {
        self.index = index
        self.book = book
        self.onEvent = onEvent
    }

    var summary: Simulator.Summary { counts.withLock { $0 } }

    func observe(_ event: PolicyEvent) {
        counts.withLock { $0.count(event) }
        onEvent(index, event)
        if let id = event.request {
            if event.kind == .send { book.sent(id, engine: index) }
            if event.kind == .outcome { book.finished(id, engine: index, event) }
        }
    }
}

/// A refresh answered as the recording's token call nearest in time, or as the options say.
final class ReplayRefresh: RefreshPlugin {
    let reader: SourceBox
    let options: Replayer.Options
    let clock: VirtualClock
    private let count = Locked(0)

    init(reader: SourceBox, options: Replayer.Options, clock: VirtualClock) {
        self.reader = reader
        self.options = options
        self.clock = clock
    }

    var calls: Int { count.withLock { $0 } }

    func refresh(_ context: RefreshContext) async throws -> Credentials {
        let call = count.withLock { count in
            count += 1
            return count
        }
        var step = SimulationScript.RefreshStep()
        switch options.refresh {
        case .recorded:
            let now = clock.now
            let calls = reader.tokenCalls(since: now - .seconds(60))
            if let nearest = calls.min(by: { abs(($0.at - now).seconds) < abs(($1.at - now).seconds) }) {
                step = nearest.step
            }
        case .ok: break
        case .fail:
            step.result = .fail
            step.status = 400
            step.body = "{\"error\":\"invalid_grant\"}"
        case .transient:
            step.result = .transient
        }
        if let after = options.refreshAfter { step.after = after }
        return try await ScriptedRefresh.answer(step, call: call, context, clock: clock, tokenServer: nil)
    }
}
