import Foundation
import ResponsePolicy
import ResponsePolicyTesting

/// `policy simulate FILE --script SCRIPT [--format text|json]`
enum SimulateCommand {
    enum Format: String, CaseIterable, Sendable { case text, json }

    static let script = Option.required(
        ["--script"], "script", help: "The simulation script (YAML, see docs/commands.md).")
    static let format = Option.choice(
        ["--format"], "format", default: Format.text,
        help: "text (default) or json: one event per line, then a summary.")
    static let plugin = Option.plugin()

    static let spec = CommandSpec(
        name: "simulate",
        summary: "Run the real engine against a scripted server on a virtual clock (no sleeping, no network).",
        arguments: [
            .init(
                name: "FILE",
                help: "The policy file; it wins over the script's 'policy:', which is used when FILE is left out.",
                optional: true)
        ],
        options: [script.declaration, format.declaration, plugin.declaration],
        exitCodes: [
            (0, "the simulation ran to its end"),
            (1, "the policy or the script has errors, or the run was stopped (a bound was reached)"),
            (64, "usage error"), (66, "the policy or the script cannot be read"),
        ])

    static func run(_ arguments: ParsedArguments, output: CommandOutput) async throws(UsageError) -> Int32 {
        let format = arguments[Self.format]
        let scriptPath = arguments[script]
        // The policy named on the command line wins over the script's own `policy:` (as with
        // `policy test --policy`); which one ran is a note on stderr, beside the warning about a
        // script naming another, so stdout stays the events and the summary in either format.
        let named = scriptPolicy(scriptPath)
        let path: String
        if arguments.positional.isEmpty, let named {
            path = normalized(named.path)
        } else {
            path = try singleFile(arguments)
            if let named, !samePath(named.path, path) {
                let at = named.range.map { "\(scriptPath):\($0.start.line):\($0.start.column)" } ?? scriptPath
                output.stderr(
                    "\(at): warning: the script names policy '\(named.written)'; it runs with '\(path)' "
                        + "given on the command line\n")
            }
        }
        let catalog = try catalog(from: arguments[plugin])
        let (loaded, code) = loadPolicy(path, catalog: catalog, output: output)
        guard let policy = loaded else { return code }
        let ran = "policy '\(path)' (name '\(policy.name)')"
        output.stderr("note: running \(ran)\n")

        let bytes: [UInt8]
        do {
            bytes = try Policy.readFile(scriptPath, limits: .default, owner: .anyone)
        } catch {
            output.stderr("error: cannot read '\(scriptPath)': \(error.readReason)\n")
            return ExitCode.noInput
        }
        let (parsed, diagnostics) = SimulationScript.parse(bytes, file: scriptPath)
        for diagnostic in diagnostics { output.stderr(diagnostic.description + "\n") }
        guard let script = parsed else { return ExitCode.failure }

        if script.fleet != nil {
            return await runFleet(policy: policy, script: script, json: format == .json, output: output)
        }
        let directory = URL(fileURLWithPath: scriptPath).deletingLastPathComponent().path
        // Events go out as they happen (buffered), none is kept: memory does not grow with the run.
        let writer = BufferedWriter(output.stdout)
        let json = format == .json
        // One column width for every line, from the script's ids (known before any event).
        let width = max(8, script.requests.map(\.id.count).max() ?? 0)
        let result: Simulator.Result
        do {
            result = try await Simulator.run(
                policy: policy, script: script,
                loadPolicy: { file throws(PolicyError) -> Policy in
                    try Policy.load(
                        path: file.hasPrefix("/") ? file : directory + "/" + file, plugins: catalog,
                        limits: YAMLLimits(maxFileBytes: SimulationScript.maxReloadPolicyBytes))
                },
                onEvent: { event in writer.write((json ? event.jsonLine : text(event, idWidth: width)) + "\n") })
        } catch {
            writer.flush()
            output.stderr("error: \(error)\n")
            return ExitCode.failure
        }
        writer.flush()
        if format == .json {
            output.stdout(result.summary.jsonLine + "\n")
        } else {
            let s = result.summary
            output.stdout(
                "summary: \(s.requests) requests: \(s.delivered) delivered, \(s.failed) failed, \(s.loggedOut) logged out; "
                    + "\(s.refreshes) refresh\(s.refreshes == 1 ? "" : "es"), \(s.logouts) logout\(s.logouts == 1 ? "" : "s"), "
                    + "\(s.attempts) attempt\(s.attempts == 1 ? "" : "s")\n")
        }
        return ExitCode.success
    }

    /// Runs a fleet script: each line names its process, then each process's summary and the
    /// fleet's (docs/commands.md, "Fleet scripts").
    static func runFleet(policy: Policy, script: SimulationScript, json: Bool, output: CommandOutput) async -> Int32 {
        let writer = BufferedWriter(output.stdout)
        let processes = script.fleet?.processes ?? []
        let processWidth = max(4, processes.map(\.id.count).max() ?? 0)
        let requestWidth = max(8, processes.flatMap { $0.requests.map(\.id.count) }.max() ?? 0)
        let result: FleetSimulator.Result
        do {
            result = try await FleetSimulator.run(policy: policy, script: script) { line in
                writer.write((json ? fleetJSON(line) : fleetText(line, processWidth, requestWidth)) + "\n")
            }
        } catch {
            writer.flush()
            output.stderr("error: \(error)\n")
            return ExitCode.failure
        }
        writer.flush()
        let summary = result.summary
        if json {
            for process in summary.processes { output.stdout(FleetSimulator.Summary.jsonLine(process) + "\n") }
            output.stdout(summary.jsonLine + "\n")
            return ExitCode.success
        }
        for process in summary.processes {
            output.stdout("summary \(process.process): " + summaryText(process.summary) + "\n")
        }
        let t = summary.total
        func plural(_ n: Int, _ word: String, _ suffix: String = "s") -> String {
            "\(n) \(word)\(n == 1 ? "" : suffix)"
        }
        output.stdout(
            "fleet: \(plural(summary.processes.count, "process", "es")), \(plural(t.requests, "request")): "
                + "\(t.delivered) delivered, \(t.failed) failed, \(t.loggedOut) logged out"
                + (t.cancelled > 0 ? ", \(t.cancelled) cancelled; " : "; ")
                + "\(plural(summary.tokenCalls, "token call")), \(plural(summary.reuses, "reuse")), "
                + "\(plural(t.logouts, "logout")), \(plural(summary.leases, "lease")), "
                + "\(plural(summary.restarts, "restart")), \(plural(summary.kills, "kill"))\n")
        return ExitCode.success
    }

    /// `N requests: D delivered, …; R refreshes, L logouts, A attempts`.
    static func summaryText(_ s: Simulator.Summary) -> String {
        "\(s.requests) requests: \(s.delivered) delivered, \(s.failed) failed, \(s.loggedOut) logged out"
            + (s.cancelled > 0 ? ", \(s.cancelled) cancelled; " : "; ")
            + "\(s.refreshes) refresh\(s.refreshes == 1 ? "" : "es"), \(s.logouts) logout\(s.logouts == 1 ? "" : "s"), "
            + "\(s.attempts) attempt\(s.attempts == 1 ? "" : "s")"
    }

    /// A fleet line as JSON: an engine's event with `"process"` after `"t"`, or a fleet note.
    static func fleetJSON(_ line: FleetSimulator.Line) -> String {
        switch line {
        case .note(let note): return note.jsonLine
        case .engine(let process, let event):
            let json = event.jsonLine
            guard let comma = json.firstIndex(of: ",") else { return json }
            return String(json[..<comma]) + ",\"process\":" + PolicyEvent.quote(process) + String(json[comma...])
        }
    }

    /// A fleet line as text: the time, the process, then the line as a one-process run writes it.
    static func fleetText(_ line: FleetSimulator.Line, _ processWidth: Int, _ requestWidth: Int) -> String {
        func pad(_ text: String, _ width: Int) -> String {
            text.padding(toLength: max(width, text.count), withPad: " ", startingAt: 0)
        }
        switch line {
        case .note(let note):
            return String(format: "%9.3fs", note.time.seconds) + "  " + pad(note.process ?? "fleet", processWidth)
                + "  " + pad("-", requestWidth) + "  " + note.text
        case .engine(let process, let event):
            let text = text(event, idWidth: requestWidth)
            let time = text.prefix(10)
            return String(time) + "  " + pad(process, processWidth) + String(text.dropFirst(10))
        }
    }

    /// The policy a script names with `policy:`: as written, resolved against the script's
    /// folder, and where; `nil` when it names none (or cannot be read: the run reports that).
    static func scriptPolicy(_ scriptPath: String) -> (written: String, path: String, range: SourceRange?)? {
        guard let bytes = try? Policy.readFile(scriptPath, limits: .default, owner: .anyone) else { return nil }
        let parsed = Policy.parse(bytes: bytes, limits: .default)
        // `policy: 1` is a schema version, not a path: the script's own parse reports it.
        guard SimulationScript.versionInsteadOfPolicyPath(parsed.root, file: nil) == nil else { return nil }
        let (expectations, _) = SimulationExpectations.parse(parsed, file: nil)
        guard let named = expectations.policy else { return nil }
        if named.hasPrefix("/") { return (named, named, expectations.policyRange) }
        let directory = folder(of: scriptPath)
        return (named, directory == "." ? named : directory + "/" + named, expectations.policyRange)
    }

    /// One event as a readable line: `  0.050s  a  response #1: 200 code 1401 -> token-expired: refresh`.
    ///
    /// Every line says why where the engine gave a reason: a retry refused by the budget or the
    /// method, the deadline, what cancelled a request, the failed refresh behind a logout.
    static func text(_ event: PolicyEvent, idWidth: Int = 8) -> String {
        let time = String(format: "%9.3fs", event.time.seconds)
        let id = event.request ?? "-"
        let who = id.padding(toLength: max(idWidth, id.count), withPad: " ", startingAt: 0)
        var what: String
        switch event.kind {
        case .send: what = "send #\(event.attempt ?? 0)"
        case .response:
            what = "response #\(event.attempt ?? 0): "
            if let status = event.status { what += "\(status)" }
            if let code = event.code { what += " code \(code)" }
            if let error = event.error { what += "\(error.rawValue) error" }
            if let rule = event.rule, let action = event.action {
                what += " -> \(rule): \(action.rawValue)"
            } else if event.rule == nil, let reason = event.reason {
                what += " -> \(reason)"
            } else if event.rule == nil {
                what += " -> no rule: " + (event.error == nil ? "deliver" : "fail")
            }
            if event.rule != nil, let reason = event.reason { what += " (\(reasonText(reason, event)))" }
        case .wait: what = "wait \(event.delay.map { PolicyEvent.secondsText($0) } ?? "?")s"
        case .queued: what = "queued for a dispatch slot"
        case .held: what = "held (\(event.reason ?? "refresh in flight"))"
        case .refreshStart: what = "refresh started"
        case .refreshRetry:
            what =
                "refresh retry in \(event.delay.map { PolicyEvent.secondsText($0) } ?? "?")s"
                + (event.reason.map { " (\($0))" } ?? "")
        case .refreshEnd:
            what = "refresh " + (event.ok == true ? "ok" : "failed") + (event.reason.map { " (\($0))" } ?? "")
        case .logout: what = "logout (\(event.rule ?? event.reason ?? "no reason given"))"
        case .cancel:
            // A request another request's logout ends has the outcome logged-out (SPEC §5); say so
            // here, so 'cancelled' on this line is not read as the outcome.
            what =
                event.reason == "logout"
                ? "cancelled by the logout (its outcome is logged-out)"
                : "cancelled" + (event.reason.map { " (\($0))" } ?? "")
        case .reload: what = "reload " + (event.ok == true ? "ok" : "refused") + (event.reason.map { " (\($0))" } ?? "")
        case .problem: what = "problem: \(event.reason ?? "?")"
        case .outcome:
            what = "=> \(event.result?.rawValue ?? "?")"
            if let status = event.status { what += " \(status)" }
            if let code = event.code { what += " code \(code)" }
            if let reason = event.reason { what += " (\(reason))" }
        }
        return "\(time)  \(who)  \(what)"
    }

    /// A response's reason (an escalation edge's kind) as words.
    static func reasonText(_ reason: String, _ event: PolicyEvent) -> String {
        switch reason {
        case "budget": return "retry refused: budget"
        case "not-retryable": return "not retried: method not in retry.methods"
        case "on-exhausted":
            // The edge says whose: a refresh rule runs out of refreshes (max-per-request), not retries.
            if event.edge?.contains(".refresh>on-exhausted>") == true {
                return "refreshes exhausted: refresh.max-per-request reached"
            }
            return "retries exhausted"
        case "deadline": return "the wait would pass the deadline"
        case "on-failure": return "refresh failed"
        default: return reason
        }
    }
}

/// Gathers small writes into 64 KiB ones.
final class BufferedWriter: Sendable {
    private let buffer = Locked("")
    private let sink: @Sendable (String) -> Void

    init(_ sink: @escaping @Sendable (String) -> Void) { self.sink = sink }

    func write(_ text: String) {
        let full: String? = buffer.withLock { buffer in
            buffer += text
            guard buffer.utf8.count >= 1 << 16 else { return nil }
            defer { buffer = "" }
            return buffer
        }
        if let full { sink(full) }
    }

    func flush() {
        let rest = buffer.withLock { buffer in
            defer { buffer = "" }
            return buffer
        }
        if !rest.isEmpty { sink(rest) }
    }
}

extension PolicyError {
    var readReason: String {
        if case .unreadable(_, let reason) = self { return reason }
        return description
    }
}

extension PolicyEvent {
    static func secondsText(_ duration: Duration) -> String {
        formatNumber(duration.seconds)
    }
}
