import Foundation
import ResponsePolicy
import ResponsePolicyTesting

/// `policy replay FILE RECORDING [--against NEW] [--format text|json] ...`: recorded traffic (a
/// HAR file, or the engine's own JSON events) run through a policy on the virtual clock; with
/// `--against`, through two policies side by side, showing request by request where they differ.
enum ReplayCommand {
    enum Format: String, CaseIterable, Sendable { case text, json }
    enum Input: String, CaseIterable, Sendable { case auto, har, events }

    static let against = Option.value(
        ["--against"], "policy",
        help: "A second policy: both run the recording side by side and each request whose outcome differs is shown.")
    static let format = Option.choice(
        ["--format"], "format", default: Format.text,
        help: "text (default) or json: one event per line, as 'policy simulate' prints them, then a summary.")
    static let input = Option.choice(
        ["--input"], "kind", default: Input.auto,
        help: "What RECORDING is: har, events (JSON lines of --verbose or 'simulate --format json'), or auto "
            + "(default: by its extension, then its first line).")
    static let tokenURL = Option.repeated(
        ["--token-url"], "url",
        help: "A token endpoint (URL or path) whose recorded calls answer refreshes; default: the policy's refresh "
            + "plugin's token-url or url. Repeatable.")
    static let logoutURL = Option.repeated(
        ["--logout-url"], "url",
        help: "A logout endpoint (URL or path) whose recorded calls are left out; default: the policy's logout "
            + "plugin's url. Repeatable.")
    static let refresh = Option.choice(
        ["--refresh"], "answer", default: Replayer.RefreshMode.recorded,
        help: "How refreshes are answered: recorded (default: as the recording's nearest token call; new tokens "
            + "when it has none), ok, fail (invalid_grant) or transient (no answer).")
    static let refreshAfter: Option<String?> = {
        var option = Option.value(
            ["--refresh-after"], "duration",
            help: "How long each token call takes, like 100ms; default: as recorded (100ms without a recording).")
        option.declaration.check = { text in
            Duration.parsePolicy(text) == nil
                ? "Invalid value '\(text)' for '--refresh-after <duration>'; expected a duration like 100ms or 2s"
                : nil
        }
        return option
    }()
    static let plugin = Option.plugin()

    static let spec = CommandSpec(
        name: "replay",
        summary:
            "Run recorded traffic (HAR, or the engine's JSON events) through a policy on a virtual clock, or through "
            + "two to see where they differ.",
        arguments: [
            .init(name: "FILE", help: "The policy that was live when the traffic was recorded."),
            .init(
                name: "RECORDING",
                help: "A HAR 1.2 file (browser developer tools, Playwright, mitmproxy, Charles) or JSON event lines."),
        ],
        options: [
            against.declaration, format.declaration, input.declaration, tokenURL.declaration, logoutURL.declaration,
            refresh.declaration, refreshAfter.declaration, plugin.declaration,
        ],
        exitCodes: [
            (0, "every request came out as recorded (with --against: the same under both policies)"),
            (1, "a request came out otherwise, a policy has errors, or the replay stalled"),
            (64, "usage error"), (65, "the recording is malformed (its line and column are named)"),
            (66, "a policy or the recording cannot be read"),
        ])

    static func run(_ arguments: ParsedArguments, output: CommandOutput) async throws(UsageError) -> Int32 {
        guard arguments.positional.count >= 2 else {
            throw UsageError(
                message: arguments.positional.isEmpty
                    ? "Missing expected argument 'FILE'" : "Missing expected argument 'RECORDING'")
        }
        guard arguments.positional.count == 2 else {
            throw UsageError(message: "Unexpected argument '\(arguments.positional[2])'")
        }
        let (policyPath, recordingPath) = (arguments.positional[0], arguments.positional[1])
        let catalog = try catalog(from: arguments[plugin])
        let (loaded, code) = loadPolicy(policyPath, catalog: catalog, output: output)
        guard let policy = loaded else { return code }
        var policies = [policy]
        if let newPath = arguments[against] {
            let (other, code) = loadPolicy(newPath, catalog: catalog, output: output)
            guard let other else { return code }
            policies.append(other)
        }
        var options = Replayer.Options()
        options.refresh = arguments[refresh]
        options.refreshAfter = arguments[refreshAfter].flatMap(Duration.parsePolicy)

        let source: any ReplaySource
        do {
            source = try open(
                recordingPath, kind: arguments[input], policy: policy, tokenURLs: arguments[tokenURL],
                logoutURLs: arguments[logoutURL])
        } catch {
            output.stderr(error.position == nil ? "error: \(error.message)\n" : "\(error)\n")
            return ExitCode.noInput
        }
        let json = arguments[format] == .json
        let writer = BufferedWriter(output.stdout)
        let differences = Locked((count: 0, shown: [Replayer.RequestReport]()))
        let comparing = policies.count == 2
        let result: Replayer.Result
        do {
            result = try await Replayer.run(
                policies: policies, source: source, options: options,
                onEvent: { _, event in
                    guard !comparing else { return }
                    writer.write((json ? event.jsonLine : SimulateCommand.text(event)) + "\n")
                },
                onRequest: { report in
                    let differs =
                        comparing
                        ? report.outcomes[0] != report.outcomes[1] : !report.outcomes[0].matches(report.recorded)
                    guard differs else { return }
                    if comparing {
                        // Streamed as they are found: a long replay shows its first differences at once.
                        writer.write((json ? differenceJSON(report) : differenceText(report)) + "\n")
                        differences.withLock { $0.count += 1 }
                    } else {
                        differences.withLock { state in
                            state.count += 1
                            if state.shown.count < maxShown { state.shown.append(report) }
                        }
                    }
                })
        } catch {
            writer.flush()
            switch error {
            case .input(let input):
                output.stderr("\(input)\n")
                return ExitCode.dataError
            case .stalled:
                output.stderr("error: \(error)\n")
                return ExitCode.failure
            }
        }
        let (count, shown) = differences.withLock { ($0.count, $0.shown) }
        for report in shown { writer.write((json ? mismatchJSON(report) : mismatchText(report)) + "\n") }
        if !comparing, count > shown.count {
            writer.write(
                json
                    ? "{\"event\":\"recording-mismatches-not-shown\",\"count\":\(count - shown.count)}\n"
                    : "... and \(count - shown.count) more requests that came out otherwise than recorded\n")
        }
        writer.write(recordingLine(result.stats, json: json, differing: count, comparing: comparing) + "\n")
        if comparing {
            for (name, summary) in zip(["old", "new"], result.summaries) {
                writer.write(
                    (json
                        ? summary.jsonLine.replacingOccurrences(
                            of: "{\"event\":\"summary\"", with: "{\"event\":\"summary\",\"policy\":\"\(name)\"")
                        : "summary \(name): " + SimulateCommand.summaryText(summary)) + "\n")
            }
        } else if let summary = result.summaries.first {
            writer.write((json ? summary.jsonLine : "summary: " + SimulateCommand.summaryText(summary)) + "\n")
        }
        writer.flush()
        return count == 0 ? ExitCode.success : ExitCode.failure
    }

    /// Requests that came out otherwise than recorded, listed one by one (the rest are counted).
    static let maxShown = 100

    /// The recording as a source of the kind asked for (or found).
    static func open(
        _ path: String, kind: Input, policy: Policy, tokenURLs: [String], logoutURLs: [String]
    ) throws(ReplayInputError) -> any ReplaySource {
        var resolved = kind
        if resolved == .auto {
            let lowered = path.lowercased()
            if lowered.hasSuffix(".har") {
                resolved = .har
            } else if lowered.hasSuffix(".jsonl") || lowered.hasSuffix(".ndjson") || lowered.hasSuffix(".log") {
                resolved = .events
            } else {
                resolved = looksLikeEvents(path) ? .events : .har
            }
        }
        if resolved == .events { return try EventLogRecording(path: path, policy: policy) }
        var tokens = Set(tokenURLs.map(pathOf))
        var logouts = Set(logoutURLs.map(pathOf))
        if tokenURLs.isEmpty {
            for scope in policy.graph.scopes {
                if let options = scope.refresh.plugin?.options,
                    let url = options["token-url"]?.string ?? options["url"]?.string
                {
                    tokens.insert(pathOf(url))
                }
            }
        }
        if logoutURLs.isEmpty {
            for scope in policy.graph.scopes {
                if let url = scope.logout.plugin.options["url"]?.string { logouts.insert(pathOf(url)) }
            }
        }
        return try HARRecording(path: path, policy: policy, tokenPaths: tokens, logoutPaths: logouts)
    }

    /// A URL's path (a path as given): what token and logout calls are known by in a recording,
    /// whose host a proxy may have rewritten.
    static func pathOf(_ text: String) -> String {
        if text.hasPrefix("/") { return text.split(separator: "?").first.map(String.init) ?? text }
        guard let url = URL(string: text) else { return text }
        return url.path.isEmpty ? "/" : url.path
    }

    /// Whether the file's first line is an engine event (a JSON object with `"event"`).
    static func looksLikeEvents(_ path: String) -> Bool {
        guard let handle = FileHandle(forReadingAtPath: path) else { return false }
        defer { try? handle.close() }
        let start = (try? handle.read(upToCount: 4096)) ?? Data()
        let firstLine = start.split(separator: 0x0A, maxSplits: 1).first ?? Data()
        let text = String(decoding: firstLine, as: UTF8.self)
        return text.hasPrefix("{") && text.contains("\"event\":")
    }

    // MARK: - Lines

    static func outcomeJSON(_ outcome: Replayer.Outcome) -> String {
        var fields = ["\"result\":" + PolicyEvent.quote(outcome.result?.rawValue ?? "unfinished")]
        if let status = outcome.status { fields.append("\"status\":\(status)") }
        if let code = outcome.code { fields.append("\"code\":" + PolicyEvent.quote(code)) }
        if let reason = outcome.reason { fields.append("\"reason\":" + PolicyEvent.quote(reason)) }
        fields.append("\"attempts\":\(outcome.attempts)")
        return "{" + fields.joined(separator: ",") + "}"
    }

    static func recordedJSON(_ recorded: RecordedOutcome) -> String {
        var fields: [String] = []
        if let result = recorded.result { fields.append("\"result\":" + PolicyEvent.quote(result.rawValue)) }
        if let status = recorded.status { fields.append("\"status\":\(status)") }
        if let code = recorded.code { fields.append("\"code\":" + PolicyEvent.quote(code)) }
        if let error = recorded.error { fields.append("\"error\":" + PolicyEvent.quote(error.rawValue)) }
        return "{" + fields.joined(separator: ",") + "}"
    }

    static func recordedText(_ recorded: RecordedOutcome) -> String {
        var parts: [String] = []
        if let result = recorded.result { parts.append(result.rawValue) }
        if let status = recorded.status { parts.append(String(status)) }
        if let code = recorded.code { parts.append("code \(code)") }
        if let error = recorded.error { parts.append("\(error.rawValue) error") }
        return parts.joined(separator: " ")
    }

    static func head(_ report: Replayer.RequestReport) -> String {
        "\"t\":" + PolicyEvent.seconds(report.at) + ",\"request\":" + PolicyEvent.quote(report.id) + ",\"method\":"
            + PolicyEvent.quote(report.method) + ",\"path\":" + PolicyEvent.quote(report.path)
    }

    static func place(_ report: Replayer.RequestReport) -> String {
        String(format: "%9.3fs", report.at.seconds) + "  " + report.id + "  " + report.method + " " + report.path
    }

    static func differenceJSON(_ report: Replayer.RequestReport) -> String {
        "{" + head(report) + ",\"event\":\"difference\",\"old\":" + outcomeJSON(report.outcomes[0]) + ",\"new\":"
            + outcomeJSON(report.outcomes[1]) + "}"
    }

    static func differenceText(_ report: Replayer.RequestReport) -> String {
        func side(_ outcome: Replayer.Outcome) -> String {
            outcome.text + ", \(outcome.attempts) attempt\(outcome.attempts == 1 ? "" : "s")"
        }
        return place(report) + "\n    old: " + side(report.outcomes[0]) + "\n    new: " + side(report.outcomes[1])
    }

    static func mismatchJSON(_ report: Replayer.RequestReport) -> String {
        "{" + head(report) + ",\"event\":\"recording-mismatch\",\"recorded\":" + recordedJSON(report.recorded)
            + ",\"replayed\":" + outcomeJSON(report.outcomes[0]) + "}"
    }

    static func mismatchText(_ report: Replayer.RequestReport) -> String {
        let at = report.position.map { " (recorded at line \($0.line))" } ?? ""
        return "not as recorded: " + place(report) + at + ": recorded " + recordedText(report.recorded)
            + "; replayed " + report.outcomes[0].text
    }

    static func recordingLine(_ stats: ReplayStats, json: Bool, differing: Int, comparing: Bool) -> String {
        if json {
            var line =
                "{\"event\":\"recording\",\"entries\":\(stats.entries),\"requests\":\(stats.requests),"
                + "\"token-calls\":\(stats.tokenCalls),\"logout-calls\":\(stats.logoutCalls),\"skipped\":\(stats.skipped)"
            line += comparing ? ",\"different\":\(differing)" : ",\"not-as-recorded\":\(differing)"
            return line + "}"
        }
        func plural(_ n: Int, _ word: String) -> String { "\(n) \(word)\(n == 1 ? "" : "s")" }
        var line =
            "recording: \(plural(stats.entries, "entry").replacingOccurrences(of: "entrys", with: "entries")): "
            + "\(plural(stats.requests, "request")), \(plural(stats.tokenCalls, "token call")), "
            + "\(plural(stats.logoutCalls, "logout call")), \(stats.skipped) skipped; "
        line +=
            comparing
            ? "\(differing) of \(stats.requests) requests differ between the policies"
            : "\(stats.requests - differing) of \(stats.requests) requests came out as recorded"
        return line
    }
}
