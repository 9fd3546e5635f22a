import Foundation
import ResponsePolicy
import ResponsePolicyCurl
import ResponsePolicyURLSession

/// `policy fetch --policy FILE [--credentials FILE] [--concurrency N] [--count M] [-X METHOD]
/// [-H 'K: V']... [-d BODY] URL`
///
/// Real HTTP through the engine and the URLSession transport: the URL is sent `M` times, `N` at
/// once. One line per request as it ends, then a summary:
///
/// ```
/// r1 200 code=0 attempts=2 41ms delivered
/// r2 200 code=202 attempts=1 12ms logged-out: logged out by rule 'forced-logout'; new requests fail until …
/// summary: 2 requests: 1 delivered, 0 failed, 1 logged out; 1 refresh, 1 logout, 3 attempts; 60ms
/// ```
///
/// Exit 0 only when every request was delivered and every token a refresh returned was saved, 1
/// otherwise; 64 for usage errors; 66 when the policy or the credentials file cannot be read; 65
/// when the credentials file is malformed; 73 when the policy can refresh and the credentials
/// file's folder cannot take a new file (nothing is sent then).
/// Tokens are never printed: lines carry statuses, business codes and the engine's reasons.
enum FetchCommand {
    static let policy = Option.required(["--policy"], "file", help: "The policy file (required).")
    static let credentials = Option.value(
        ["--credentials"], "file",
        help: "Credentials JSON; rotated tokens are written back (mode 0600). Default: store: file.")
    static let concurrency = Option.positiveInteger(
        ["--concurrency"], "n", help: "Requests in flight at once; 1 by default.")
    static let count = Option.positiveInteger(["--count"], "m", help: "How many times to send the URL; 1 by default.")
    static let method = Option.value(["-X", "--request"], "method", help: "The method; GET by default, POST with -d.")
    static let header = Option.repeated(
        ["-H", "--header"], "header", help: "A request header, 'Name: value'. Repeatable.")
    static let data = Option.value(["-d", "--data"], "body", help: "The request body, sent as given.")
    static let maxBody = Option.value(
        ["--max-body"], "size", help: "The largest response body read (bytes, or with KiB, MiB, GiB); 64MiB by default."
    )
    static let verbose = Option.flag(["--verbose"], help: "Also print every engine event as a JSON line on stderr.")
    /// The HTTP client under the engine: libcurl's multi interface by default on Linux (bodies on
    /// kept-alive connections, HTTP/2 multiplexing), URLSession elsewhere.
    enum TransportChoice: String, CaseIterable, Sendable {
        case urlsession, curl

        static var platformDefault: TransportChoice {
            #if os(Linux)
                .curl
            #else
                .urlsession
            #endif
        }
    }
    static let transport = Option.choice(
        ["--transport"], "transport", default: TransportChoice.platformDefault,
        help: "urlsession or curl (libcurl's multi interface); curl by default on Linux.")

    static let spec = CommandSpec(
        name: "fetch",
        summary: "Send real HTTP requests through the engine and libcurl (the default on Linux) or URLSession.",
        arguments: [.init(name: "URL", help: "The http:// or https:// URL to request.")],
        options: [
            policy.declaration, credentials.declaration, concurrency.declaration, count.declaration,
            method.declaration, header.declaration, data.declaration, maxBody.declaration, transport.declaration,
            verbose.declaration, FetchMetrics.file.declaration, FetchMetrics.listen.declaration,
        ],
        exitCodes: [
            (0, "every request was delivered"),
            (
                1,
                "a request was not delivered, a refreshed token could not be saved or published to the coordination store, "
                    + "or the policy has errors"
            ),
            (64, "usage error"), (65, "the credentials file is malformed"),
            (66, "the policy or the credentials file cannot be read"),
            (
                73,
                "the credentials file's folder cannot be written (a refresh would lose it), or the --metrics file or "
                    + "the --metrics-listen address cannot be had, so nothing was sent"
            ),
        ])

    /// What the command line asked for.
    struct Invocation {
        var policyPath: String
        var credentialsPath: String?
        var concurrency: Int
        var count: Int
        var request: HTTPRequest
        var verbose: Bool
        var maxBody = URLSessionTransport.defaultMaxBody
        var transport = TransportChoice.platformDefault
    }

    static func run(_ arguments: ParsedArguments, output: CommandOutput) async throws(UsageError) -> Int32 {
        let invocation = try parse(arguments)
        let (loaded, code) = loadPolicy(
            invocation.policyPath, catalog: PluginCatalog(), output: output, owner: .userOrRoot)
        guard let policy = loaded else { return code }

        var store: ReportingStore?
        if let path = invocation.credentialsPath ?? policyStorePath(policy) {
            switch openStore(path, output: output) {
            case .success(let opened): store = opened
            case .failure(let failure):
                output.stderr(TerminalText.line("error: \(failure.error)"))
                return failure.code
            }
        }
        // A refresh spends the old refresh token (rotation): find out before sending anything
        // whether the new one could be saved, rather than lose the session on the way.
        if let store, canRefresh(policy) {
            do {
                try store.checkWritable()
            } catch {
                // The `problem` event the engine would emit at the save, as `--verbose` prints events.
                if invocation.verbose {
                    var event = PolicyEvent(.problem, time: .zero)
                    event.reason = "the credential store could not be written (\(error))"
                    output.stderr(event.jsonLine + "\n")
                }
                output.stderr(
                    TerminalText.line(
                        "error: \(error); a refresh would spend the refresh token and its replacement could not be "
                            + "saved, so nothing was sent (make the folder writable, or give another --credentials file)"
                    ))
                return ExitCode.cannotCreate
            }
        }

        let metrics: FetchMetrics?
        switch FetchMetrics.start(arguments, policy: policy, output: output) {
        case .success(let started): metrics = started
        case .failure(let failure): return failure.code
        }

        let recorder = FetchRecorder()
        var options = PolicyEngine.Options()
        options.userAgent = PolicyCommand.userAgent
        options.observers = [recorder]
        if let metrics { options.observers.append(metrics.metrics) }
        if invocation.verbose {
            let stderr = output.stderr
            options.observers.append(EventPrinter(write: stderr))
        }
        let registry = PluginRegistry()
        let engine = PolicyEngine(
            policy: policy,
            transport: makeTransport(invocation, timeout: transportTimeout(for: policy)),
            plugins: registry,
            credentials: store, options: options)
        metrics?.metrics.attach(engine)
        // A plugin that cannot be made here (an unset variable, a missing command) fails every refresh: say so first.
        var printed: [String] = []
        for problem in engine.problems where problem != engine.coordinationWarning {
            output.stderr(TerminalText.line(problem.diagnostic(file: invocation.policyPath).description))
            printed.append(problem.reason)
        }
        // The store's trust (a remote Redis without signing-key-env): said before anything is sent.
        if let warning = engine.coordinationWarning {
            output.stderr(TerminalText.line("warning: coordination: \(warning.reason)"))
            printed.append(warning.reason)
        }
        let started = ContinuousClock.now
        let results = await sendAll(invocation, engine: engine, recorder: recorder, output: output)
        let elapsed = ContinuousClock.now - started
        // The engine refreshes and calls the logout plugin in the background: let a refresh that
        // a logout overtook end and save its rotated tokens (bounded by refresh.timeout), and an
        // `http` logout POST go out (bounded by the plugin's own timeout, 5s by default), before
        // the process ends.
        await engine.waitForBackgroundWork()
        // A pair or a logout only this process knows reaches the fleet before it exits, or is named
        // (issue 30, case 4): waited for, up to refresh.timeout, and said.
        var unpublished = engine.unpublished
        if !unpublished.isEmpty {
            let bound = policy.refresh.timeout
            output.stderr(
                "policy: waiting up to \(bound.policyText) to publish \(unpublished.joined(separator: " and ")) to "
                    + "the coordination store before exiting\n")
            unpublished = await engine.publishPending(timeout: bound)
            for item in unpublished {
                var text = "error: \(item) could not be published to the coordination store before exiting"
                if item == "a new token pair", let path = store?.credentialsFilePath {
                    text += "; it is saved in '\(path)', and the next run with that file publishes it first"
                }
                output.stderr(text + "\n")
            }
        }
        let metricsWritten = metrics?.finish(output: output) ?? true

        let summary = recorder.summary()
        let delivered = results.filter(\.delivered).count
        let loggedOut = results.filter(\.loggedOut).count
        let failed = results.count - delivered - loggedOut
        output.stdout(
            "summary: \(plural(results.count, "request")): \(delivered) delivered, \(failed) failed, "
                + "\(loggedOut) logged out; \(plural(summary.refreshes, "refresh", "refreshes")), "
                + "\(plural(summary.logouts, "logout")), \(plural(summary.attempts, "attempt")); "
                + "\(milliseconds(elapsed))ms\n")
        if let note = recorder.logoutNote(until: results.compactMap(\.loggedOutUntil).max()) {
            output.stderr(TerminalText.line("policy: \(note)"))
        }
        // Printed like plugin problems, with or without --verbose: a fleet that did not coordinate
        // must not look like one that did (issue 19).
        // Those not printed above: a coordinator that failed after that (its start runs in the
        // background) was in `engine.problems` by now but had not been printed.
        for problem in recorder.coordinationProblems where !printed.contains(where: { problem.contains($0) }) {
            output.stderr(TerminalText.line("warning: \(problem)"))
        }
        // Tokens the token endpoint issued that could not be saved are a lost session for the
        // next run: never a quiet exit 0.
        let lost = store?.failures ?? []
        for failure in lost { output.stderr(TerminalText.line("error: \(failure)")) }
        return delivered == results.count && lost.isEmpty && unpublished.isEmpty && metricsWritten
            ? ExitCode.success : ExitCode.failure
    }

    /// Whether the policy can refresh at all (some scope names a refresh plugin), so a store
    /// must be able to take the new tokens.
    private static func canRefresh(_ policy: Policy) -> Bool {
        policy.graph.scopes.contains { $0.refresh.plugin != nil }
    }

    // MARK: - Arguments

    static func parse(_ arguments: ParsedArguments) throws(UsageError) -> Invocation {
        let policyPath = arguments[policy]
        guard let urlText = arguments.positional.first else {
            throw UsageError(message: "Missing expected argument 'URL'")
        }
        guard arguments.positional.count == 1 else {
            throw UsageError(message: "Unexpected argument '\(arguments.positional[1])'")
        }
        guard let url = URL(string: urlText), let scheme = url.scheme?.lowercased(),
            scheme == "http" || scheme == "https", let host = url.host, !host.isEmpty
        else {
            throw UsageError(message: "Invalid URL '\(urlText)'; expected an http:// or https:// URL")
        }
        let concurrency = arguments[Self.concurrency] ?? 1
        let count = arguments[Self.count] ?? 1

        var headers = HTTPHeaders()
        for field in arguments[header] {
            // The value may be a secret (`-H 'Authorization Bearer …'` without its colon): an error
            // names the header by its first word only.
            let firstWord = String(field.prefix { isToken(String($0)) }.prefix(64))
            guard let colon = field.firstIndex(of: ":") else {
                throw UsageError(
                    message: "Invalid header '\(firstWord)': no ':' after its name; write -H 'Name: value'")
            }
            let name = field[..<colon].trimmingCharacters(in: .whitespaces)
            guard isToken(name) else {
                throw UsageError(message: "Invalid header name '\(firstWord)'; write -H 'Name: value'")
            }
            headers.add(name, field[field.index(after: colon)...].trimmingCharacters(in: .whitespaces))
        }
        let body = arguments[data].map { Data($0.utf8) }
        let method = (arguments[Self.method] ?? (body == nil ? "GET" : "POST")).uppercased()
        guard isToken(method) else { throw UsageError(message: "Invalid method '\(method)'") }
        if method == "GET", body != nil {
            throw UsageError(message: "A GET request cannot have a body (-d); add -X POST or another method")
        }
        var invocation = Invocation(
            policyPath: policyPath, credentialsPath: arguments[credentials], concurrency: concurrency,
            count: count, request: HTTPRequest(method: method, url: url, headers: headers, body: body),
            verbose: arguments[verbose])
        invocation.transport = arguments[transport]
        if let text = arguments[maxBody] {
            guard let size = byteSize(text) else {
                throw UsageError(
                    message:
                        "Invalid value '\(text)' for '--max-body <size>'; expected bytes, or a number with KiB, MiB or GiB"
                )
            }
            invocation.maxBody = size
        }
        return invocation
    }

    static func makeTransport(_ invocation: Invocation, timeout: Duration) -> any Transport {
        switch invocation.transport {
        case .urlsession: URLSessionTransport(timeout: timeout, maxBody: invocation.maxBody)
        case .curl: CurlTransport(timeout: timeout, maxBody: invocation.maxBody)
        }
    }

    /// `1048576`, `512KiB`, `64MiB`, `1GiB` (also `K`, `M`, `G`, `KB`, `MB`, `GB` as binary units): positive.
    static func byteSize(_ text: String) -> Int? {
        let units: [(String, Int)] = [
            ("KiB", 1 << 10), ("MiB", 1 << 20), ("GiB", 1 << 30), ("KB", 1 << 10), ("MB", 1 << 20), ("GB", 1 << 30),
            ("K", 1 << 10), ("M", 1 << 20), ("G", 1 << 30), ("B", 1),
        ]
        let trimmed = text.trimmingCharacters(in: .whitespaces)
        let unit = units.first { trimmed.uppercased().hasSuffix($0.0.uppercased()) }
        let number = trimmed.dropLast(unit?.0.count ?? 0).trimmingCharacters(in: .whitespaces)
        guard let value = Int(number), value > 0 else { return nil }
        let (product, overflow) = value.multipliedReportingOverflow(by: unit?.1 ?? 1)
        return overflow ? nil : product
    }

    /// A positive whole number option; `nil` when absent.
    /// An RFC 9110 token: what a method or a header name must be.
    private static func isToken(_ text: String) -> Bool {
        !text.isEmpty
            && text.unicodeScalars.allSatisfy { scalar in
                scalar.isASCII && scalar.value > 0x20 && scalar.value < 0x7F
                    && !"\"(),/:;<=>?@[\\]{}".unicodeScalars.contains(scalar)
            }
    }

    // MARK: - Credentials

    /// The policy's `store: { use: file, with: { path } }`, when it names one.
    private static func policyStorePath(_ policy: Policy) -> String? {
        guard policy.store.name == "file" else { return nil }
        return policy.store.options["path"]?.string
    }

    private struct StoreFailure: Error {
        var error: String
        var code: Int32
    }

    /// The store for `path`, after checking its file can be read: a file that is missing or
    /// malformed would otherwise make every request go out unsigned.
    private static func openStore(_ path: String, output: CommandOutput) -> Result<ReportingStore, StoreFailure> {
        let stderr = output.stderr
        let store = FileCredentialStore(path: path, warn: { stderr(TerminalText.line("warning: \($0)")) })
        do {
            guard try store.load() != nil else {
                return .failure(
                    StoreFailure(error: "cannot read '\(path)': \(PolicyError.noSuchFile)", code: ExitCode.noInput))
            }
        } catch let error as CredentialStoreError {
            if case .malformed = error { return .failure(StoreFailure(error: "\(error)", code: ExitCode.dataError)) }
            return .failure(StoreFailure(error: "\(error)", code: ExitCode.noInput))
        } catch {
            return .failure(StoreFailure(error: "cannot read '\(path)'", code: ExitCode.noInput))
        }
        return .success(ReportingStore(store))
    }

    // MARK: - Sending

    struct RequestResult: Sendable {
        var delivered: Bool
        /// The cooldown's end, when the request ended logged out.
        var loggedOutUntil: Date?

        var loggedOut: Bool { loggedOutUntil != nil }
    }

    /// Sends the request `count` times, `concurrency` at once, printing a line as each ends.
    private static func sendAll(
        _ invocation: Invocation, engine: PolicyEngine, recorder: FetchRecorder, output: CommandOutput
    ) async -> [RequestResult] {
        let request = invocation.request
        let count = invocation.count
        return await withTaskGroup(of: RequestResult.self) { group in
            var next = 1
            func start() {
                var copy = request
                copy.id = "r\(next)"
                next += 1
                group.addTask { await sendOne(copy, engine: engine, recorder: recorder, output: output) }
            }
            while next <= min(invocation.concurrency, count) { start() }
            var results: [RequestResult] = []
            while let result = await group.next() {
                results.append(result)
                if next <= count { start() }
            }
            return results
        }
    }

    private static func sendOne(
        _ request: HTTPRequest, engine: PolicyEngine, recorder: FetchRecorder, output: CommandOutput
    ) async -> RequestResult {
        let id = request.id ?? "?"
        let started = ContinuousClock.now
        let outcome: Result<HTTPResponse, PolicyEngineError>
        do {
            outcome = .success(try await engine.send(request))
        } catch {
            outcome = .failure(error)
        }
        let ms = milliseconds(ContinuousClock.now - started)
        let record = recorder.record(for: id)
        var line = id
        switch outcome {
        case .success(let response):
            line += " \(response.status) code=\(record.code ?? "-") attempts=\(record.attempts) \(ms)ms delivered"
        case .failure(let error):
            let status = record.status.map(String.init) ?? "-"
            line += " \(status) code=\(record.code ?? "-") attempts=\(record.attempts) \(ms)ms "
            if case .loggedOut(let until, _) = error {
                line += "logged-out: " + (recorder.logoutNote(until: until) ?? error.description)
            } else if error == .cancelled {
                line += "cancelled"
            } else {
                line += "failed: \(error)"
            }
        }
        // The code and the reasons are the server's or the store's words: one line, whatever they hold.
        output.stdout(TerminalText.line(line))
        switch outcome {
        case .success: return RequestResult(delivered: true)
        case .failure(.loggedOut(let until, _)): return RequestResult(delivered: false, loggedOutUntil: until)
        case .failure: return RequestResult(delivered: false)
        }
    }
}

private func plural(_ count: Int, _ one: String, _ many: String? = nil) -> String {
    "\(count) " + (count == 1 ? one : many ?? one + "s")
}

private func milliseconds(_ duration: Duration) -> Int64 {
    Int64((duration.seconds * 1000).rounded())
}

/// A file store that remembers why saves failed, so `fetch` can say the rotated tokens were not
/// written back (the engine itself goes on with them in memory).
final class ReportingStore: CredentialStore, FileBackedCredentialStore, SessionStampingStore {
    private let base: FileCredentialStore
    private let failed = Locked<[String]>([])

    init(_ base: FileCredentialStore) { self.base = base }

    /// The file, for a `file` coordinator: `--credentials` is the file the processes share.
    var credentialsFilePath: String { base.credentialsFilePath }

    var failures: [String] { failed.withLock { $0 } }

    func load() throws -> Credentials? { try base.load() }

    /// With the fleet's generation and epoch (issue 30): a restarted `fetch` never takes the fleet
    /// backwards, and publishes a pair a previous run could not.
    func loadSaved() throws -> SavedCredentials? { try base.loadSaved() }

    func save(_ saved: SavedCredentials) throws { try recordingFailure { try base.save(saved) } }

    func checkWritable() throws { try base.checkWritable() }

    func save(_ credentials: Credentials) throws { try recordingFailure { try base.save(credentials) } }

    /// Runs a save; a failure is remembered for the run's end (a lost session is never a quiet
    /// exit 0) and thrown on.
    private func recordingFailure(_ save: () throws -> Void) throws {
        do {
            try save()
        } catch {
            failed.withLock {
                $0.append(
                    "\(error); the tokens the last refresh returned were not saved, so the next run may "
                        + "find its session ended (the old refresh token is spent)")
            }
            throw error
        }
    }
}

/// Collects what `fetch` prints from the engine's events: attempts (`send` events) and the
/// outcome's status and code per request, refresh calls, logouts.
final class FetchRecorder: PolicyObserver {
    struct Record {
        var attempts = 0
        var status: Int?
        var code: String?
    }

    struct Summary {
        var refreshes = 0
        var logouts = 0
        var attempts = 0
    }

    private struct State {
        var records: [String: Record] = [:]
        var summary = Summary()
        /// The last logout's rule (empty when a failed refresh logged out).
        var logoutRule: String?
        /// Why the last refresh failed.
        var refreshFailure: String?
        /// The last logout's reason.
        var logoutReason: String?
        /// Coordination problems reported during the run, each once, in order.
        var coordinationProblems: [String] = []
    }

    private let state = Locked(State())

    func observe(_ event: PolicyEvent) {
        state.withLock { state in
            switch event.kind {
            case .send:
                state.summary.attempts += 1
                if let id = event.request { state.records[id, default: Record()].attempts += 1 }
            case .outcome:
                if let id = event.request {
                    state.records[id, default: Record()].status = event.status
                    state.records[id, default: Record()].code = event.code
                }
            case .refreshStart:
                // A refresh stopped by `limit` makes no call; its start event says so.
                if event.reason == nil { state.summary.refreshes += 1 }
            case .refreshRetry:
                // The plugin is called again: one more token call.
                state.summary.refreshes += 1
            case .refreshEnd:
                if event.ok == false { state.refreshFailure = event.reason }
            case .logout:
                state.summary.logouts += 1
                // A logout without a rule: a failed refresh, the host, or another process.
                state.logoutRule = event.rule ?? ""
                state.logoutReason = event.reason
            case .problem:
                if let reason = event.reason, reason.hasPrefix("coordination"),
                    !state.coordinationProblems.contains(reason), state.coordinationProblems.count < 20
                {
                    state.coordinationProblems.append(reason)
                }
            default:
                break
            }
        }
    }

    func record(for id: String) -> Record {
        state.withLock { $0.records[id] ?? Record() }
    }

    func summary() -> Summary {
        state.withLock { $0.summary }
    }

    /// The coordination problems reported during the run.
    var coordinationProblems: [String] { state.withLock { $0.coordinationProblems } }

    /// `logged out by rule 'forced-logout'; new requests fail until 2025-01-31T12:00:20Z`, or
    /// `nil` when no logout happened in this run.
    func logoutNote(until: Date?) -> String? {
        let (rule, refreshFailure, reason) = state.withLock { ($0.logoutRule, $0.refreshFailure, $0.logoutReason) }
        guard let rule else { return nil }
        var note: String
        if rule.isEmpty, reason == LogoutReason.elsewhereWithoutReason {
            note = LogoutReason.elsewhere(LogoutReason.elsewhereWithoutReason).sentence
        } else if rule.isEmpty, let reason, !reason.hasPrefix(PolicyEngine.refreshFailedReason) {
            // Heard from another process sharing the session, or the host's own logout.
            note = "logged out: \(reason)"
        } else if rule.isEmpty {
            note = "logged out because the token refresh failed"
            if let refreshFailure { note += ": \(refreshFailure)" }
        } else {
            note = "logged out by rule '\(rule)'"
        }
        if let until { note += "; new requests fail until \(ISO8601DateFormatter().string(from: until))" }
        return note
    }
}

/// `--verbose`: every event as a JSON line.
struct EventPrinter: PolicyObserver {
    let write: @Sendable (String) -> Void

    func observe(_ event: PolicyEvent) { write(event.jsonLine + "\n") }
}

/// The transport's own timeout for `policy fetch`: an outer bound that never undercuts the
/// policy's `attempt-timeout` (the engine's attempt timeout governs), 60 s or a second more than
/// the longest one; a scope without one is bounded by its deadline, or by a day.
func transportTimeout(for policy: Policy) -> Duration {
    var longest = Duration.seconds(60)
    for scope in policy.graph.scopes {
        let bound = scope.retry.attemptTimeout ?? scope.retry.deadline ?? .seconds(86_400)
        longest = max(longest, bound + .seconds(1))
    }
    return longest
}
