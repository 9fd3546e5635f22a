import Foundation
import ResponsePolicy
import ResponsePolicyTesting

/// `policy test PATH...`: runs simulation scripts that state what must happen and fails like a test runner when it does not.
enum TestCommand {
    enum Format: String, CaseIterable, Sendable { case text, junit }

    static let format = Option.choice(
        ["--format"], "format", default: Format.text,
        help: "text (default) or junit (JUnit XML on stdout, for CI dashboards).")
    static let policy = Option.value(
        ["--policy"], "file", help: "The policy every script runs with, instead of the one its 'policy:' names.")
    static let plugin = Option.plugin()

    static let spec = CommandSpec(
        name: "test",
        summary: "Run simulation scripts and check their expectations, like a test runner.",
        arguments: [
            .init(
                name: "PATH",
                help: "A script, or a folder searched for scripts (*.yaml, *.yml with 'requests:' or 'processes:'); "
                    + "other YAML is skipped.",
                variadic: true)
        ],
        options: [format.declaration, policy.declaration, plugin.declaration],
        exitCodes: [
            (0, "every script met its expectations"), (1, "an expectation was not met, or a script is invalid"),
            (64, "usage error"), (66, "a PATH cannot be read"),
        ])

    /// What one script produced.
    struct Outcome {
        var path: String
        /// Problems that stopped the script from running (invalid script or policy, stall).
        var errors: [String] = []
        var failures: [ExpectationChecker.Failure] = []
        /// Findings that do not fail the script (a `policy:` that `--policy` overrides).
        var warnings: [String] = []
        /// The policy the script ran with, as the user would write its path.
        var policy: String?
        var checked = 0
        var seconds = 0.0
        var passed: Bool { errors.isEmpty && failures.isEmpty }
    }

    static func run(_ arguments: ParsedArguments, output: CommandOutput) async throws(UsageError) -> Int32 {
        let format = arguments[Self.format]
        guard !arguments.positional.isEmpty else { throw UsageError(message: "Missing expected argument 'PATH'") }
        let catalog = try catalog(from: arguments[plugin])
        let policyOverride = arguments[policy]

        var outcomes: [Outcome] = []
        var unreadable = false
        for path in arguments.positional {
            switch LintCommand.expand(path) {
            case .failure(let error):
                output.stderr("error: cannot read '\(path)': \(error.reason)\n")
                unreadable = true
            case .success(let files):
                let searched = files != [path]
                for file in files {
                    let bytes: [UInt8]
                    do {
                        bytes = try Policy.readFile(file, limits: .default, owner: .anyone)
                    } catch {
                        output.stderr("error: cannot read '\(file)': \(error.readReason)\n")
                        unreadable = true
                        continue
                    }
                    let parsed = Policy.parse(bytes: bytes, limits: .default)
                    if searched, !SimulationScript.isScript(parsed.root) { continue }
                    let outcome = await runScript(
                        parsed, file: file, policyOverride: policyOverride, catalog: catalog)
                    for warning in outcome.warnings { output.stderr(warning + "\n") }
                    outcomes.append(outcome)
                    if format == .text { output.stdout(text(outcome)) }
                }
            }
        }
        let failed = outcomes.filter { !$0.passed }.count
        if format == .junit {
            output.stdout(junit(outcomes))
        } else {
            func plural(_ n: Int, _ word: String) -> String { "\(n) \(word)\(n == 1 ? "" : "s")" }
            output.stdout("\(plural(outcomes.count, "script")): \(outcomes.count - failed) passed, \(failed) failed\n")
        }
        if unreadable { return ExitCode.noInput }
        if outcomes.isEmpty {
            output.stderr(
                "error: no simulation scripts found (a script has a top-level 'requests:', a fleet script 'processes:')\n"
            )
            return ExitCode.failure
        }
        return failed > 0 ? ExitCode.failure : ExitCode.success
    }

    /// Checks, runs and judges one script, timing it for JUnit.
    static func runScript(_ parsed: Policy.Parsed, file: String, policyOverride: String?, catalog: PluginCatalog)
        async -> Outcome
    {
        let start = ContinuousClock.now
        var outcome = await judge(parsed, file: file, policyOverride: policyOverride, catalog: catalog)
        outcome.seconds = (ContinuousClock.now - start).seconds
        return outcome
    }

    /// Runs one script. The policy named on the command line wins over the script's own
    /// `policy:` (as with `simulate FILE --script`), so `--policy candidate.yaml` tests the
    /// candidate and not what each script was written against; a script whose `policy:` names
    /// another file gets a warning saying which one ran.
    static func judge(_ parsed: Policy.Parsed, file: String, policyOverride: String?, catalog: PluginCatalog) async
        -> Outcome
    {
        var outcome = Outcome(path: file)
        guard SimulationScript.isScript(parsed.root) else {
            if let mistake = SimulationScript.versionInsteadOfPolicyPath(parsed.root, file: file) {
                outcome.errors.append(mistake.description)
                return outcome
            }
            outcome.errors.append(
                "\(file):1:1: error: not a simulation script: it has no top-level 'requests:'")
            return outcome
        }
        let (script, scriptDiagnostics) = SimulationScript.parse(parsed, file: file)
        let (expectations, expectDiagnostics) = SimulationExpectations.parse(parsed, file: file)
        let diagnostics = (scriptDiagnostics + expectDiagnostics).filter { $0.severity == .error }
        outcome.errors += diagnostics.map(\.description)
        guard let script, diagnostics.isEmpty else { return outcome }
        if expectations.isEmpty {
            outcome.errors.append(
                "\(file):1:1: error: the script states no expectations; add 'expect:' to a request or at the top level")
            return outcome
        }
        let directory = folder(of: file)
        @Sendable func relative(_ path: String) -> String {
            path.hasPrefix("/") ? path : (directory == "." ? path : directory + "/" + path)
        }
        let policyPath: String
        if let policyOverride {
            policyPath = policyOverride
            if let named = expectations.policy, !samePath(relative(named), policyOverride) {
                let at = expectations.policyRange.map { "\(file):\($0.start.line):\($0.start.column)" } ?? file
                outcome.warnings.append(
                    "\(at): warning: the script names policy '\(named)'; it runs with '\(policyOverride)' "
                        + "given by --policy")
            }
        } else if let named = expectations.policy {
            policyPath = normalized(relative(named))
        } else {
            outcome.errors.append(
                "\(file):1:1: error: the script names no policy; add 'policy: PATH' (relative to the script) "
                    + "or pass --policy")
            return outcome
        }
        outcome.policy = policyPath
        let policy: Policy
        do {
            policy = try Policy.load(path: policyPath, plugins: catalog, owner: .anyone)
        } catch {
            let at = expectations.policyRange.map { "\(file):\($0.start.line):\($0.start.column)" } ?? file
            switch error {
            case .unreadable(_, let reason):
                outcome.errors.append("\(at): error: cannot read policy '\(policyPath)': \(reason)")
            case .invalid(_, let found):
                outcome.errors.append("\(at): error: policy '\(policyPath)' does not pass lint:")
                outcome.errors += found.filter { $0.severity == .error }.prefix(10).map { "  " + $0.description }
            }
            return outcome
        }
        if script.fleet != nil {
            let result: FleetSimulator.Result
            do {
                result = try await FleetSimulator.run(policy: policy, script: script)
            } catch {
                outcome.errors.append("\(file):1:1: error: \(error)")
                return outcome
            }
            var checker = ExpectationChecker(expectations)
            for line in result.lines {
                guard case .engine(let process, var event) = line else { continue }
                event.request = event.request.map { "\(process)/\($0)" }
                checker.observe(event, process: process)
            }
            let summary = result.summary
            outcome.failures = checker.failures(
                value: { summary.value($0) }, processValue: { summary.value($1, of: $0) })
            outcome.checked =
                expectations.requests.count + expectations.summary.count + expectations.events.count
                + expectations.processSummaries.count
            return outcome
        }
        let result: Simulator.Result
        do {
            result = try await Simulator.run(policy: policy, script: script) { path throws(PolicyError) -> Policy in
                try Policy.load(path: relative(path), plugins: catalog, owner: .anyone)
            }
        } catch {
            outcome.errors.append("\(file):1:1: error: \(error)")
            return outcome
        }
        var checker = ExpectationChecker(expectations)
        for event in result.events { checker.observe(event) }
        outcome.failures = checker.failures(summary: result.summary)
        outcome.checked = expectations.requests.count + expectations.summary.count + expectations.events.count
        return outcome
    }

    /// `PASS file (N expectations)`, or `FAIL file` and each failure with its context.
    static func text(_ outcome: Outcome) -> String {
        let with = outcome.policy.map { " with \($0)" } ?? ""
        guard !outcome.passed else {
            return "PASS \(outcome.path)\(with) (\(outcome.checked) expectation\(outcome.checked == 1 ? "" : "s"))\n"
        }
        return "FAIL \(outcome.path)\(with)\n" + details(outcome)
    }

    /// The failure lines: `FILE:LINE:COL: expected …, got …`, then the events that show where
    /// the run diverged.
    static func details(_ outcome: Outcome) -> String {
        var out = outcome.errors.map { $0 + "\n" }.joined()
        for failure in outcome.failures {
            out += "\(outcome.path):\(failure.range.start.line):\(failure.range.start.column): \(failure.message)\n"
            if !failure.context.isEmpty {
                out += "  \(failure.contextTitle):\n"
                for event in failure.context { out += "  " + SimulateCommand.text(event) + "\n" }
            }
        }
        return out
    }

    /// JUnit XML: one test case per script, its failures in the case's `<failure>`.
    static func junit(_ outcomes: [Outcome]) -> String {
        let failed = outcomes.filter { !$0.passed }.count
        let total = outcomes.reduce(0) { $0 + $1.seconds }
        var out = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
        out += "<testsuites tests=\"\(outcomes.count)\" failures=\"\(failed)\" time=\"\(time(total))\">\n"
        out += "  <testsuite name=\"policy test\" tests=\"\(outcomes.count)\" failures=\"\(failed)\" errors=\"0\""
        out += " time=\"\(time(total))\">\n"
        for outcome in outcomes {
            out += "    <testcase classname=\"policy-test\" name=\"\(xml(outcome.path))\" file=\"\(xml(outcome.path))\""
            out += " time=\"\(time(outcome.seconds))\">\n"
            if let policy = outcome.policy {
                out += "      <properties><property name=\"policy\" value=\"\(xml(policy))\"/></properties>\n"
            }
            if outcome.passed {
                out += "    </testcase>\n"
                continue
            }
            let first =
                outcome.errors.first ?? outcome.failures.first.map {
                    "\(outcome.path):\($0.range.start.line):\($0.range.start.column): \($0.message)"
                } ?? ""
            out += "      <failure message=\"\(xml(first))\">\(xml(details(outcome)))</failure>\n    </testcase>\n"
        }
        return out + "  </testsuite>\n</testsuites>\n"
    }

    static func time(_ seconds: Double) -> String { String(format: "%.3f", seconds) }

    static func xml(_ text: String) -> String {
        var out = ""
        for scalar in text.unicodeScalars {
            switch scalar {
            case "&": out += "&amp;"
            case "<": out += "&lt;"
            case ">": out += "&gt;"
            case "\"": out += "&quot;"
            case "\n", "\t": out.unicodeScalars.append(scalar)
            default:
                // XML 1.0 has no place for other control characters, even escaped.
                if scalar.value < 0x20 || scalar.value == 0xFFFE || scalar.value == 0xFFFF {
                    out += "?"
                } else {
                    out.unicodeScalars.append(scalar)
                }
            }
        }
        return out
    }
}

/// Whether two paths name the same file (after `.`/`..` and symbolic links are resolved).
func samePath(_ a: String, _ b: String) -> Bool {
    URL(fileURLWithPath: a).standardizedFileURL.resolvingSymlinksInPath().path
        == URL(fileURLWithPath: b).standardizedFileURL.resolvingSymlinksInPath().path
}

/// The folder part of `path` as written (`.` when it has none), so paths built from it stay
/// relative when the user's were.
func folder(of path: String) -> String {
    guard let slash = path.lastIndex(of: "/") else { return "." }
    return slash == path.startIndex ? "/" : String(path[..<slash])
}

/// `path` without `.` segments and with `dir/..` pairs folded, kept relative when it was:
/// `./scripts/../policy.yaml` is `policy.yaml`, as a user would write it.
func normalized(_ path: String) -> String {
    let absolute = path.hasPrefix("/")
    var parts: [Substring] = []
    for part in path.split(separator: "/") {
        switch part {
        case ".": continue
        case "..":
            if let last = parts.last, last != ".." { parts.removeLast() } else if !absolute { parts.append(part) }
        default: parts.append(part)
        }
    }
    let joined = parts.joined(separator: "/")
    return absolute ? "/" + joined : (joined.isEmpty ? "." : joined)
}
