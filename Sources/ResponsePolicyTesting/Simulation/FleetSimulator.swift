import Foundation
import ResponsePolicy

/// Runs a fleet script: several real engines ("processes"), each with its own scripted server
/// answers and its own credentials file, sharing one ``InMemoryCoordinationStore`` (which runs
/// the ``CoordinationRecord`` the file and Redis stores run) and one ``FleetTokenServer`` on one
/// virtual clock; and the script's events: a store outage or pause, a process killed or restarted.
///
/// Why: a fleet's worst failures (a refresh token presented twice, the whole fleet logged out by
/// coordination trouble) depend on timing between processes. On one ``SimulationScheduler`` every
/// process's tasks run on one thread in FIFO order and virtual time moves only when nothing can
/// run, so a script shows the same interleaving, and the same events, every run.
///
/// A killed process dies as `kill -9` does: its requests in flight end at once (outcome
/// `cancelled`, reason "the process was killed"), it never calls the store again (a lease it holds
/// stays until it expires), and a token call it had on the way has reached the server (the server
/// handles a call when it is made and answers after the step's `after`), so the pair it issued
/// dies with the process. A restart is a kill followed at once by a fresh engine that starts from
/// the credentials file the old one kept (`expires_at` to the second, as a file keeps it) and
/// joins the shared session. A frozen process (SIGSTOP) runs nothing until it thaws: its timers,
/// its answers (the token server's, the store's, the API's) and the news it hears wait for it.
///
/// The store's faults are those a real one has: an outage; a pause, in which a call's client
/// gives up at `connect-timeout` (the call is never run) while a publication waits it out; slow
/// answers, which the client gives up on after the store ran the call; forgetting everything or
/// the keys with a time to live; a restart with no persistence, which also drops every
/// subscription.
package enum FleetSimulator {
    /// A line of the fleet's output that is not an engine's event: a process started, killed or
    /// restarted, the store down, up or paused, a call that reached the token server.
    package struct Note: Sendable, Equatable {
        package var time: Duration
        package var process: String?
        /// `start`, `kill`, `restart`, `store` or `token-call`.
        package var event: String
        /// JSON fields after `event`, values already JSON (`"down"`, `3`).
        package var fields: [Field]
        /// The line in words, for the text format.
        package var text: String

        package struct Field: Sendable, Equatable {
            package var key: String
            package var json: String
        }

        package var jsonLine: String {
            var out = "{\"t\":" + PolicyEvent.seconds(time)
            if let process { out += ",\"process\":" + PolicyEvent.quote(process) }
            out += ",\"event\":" + PolicyEvent.quote(event)
            for field in fields { out += ",\(PolicyEvent.quote(field.key)):\(field.json)" }
            return out + "}"
        }
    }

    /// One line of output, in the order things happened.
    package enum Line: Sendable {
        /// An engine's event; its `request` is the request's id within `process`.
        case engine(process: String, event: PolicyEvent)
        case note(Note)
    }

    package struct ProcessSummary: Sendable, Equatable {
        package var process: String
        package var summary: Simulator.Summary
    }

    /// What the fleet did: each process's summary, their sums, and what only a fleet has.
    package struct Summary: Sendable, Equatable {
        package var processes: [ProcessSummary] = []
        /// The processes' counters summed (`refreshes`: calls to the refresh plugin).
        package var total = Simulator.Summary()
        /// Calls that reached the token server.
        package var tokenCalls = 0
        /// Spent refresh tokens presented again (each revokes the token family).
        package var reuses = 0
        /// Refresh leases the store granted.
        package var leases = 0
        package var restarts = 0
        package var kills = 0

        /// A counter by its script name (`token-calls`), as `expect: { summary: … }` names it.
        package func value(_ key: String) -> Int {
            switch key {
            case "processes": return processes.count
            case "token-calls": return tokenCalls
            case "reuses": return reuses
            case "leases": return leases
            case "restarts": return restarts
            case "kills": return kills
            default: return SimulationExpectations.value(key, in: total)
            }
        }

        /// A process's counter; nil when there is no such process.
        package func value(_ key: String, of process: String) -> Int? {
            processes.first { $0.process == process }.map { SimulationExpectations.value(key, in: $0.summary) }
        }

        /// The last line of `--format json`: a one-process summary's keys, then the fleet's.
        package var jsonLine: String {
            let t = total
            return "{\"event\":\"summary\",\"processes\":\(processes.count),\"requests\":\(t.requests),"
                + "\"delivered\":\(t.delivered),\"failed\":\(t.failed),\"logged-out\":\(t.loggedOut),"
                + "\"refreshes\":\(t.refreshes),\"logouts\":\(t.logouts),\"attempts\":\(t.attempts),"
                + "\"token-calls\":\(tokenCalls),\"reuses\":\(reuses),\"leases\":\(leases),"
                + "\"restarts\":\(restarts),\"kills\":\(kills)}"
        }

        /// A process's line: `{"event":"process-summary","process":"a",...}`.
        package static func jsonLine(_ process: ProcessSummary) -> String {
            process.summary.jsonLine.replacingOccurrences(
                of: "{\"event\":\"summary\",",
                with: "{\"event\":\"process-summary\",\"process\":\(PolicyEvent.quote(process.process)),")
        }
    }

    package struct Result: Sendable {
        /// Every line in order; empty when they were streamed to `onLine` instead.
        package var lines: [Line]
        package var summary: Summary
        /// Requests still registered and refresh waiters still parked in the live engines after
        /// the run.
        package var leftovers: Int
    }

    /// Runs `script` (which has `fleet`) under `policy`. Blocks the calling thread.
    package static func run(
        policy: Policy, script: SimulationScript, maxAttempts: Int = Simulator.maxAttempts,
        onLine: (@Sendable (Line) -> Void)? = nil
    ) throws(Simulator.Failure) -> Result {
        let fleet = script.fleet ?? FleetScript()
        let clock = VirtualClock()
        let scheduler = SimulationScheduler(clock: clock, externalWorkGracePeriod: .zero)
        let run = FleetRun(
            policy: policy, script: script, clock: clock, scheduler: scheduler, maxAttempts: maxAttempts,
            onLine: onLine)
        // `store: down, for: 2s` is a down and an up; the up goes after every written event, so
        // events written for the same instant keep their order.
        let events =
            fleet.events
            + fleet.events.compactMap { event -> FleetScript.Event? in
                guard case .storeDown(let span?) = event.kind else { return nil }
                return FleetScript.Event(at: event.at + span, kind: .storeUp, range: event.range)
            }
        do {
            try scheduler.run {
                await withTaskGroup(of: Void.self) { group in
                    for process in fleet.processes {
                        group.addTask {
                            try? await clock.sleep(until: process.start)
                            guard !Task.isCancelled else { return }
                            run.start(process.id, credentials: process.credentials, restart: false)
                        }
                    }
                    for event in events {
                        group.addTask {
                            try? await clock.sleep(until: event.at)
                            guard !Task.isCancelled else { return }
                            run.apply(event.kind)
                        }
                    }
                    for process in fleet.processes {
                        for request in process.requests {
                            group.addTask {
                                try? await clock.sleep(until: request.at)
                                guard !Task.isCancelled else { return }
                                await run.send(request, from: process.id)
                            }
                        }
                    }
                    for await _ in group where run.isStopped() { group.cancelAll() }
                }
            }
        } catch {
            throw .stalled(at: clock.now)
        }
        if run.isStopped() { throw .tooManyAttempts(limit: maxAttempts, at: run.stoppedAt) }
        return Result(lines: run.lines, summary: run.summary(), leftovers: run.leftovers)
    }

    /// ``run(policy:script:maxAttempts:onLine:)`` on its own thread, for async callers.
    package static func run(
        policy: Policy, script: SimulationScript, maxAttempts: Int = Simulator.maxAttempts,
        onLine: (@Sendable (Line) -> Void)? = nil
    ) async throws(Simulator.Failure) -> Result {
        let outcome: Swift.Result<Result, Simulator.Failure> = await withCheckedContinuation { continuation in
            let thread = Thread {
                do throws(Simulator.Failure) {
                    continuation.resume(
                        returning: .success(
                            try run(policy: policy, script: script, maxAttempts: maxAttempts, onLine: onLine)))
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

/// One run of a fleet script: the processes, the shared store and token server, the output.
///
/// Concurrency contract: called from the simulation's tasks (one thread, FIFO); the state lives
/// behind locks so the types stay `Sendable`, and no lock is held while an engine is called or a
/// line is written.
final class FleetRun: Sendable {
    private struct Output {
        var lines: [FleetSimulator.Line] = []
        var summaries: [String: Simulator.Summary] = [:]
        var attempts = 0
        var stopped = false
        var stoppedAt: Duration = .zero
        var restarts = 0
        var kills = 0
        var pausedUntil: Duration = .zero
        var slowUntil: Duration = .zero
    }

    let policy: Policy
    let clock: VirtualClock
    let scheduler: SimulationScheduler
    let store: InMemoryCoordinationStore
    let server: FleetTokenServer
    let tokens: TokenServer?
    let lease: Duration
    /// The most a store call's client waits (the coordination's `connect-timeout`, 250ms by default).
    let connectTimeout: Duration
    /// Whether the processes share the store: the policy names a coordination other than `local`.
    let shared: Bool
    let seed: UInt64
    let maxAttempts: Int
    let onLine: (@Sendable (FleetSimulator.Line) -> Void)?
    /// In the script's order.
    let processes: [SimulatedProcess]
    private let output = Locked(Output())

    init(
        policy: Policy, script: SimulationScript, clock: VirtualClock, scheduler: SimulationScheduler,
        maxAttempts: Int, onLine: (@Sendable (FleetSimulator.Line) -> Void)?
    ) {
        self.policy = policy
        self.clock = clock
        self.scheduler = scheduler
        self.maxAttempts = maxAttempts
        self.onLine = onLine
        seed = script.seed
        store = InMemoryCoordinationStore(clock: clock, executor: scheduler.executor)
        tokens = script.tokens.map { TokenServer($0) }
        server = FleetTokenServer(steps: script.refresh, clock: clock, tokens: tokens)
        // The lease the policy's coordination names (`with: { lease: … }`), 15s as in production.
        lease =
            policy.coordination.options["lease"]?.string.flatMap { Duration.parsePolicy($0) }
            .flatMap { $0 > .zero ? $0 : nil } ?? .seconds(15)
        connectTimeout =
            policy.coordination.options["connect-timeout"]?.string.flatMap { Duration.parsePolicy($0) }
            .flatMap { $0 > .zero ? $0 : nil } ?? .milliseconds(250)
        shared = policy.coordination.name != "local"
        var processes: [SimulatedProcess] = []
        let output = output
        let stopped: @Sendable () -> Bool = { output.withLock { $0.stopped } }
        for (index, process) in (script.fleet?.processes ?? []).enumerated() {
            var own = script
            own.requests = process.requests
            own.fleet = nil
            processes.append(
                SimulatedProcess(
                    id: process.id, index: index, requests: process.requests.count,
                    transport: ScriptedTransport(script: own, clock: clock, tokenServer: tokens, stopped: stopped)))
        }
        self.processes = processes
        output.withLock { state in
            for process in processes {
                var summary = Simulator.Summary()
                summary.requests = process.requests
                state.summaries[process.id] = summary
            }
        }
    }

    func process(_ id: String) -> SimulatedProcess? { processes.first { $0.id == id } }

    var lines: [FleetSimulator.Line] { output.withLock { $0.lines } }
    var stoppedAt: Duration { output.withLock { $0.stoppedAt } }
    func isStopped() -> Bool { output.withLock { $0.stopped } }

    var leftovers: Int { processes.compactMap { $0.current?.engine.leftovers }.reduce(0, +) }

    func summary() -> FleetSimulator.Summary {
        var summary = FleetSimulator.Summary()
        let (summaries, restarts, kills) = output.withLock { ($0.summaries, $0.restarts, $0.kills) }
        for process in processes {
            var own = summaries[process.id] ?? Simulator.Summary()
            own.refreshes = process.refreshCalls
            summary.processes.append(.init(process: process.id, summary: own))
            summary.total.requests += own.requests
            summary.total.delivered += own.delivered
            summary.total.failed += own.failed
            summary.total.loggedOut += own.loggedOut
            summary.total.cancelled += own.cancelled
            summary.total.refreshes += own.refreshes
            summary.total.logouts += own.logouts
            summary.total.attempts += own.attempts
        }
        summary.tokenCalls = server.tokenCalls
        summary.reuses = server.reuses
        summary.leases = store.leasesGranted
        summary.restarts = restarts
        summary.kills = kills
        return summary
    }

    // MARK: - Output

    /// An event of `process`'s engine `incarnation`: counted and written while that incarnation
    /// lives; a dead process says nothing.
    func engineEvent(_ event: PolicyEvent, process: SimulatedProcess, incarnation: Int) {
        guard process.isLive(incarnation) else { return }
        if event.kind == .outcome, let id = event.request { process.ended(id) }
        record(.engine(process: process.id, event: event))
    }

    private func record(_ line: FleetSimulator.Line) {
        let forward: Bool = output.withLock { state in
            guard !state.stopped else { return false }
            if case .engine(let process, let event) = line {
                if event.kind == .send {
                    guard state.attempts < maxAttempts else {
                        state.stopped = true
                        state.stoppedAt = event.time
                        return false
                    }
                    state.attempts += 1
                }
                var summary = state.summaries[process] ?? Simulator.Summary()
                summary.count(event)
                state.summaries[process] = summary
            }
            if onLine == nil { state.lines.append(line) }
            return true
        }
        if forward { onLine?(line) }
    }

    func note(_ event: String, process: String? = nil, _ fields: [(String, String)] = [], text: String) {
        record(
            .note(
                .init(
                    time: clock.now, process: process, event: event,
                    fields: fields.map { .init(key: $0.0, json: $0.1) }, text: text)))
    }

    /// A request that ends without its engine: the process was killed, or is not running.
    private func cancelled(_ id: String, of process: SimulatedProcess, reason: String) {
        var event = PolicyEvent(.outcome, time: clock.now, request: id)
        event.result = .cancelled
        event.reason = reason
        record(.engine(process: process.id, event: event))
    }

    // MARK: - Processes

    /// Starts `id` (again, for a restart) with `credentials`; `nil` takes what its credentials file holds.
    func start(_ id: String, credentials: FleetScript.StartingCredentials?, restart: Bool) {
        guard let process = process(id) else { return }
        let starting: Credentials?
        switch credentials {
        case .pair(let number)?: starting = server.pair(number)
        case .latest?: starting = server.pair(server.newest)
        case FleetScript.StartingCredentials.none?: starting = nil
        case nil:
            // What the old engine saved, as a file keeps it: `expires_at` to the second.
            starting = process.savedCredentials.map { saved in
                var copy = saved
                copy.expiresAt = saved.expiresAt.map {
                    Date(timeIntervalSince1970: $0.timeIntervalSince1970.rounded(.down))
                }
                return copy
            }
        }
        let inner = store.coordinator(lease: lease)
        let incarnation = process.begin(inner)
        var options = PolicyEngine.Options()
        // Its own view of the clock: a sleep (a timer) never ends while the process is frozen.
        options.clock = FreezableClock(base: clock, process: process)
        options.taskExecutor = scheduler.executor
        options.random = SeededRandomSource(seed: seed &+ UInt64(process.index) &* 7919 &+ UInt64(incarnation))
        options.observers = [ProcessObserver(run: self, process: process, incarnation: incarnation)]
        options.refreshPlugin = FleetRefresh(run: self, process: process, incarnation: incarnation)
        options.logoutPlugin = NoLogout()
        options.environment = [:]
        // A policy that shares nothing (`coordination: local`, the default) runs each process on
        // its own, as it would in production: the simulation shows what that costs.
        options.coordinator =
            shared
            ? FleetCoordinator(inner: inner, run: self, process: process, incarnation: incarnation)
            : LocalSessionCoordinator()
        let file = MemoryCredentialStore(starting)
        let what: String
        switch credentials {
        case .pair(let number)?: what = "pair \(number)"
        case .latest?: what = "pair \(server.newest) (latest)"
        case FleetScript.StartingCredentials.none?: what = "none"
        case nil: what = "its file's"
        }
        note(
            restart ? "restart" : "start", process: id,
            [("credentials", PolicyEvent.quote(what))] + (shared ? [] : [("coordinated", "false")]),
            text: (restart ? "restarted" : "started") + " with credentials \(what)"
                + (shared ? "" : ", alone (coordination: local shares nothing)"))
        let engine = PolicyEngine(
            policy: policy, transport: FreezableTransport(inner: process.transport, process: process, clock: clock),
            credentials: file, options: options)
        process.install(engine, file: file, incarnation: incarnation)
    }

    /// Kills `process` as `kill -9` does.
    func kill(_ process: SimulatedProcess, restart: Bool) {
        let (open, inner) = process.kill()
        inner?.stop()
        output.withLock { state in
            if restart { state.restarts += 1 } else { state.kills += 1 }
        }
        if !restart { note("kill", process: process.id, text: "killed") }
        for (id, task) in open {
            cancelled(id, of: process, reason: "the process was killed")
            task.cancel()
        }
    }

    func apply(_ kind: FleetScript.Event.Kind) {
        switch kind {
        case .storeDown:
            store.isAvailable = false
            note("store", [("state", "\"down\"")], text: "store down")
        case .storeUp:
            store.isAvailable = true
            note("store", [("state", "\"up\"")], text: "store up")
        case .storePause(let span):
            let until = clock.now + span
            output.withLock { $0.pausedUntil = max($0.pausedUntil, until) }
            note(
                "store", [("state", "\"paused\""), ("for", PolicyEvent.seconds(span))],
                text: "store paused for \(PolicyEvent.seconds(span))s")
        case .storeSlow(let span):
            let until = clock.now + span
            output.withLock { $0.slowUntil = max($0.slowUntil, until) }
            note(
                "store", [("state", "\"slow\""), ("for", PolicyEvent.seconds(span))],
                text: "store answers late for \(PolicyEvent.seconds(span))s")
        case .storeForget(let everything):
            store.forget(everything ? .everything : .volatile)
            note(
                "store", [("state", everything ? "\"flushed\"" : "\"evicted\"")],
                text: everything ? "store forgot everything (flush)" : "store evicted its keys with a time to live")
        case .storeRestart(let span):
            store.forget(.everything)
            store.isAvailable = false
            note(
                "store", [("state", "\"restarted\""), ("for", PolicyEvent.seconds(span))],
                text: "store restarted empty, down for \(PolicyEvent.seconds(span))s")
            if span == .zero {
                store.isAvailable = true
            } else {
                let store = store
                let clock = clock
                Task(executorPreference: scheduler.executor) {
                    try? await clock.sleep(until: clock.now + span)
                    store.isAvailable = true
                }
            }
        case .freeze(let target, let span):
            guard let process = hit(target) else { return }
            let until = clock.now + span
            process.freeze(until: until)
            note(
                "freeze", process: process.id, [("for", PolicyEvent.seconds(span))],
                text: "frozen (SIGSTOP) for \(PolicyEvent.seconds(span))s")
            let clock = clock
            Task(executorPreference: scheduler.executor) { [self] in
                try? await clock.sleep(until: until)
                guard process.thaw(at: clock.now) else { return }
                note("thaw", process: process.id, text: "thawed (SIGCONT)")
                for update in process.takeDeferred() { update() }
            }
        case .kill(let target):
            guard let process = hit(target) else { return }
            kill(process, restart: false)
        case .restart(let target, let credentials):
            guard let process = hit(target) else { return }
            kill(process, restart: true)
            start(process.id, credentials: credentials, restart: true)
        }
    }

    /// The process an event hits; a note when there is none (no lease holder, not running).
    private func hit(_ target: FleetScript.Event.Target) -> SimulatedProcess? {
        switch target {
        case .process(let id):
            guard let process = process(id), process.current != nil else {
                note("skipped", process: id, text: "not running: the event does nothing")
                return nil
            }
            return process
        case .leaseHolder:
            let holders = processes.compactMap { process in process.leaseOrder.map { (process, $0) } }
            guard let holder = holders.max(by: { $0.1 < $1.1 })?.0 else {
                note("skipped", text: "no process holds the lease: the event does nothing")
                return nil
            }
            return holder
        }
    }

    /// Sends `request` through the process's engine, as the process's caller would.
    func send(_ request: SimulationScript.Request, from id: String) async {
        guard let process = process(id) else { return }
        // A frozen process starts nothing: its caller's request goes out when it runs again.
        await process.waitWhileFrozen(clock)
        guard let (engine, incarnation) = process.current else {
            cancelled(request.id, of: process, reason: "process '\(id)' is not running")
            return
        }
        var headers = HTTPHeaders(request.headers)
        if request.body != nil, headers["Content-Type"] == nil { headers.set("Content-Type", "application/json") }
        let url =
            URL(string: "https://simulated.invalid" + (request.path.hasPrefix("/") ? "" : "/") + request.path)
            ?? URL(fileURLWithPath: "/")
        let httpRequest = HTTPRequest(
            method: request.method, url: url, headers: headers, body: request.body.map { Data($0.utf8) }, id: request.id
        )
        let task = Task(executorPreference: scheduler.executor) {
            _ = try? await engine.send(httpRequest)
        }
        process.track(request.id, task, incarnation: incarnation)
        await task.value
        process.ended(request.id)
    }

    /// Returns when the store is not paused.
    func waitWhilePaused() async {
        while true {
            let until = output.withLock { $0.pausedUntil }
            guard clock.now < until else { return }
            do { try await clock.sleep(until: until) } catch { return }
        }
    }

    /// When a paused store resumes (now or earlier: not paused).
    var pausedUntil: Duration { output.withLock { $0.pausedUntil } }
    /// Until when the store answers late.
    var slowUntil: Duration { output.withLock { $0.slowUntil } }
}

/// One simulated process: its scripted server answers, its credentials file and the engine now
/// running (a new one after each restart: an incarnation).
final class SimulatedProcess: Sendable {
    private struct State {
        var incarnation = 0
        var alive = false
        var engine: PolicyEngine?
        var file: MemoryCredentialStore?
        var coordinator: (any SessionCoordinator)?
        /// Requests on their way through the engine, in the order they were sent.
        var open: [(id: String, task: Task<Void, Never>)] = []
        /// When this process was granted the lease it holds (a count of grants), nil when it holds none.
        var leaseOrder: Int?
        var refreshCalls = 0
        /// Until when it is frozen (SIGSTOP); `.zero`: it runs.
        var frozenUntil: Duration = .zero
        /// What it received while frozen (news from the store), handed over when it thaws.
        var deferred: [@Sendable () -> Void] = []
        /// Its turns whose answers its client gave up on.
        var abandoned = AbandonedAskers()
    }

    let id: String
    let index: Int
    let requests: Int
    let transport: ScriptedTransport
    private let state = Locked(State())
    private static let grants = Locked(0)

    init(id: String, index: Int, requests: Int, transport: ScriptedTransport) {
        self.id = id
        self.index = index
        self.requests = requests
        self.transport = transport
    }

    func isLive(_ incarnation: Int) -> Bool { state.withLock { $0.alive && $0.incarnation == incarnation } }

    var current: (engine: PolicyEngine, incarnation: Int)? {
        state.withLock { state in
            guard state.alive, let engine = state.engine else { return nil }
            return (engine, state.incarnation)
        }
    }

    var savedCredentials: Credentials? { state.withLock { try? $0.file?.load() } ?? nil }
    var refreshCalls: Int { state.withLock { $0.refreshCalls } }
    var leaseOrder: Int? { state.withLock { $0.alive ? $0.leaseOrder : nil } }

    /// A new incarnation is starting: it is live before its engine exists, so what the engine
    /// does while it is made is heard.
    func begin(_ coordinator: any SessionCoordinator) -> Int {
        state.withLock { state in
            state.incarnation += 1
            state.alive = true
            state.engine = nil
            state.coordinator = coordinator
            state.leaseOrder = nil
            state.frozenUntil = .zero
            state.deferred = []
            return state.incarnation
        }
    }

    /// The asker id of its next turn (``AbandonedAskers``).
    func takeAsker() -> UInt64 { state.withLock { $0.abandoned.take() } }

    /// Its client gave up on the turn asked under `asker`.
    func abandon(_ asker: UInt64) { state.withLock { $0.abandoned.abandon(asker) } }

    /// Stops the process until `until` (SIGSTOP).
    func freeze(until: Duration) {
        state.withLock { $0.frozenUntil = max($0.frozenUntil, until) }
    }

    /// Whether it is frozen at `now`.
    func isFrozen(at now: Duration) -> Bool { state.withLock { $0.frozenUntil > now } }

    /// The freeze is over at `now` (SIGCONT); false when a later freeze keeps it stopped.
    func thaw(at now: Duration) -> Bool { state.withLock { $0.frozenUntil <= now && $0.alive } }

    /// What it received while frozen, in order, now that it runs.
    func takeDeferred() -> [@Sendable () -> Void] {
        state.withLock { state in
            defer { state.deferred = [] }
            return state.deferred
        }
    }

    /// Runs `delivery` now, or when the process thaws.
    func deliver(at now: Duration, _ delivery: @escaping @Sendable () -> Void) {
        let later = state.withLock { state -> Bool in
            guard state.frozenUntil > now else { return false }
            state.deferred.append(delivery)
            return true
        }
        if !later { delivery() }
    }

    /// Returns when the process runs (at once when it is not frozen).
    func waitWhileFrozen(_ clock: VirtualClock) async {
        while true {
            let until = state.withLock { $0.frozenUntil }
            guard clock.now < until else { return }
            do { try await clock.sleep(until: until) } catch { return }
        }
    }

    func install(_ engine: PolicyEngine, file: MemoryCredentialStore, incarnation: Int) {
        state.withLock { state in
            guard state.incarnation == incarnation else { return }
            state.engine = engine
            state.file = file
        }
    }

    /// Dies: returns the requests in flight and the coordinator to stop.
    func kill() -> ([(id: String, task: Task<Void, Never>)], (any SessionCoordinator)?) {
        state.withLock { state in
            state.alive = false
            state.engine = nil
            state.leaseOrder = nil
            defer {
                state.open = []
                state.coordinator = nil
            }
            return (state.open, state.coordinator)
        }
    }

    func track(_ id: String, _ task: Task<Void, Never>, incarnation: Int) {
        state.withLock { state in
            if state.incarnation == incarnation, state.alive { state.open.append((id, task)) }
        }
    }

    func ended(_ id: String) {
        state.withLock { state in state.open.removeAll { $0.id == id } }
    }

    func countRefresh(_ incarnation: Int) -> Bool {
        state.withLock { state in
            guard state.alive, state.incarnation == incarnation else { return false }
            state.refreshCalls += 1
            return true
        }
    }

    func holdsLease(_ holds: Bool, incarnation: Int) {
        let order: Int? =
            holds
            ? Self.grants.withLock { value -> Int in
                value += 1
                return value
            } : nil
        state.withLock { state in
            guard state.alive, state.incarnation == incarnation else { return }
            state.leaseOrder = order
        }
    }
}

/// Hands one incarnation's events to the run.
struct ProcessObserver: PolicyObserver {
    let run: FleetRun
    let process: SimulatedProcess
    let incarnation: Int

    func observe(_ event: PolicyEvent) { run.engineEvent(event, process: process, incarnation: incarnation) }
}

/// The refresh plugin of one incarnation: a call to the fleet's token server, which a process
/// killed on the way never reaches.
struct FleetRefresh: RefreshPlugin {
    let run: FleetRun
    let process: SimulatedProcess
    let incarnation: Int

    func refresh(_ context: RefreshContext) async throws -> Credentials {
        guard process.countRefresh(incarnation) else { throw RefreshFailure("the process was killed") }
        let step = run.server.nextStep()
        // The server handles the call when it is made (it spends the refresh token then); the
        // answer reaches the process after the step's `after`, when it runs.
        let (outcome, answer, call) = run.server.answer(
            presented: context.credentials?.refreshToken, step: step, sentAfter: step.after)
        var fields = [("call", String(call)), ("result", PolicyEvent.quote(answer.rawValue))]
        if let presented = FleetTokenServer.pairNumber(context.credentials?.refreshToken) {
            // Which pair's refresh token it presented (its number, never the token).
            fields.append(("presented", String(presented)))
        }
        var text = "token call \(call): \(answer.rawValue)"
        if case .success = outcome {
            fields.append(("pair", String(run.server.newest)))
            text += ", pair \(run.server.newest) issued"
        }
        if answer == .reuse { text += " (a spent refresh token presented again: the family is revoked)" }
        run.note("token-call", process: process.id, fields, text: text)
        try? await run.clock.sleep(until: run.clock.now + step.after)
        run.server.sendIssued()
        await process.waitWhileFrozen(run.clock)
        guard process.isLive(incarnation) else { throw RefreshFailure("the process was killed") }
        return try outcome.get()
    }
}

/// One incarnation's view of the shared store, with a real client's timing: a call waits while
/// the store is paused, and its client gives up at `connect-timeout` (the call is then never run:
/// Redis drops a paused command whose connection closed); while the store answers late, the call
/// runs at once and its client gives up at `connect-timeout` all the same. A publication is never
/// given up on (it waits out a pause and a late answer). A frozen process sends and receives
/// nothing until it thaws, and a killed one goes silent (it releases nothing and hears nothing).
struct FleetCoordinator: SessionCoordinator {
    let inner: any SessionCoordinator
    let run: FleetRun
    let process: SimulatedProcess
    let incarnation: Int

    private var live: Bool { process.isLive(incarnation) }
    private static let dead = "the process was killed"
    private var gaveUp: String { "the store did not answer within \(run.connectTimeout.policyText) (connect-timeout)" }

    /// Runs `call` as a client that gives up at `connect-timeout`: nil when it gave up (the call
    /// never ran when the store was paused; it ran when the store was only slow).
    private func client<R: Sendable>(_ call: () async -> R) async -> R? {
        await process.waitWhileFrozen(run.clock)
        let now = run.clock.now
        if run.pausedUntil > now {
            guard run.pausedUntil - now <= run.connectTimeout else {
                try? await run.clock.sleep(until: now + run.connectTimeout)
                return nil
            }
            await run.waitWhilePaused()
        }
        let result = await call()
        let late = run.slowUntil - run.clock.now
        if late > .zero {
            try? await run.clock.sleep(until: run.clock.now + min(late, run.connectTimeout))
            if late > run.connectTimeout { return nil }
        }
        await process.waitWhileFrozen(run.clock)
        return result
    }

    func start(local: Credentials?, updates: @escaping @Sendable (SessionUpdate) -> Void) async -> SharedSession? {
        await process.waitWhileFrozen(run.clock)
        await run.waitWhilePaused()
        guard live else { return nil }
        let process = process
        let incarnation = incarnation
        let clock = run.clock
        let joined = await inner.start(local: local) { update in
            guard process.isLive(incarnation) else { return }
            process.deliver(at: clock.now) { if process.isLive(incarnation) { updates(update) } }
        }
        await process.waitWhileFrozen(run.clock)
        return joined
    }

    func beginRefresh(_ request: RefreshTurnRequest) async -> RefreshTurn {
        guard live else { return .unavailable(Self.dead) }
        // As a real client: a question it gave up on is asked again under the same asker, so a
        // lease the store granted it is found rather than waited out.
        let asker = process.takeAsker()
        guard
            let turn = await client({
                if let asking = inner as? any AskingCoordinator {
                    return await asking.beginRefresh(request, asker: asker)
                }
                return await inner.beginRefresh(request)
            })
        else {
            process.abandon(asker)
            return .unavailable(gaveUp)
        }
        guard live else { return .unavailable(Self.dead) }
        if case .lease = turn { process.holdsLease(true, incarnation: incarnation) }
        return turn
    }

    func publish(_ credentials: Credentials, with lease: RefreshLease) async -> PublishResult {
        // Never given up on: it waits out a pause (and runs first when it ends) and a late answer.
        await process.waitWhileFrozen(run.clock)
        await run.waitWhilePaused()
        guard live else { return .unavailable(Self.dead) }
        let result = await inner.publish(credentials, with: lease)
        let late = run.slowUntil - run.clock.now
        if late > .zero { try? await run.clock.sleep(until: run.clock.now + late) }
        await process.waitWhileFrozen(run.clock)
        if case .unavailable = result {} else { process.holdsLease(false, incarnation: incarnation) }
        return result
    }

    func endRefresh(_ lease: RefreshLease, failure: String?) async {
        await endRefresh(lease, failure: failure, retryAfter: nil)
    }

    func endRefresh(_ lease: RefreshLease, failure: String?, retryAfter: Date?) async {
        guard live else { return }
        _ = await client { await inner.endRefresh(lease, failure: failure, retryAfter: retryAfter) }
        process.holdsLease(false, incarnation: incarnation)
    }

    func noteAccepted(generation: UInt64) async {
        guard live else { return }
        _ = await client { await inner.noteAccepted(generation: generation) }
    }

    func publishLogout(until: Date, reason: String) async {
        guard live else { return }
        _ = await client { await inner.publishLogout(until: until, reason: reason) }
    }

    func publishLogout(until: Date, reason: String, epoch: UInt64) async {
        guard live else { return }
        _ = await client { await inner.publishLogout(until: until, reason: reason, epoch: epoch) }
    }

    func publishSignIn(_ credentials: Credentials) async -> SharedSession? {
        guard live else { return nil }
        return await client({ await inner.publishSignIn(credentials) }) ?? nil
    }

    func stop() { inner.stop() }
}

/// One process's view of the fleet's clock: a sleep (an engine timer) never ends while the
/// process is frozen; it ends when it thaws, as every timer of a process given SIGCONT fires at once.
struct FreezableClock: PolicyClock {
    let base: VirtualClock
    let process: SimulatedProcess

    var now: Duration { base.now }
    var date: Date { base.date }

    func sleep(until deadline: Duration) async throws {
        try await base.sleep(until: deadline)
        while process.isFrozen(at: base.now) {
            try Task.checkCancellation()
            await process.waitWhileFrozen(base)
        }
    }
}

/// One process's transport: an answer that arrives while the process is frozen is read when it thaws.
struct FreezableTransport: Transport {
    let inner: ScriptedTransport
    let process: SimulatedProcess
    let clock: VirtualClock

    func send(_ request: HTTPRequest) async throws -> HTTPResponse {
        let response = try await inner.send(request)
        await process.waitWhileFrozen(clock)
        return response
    }
}
