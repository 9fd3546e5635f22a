import Foundation
import ResponsePolicy

/// `policy simulate FILE --script SCRIPT [--format text|json]`
enum SimulateCommand {
    static let spec = CommandSpec(
        name: "simulate",
        overview: "Run the real engine against a scripted server on a virtual clock (no sleeping, no network).",
        usage: "policy simulate FILE --script SCRIPT [--format text|json]",
        arguments: [("FILE", "The policy file; may be left out when the script names one with 'policy:'.")],
        options: [
            .init(names: ["--script"], valueName: "script", help: "The simulation script (YAML, see docs/commands.md)."),
            .init(
                names: ["--format"], valueName: "format",
                help: "text (default) or json: one event per line, then a summary."),
            .init(
                names: ["--plugin"], valueName: "kind:name", help: "Declare a host plugin. Repeatable.",
                repeatable: true),
        ])

    static func run(_ arguments: ParsedArguments, output: CommandOutput) async throws(UsageError) -> Int32 {
        let format = arguments.value("--format") ?? "text"
        guard format == "text" || format == "json" else {
            throw UsageError(message: "Unknown format '\(format)'; use text or json")
        }
        guard let scriptPath = arguments.value("--script") else {
            throw UsageError(message: "Missing expected option '--script <script>'")
        }
        let path: String
        if arguments.positional.isEmpty, let named = scriptPolicy(scriptPath) {
            path = named
        } else {
            path = try singleFile(arguments)
        }
        let catalog = try catalog(from: arguments.all("--plugin"))
        let (loaded, code) = loadPolicy(path, catalog: catalog, output: output)
        guard let policy = loaded else { return code }

        let bytes: [UInt8]
        do {
            bytes = try Policy.readFile(scriptPath, limits: .default)
        } catch {
            output.stderr("error: cannot read '\(scriptPath)': \(error.readReason)\n")
            return ExitCode.noInput
        }
        let (parsed, diagnostics) = SimulationScript.parse(bytes, file: scriptPath)
        for diagnostic in diagnostics { output.stderr(diagnostic.description + "\n") }
        guard let script = parsed else { return ExitCode.failure }

        let directory = URL(fileURLWithPath: scriptPath).deletingLastPathComponent().path
        // Events go out as they happen (buffered), none is kept: memory does not grow with the run.
        let writer = BufferedWriter(output.stdout)
        let json = format == "json"
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
        if format == "json" {
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

    /// The policy a script names with `policy:`, relative to the script; `nil` when it names none
    /// (or cannot be read: the run reports that).
    static func scriptPolicy(_ scriptPath: String) -> String? {
        guard let bytes = try? Policy.readFile(scriptPath, limits: .default) else { return nil }
        let (expectations, _) = SimulationExpectations.parse(Policy.parse(bytes: bytes, limits: .default), file: nil)
        guard let named = expectations.policy else { return nil }
        if named.hasPrefix("/") { return named }
        let directory = URL(fileURLWithPath: scriptPath).deletingLastPathComponent().path
        return directory == "." ? named : directory + "/" + named
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
        case .refreshStart: what = "refresh started"
        case .refreshRetry:
            what = "refresh retry in \(event.delay.map { PolicyEvent.secondsText($0) } ?? "?")s"
                + (event.reason.map { " (\($0))" } ?? "")
        case .refreshEnd:
            what = "refresh " + (event.ok == true ? "ok" : "failed") + (event.reason.map { " (\($0))" } ?? "")
        case .logout: what = "logout (\(event.rule ?? event.reason ?? "no reason given"))"
        case .cancel: what = "cancelled" + (event.reason.map { " (\($0))" } ?? "")
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
        case "on-exhausted": return "retries exhausted"
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
