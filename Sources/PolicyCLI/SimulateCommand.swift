import Foundation
import ResponsePolicy

/// `policy simulate FILE --script SCRIPT [--format text|json]`
enum SimulateCommand {
    static let spec = CommandSpec(
        name: "simulate",
        overview: "Run the real engine against a scripted server on a virtual clock (no sleeping, no network).",
        usage: "policy simulate FILE --script SCRIPT [--format text|json]",
        arguments: [("FILE", "The policy file.")],
        options: [
            .init(names: ["--script"], valueName: "script", help: "The simulation script (YAML, see README)."),
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
        let path = try singleFile(arguments)
        guard let scriptPath = arguments.value("--script") else {
            throw UsageError(message: "Missing expected option '--script <script>'")
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
        let result: Simulator.Result
        do {
            result = try await Simulator.run(
                policy: policy, script: script,
                loadPolicy: { file throws(PolicyError) -> Policy in
                    try Policy.load(path: file.hasPrefix("/") ? file : directory + "/" + file, plugins: catalog)
                },
                onEvent: { event in writer.write((json ? event.jsonLine : text(event)) + "\n") })
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

    /// One event as a readable line: `  0.050s  a  response #1: 200 code 1401 -> token-expired: refresh`.
    static func text(_ event: PolicyEvent) -> String {
        let time = String(format: "%9.3fs", event.time.seconds)
        let who = (event.request ?? "-").padding(
            toLength: max(8, (event.request ?? "-").count), withPad: " ", startingAt: 0)
        var what: String
        switch event.kind {
        case .send: what = "send #\(event.attempt ?? 0)"
        case .response:
            what = "response #\(event.attempt ?? 0): "
            if let status = event.status { what += "\(status)" }
            if let code = event.code { what += " code \(code)" }
            if let error = event.error { what += "\(error.rawValue) error" }
            if let rule = event.rule, let action = event.action { what += " -> \(rule): \(action.rawValue)" }
        case .wait: what = "wait \(event.delay.map { PolicyEvent.secondsText($0) } ?? "?")s"
        case .refreshStart: what = "refresh started"
        case .refreshEnd:
            what = "refresh " + (event.ok == true ? "ok" : "failed") + (event.reason.map { " (\($0))" } ?? "")
        case .logout: what = "logout (\(event.rule ?? "?"))"
        case .cancel: what = "cancelled"
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
