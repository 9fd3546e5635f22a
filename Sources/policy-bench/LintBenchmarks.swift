import Foundation
import PolicyCLI
import ResponsePolicy
import ResponsePolicyTesting

/// Lint, diff and hostile-header benchmarks, each against a baseline measured in the same run:
/// lint against a bare libyaml event parse of the same file (what no YAML-based lint can beat),
/// diff against loading its two files, a header matched against 20 hostile glob rules against
/// one pass over the header's characters.
extension Benchmarks {
    /// A large policy in the shape of the lint-speed script's: codes in block and flow style,
    /// methods, statuses per service path, status ranges, error rules, header globs, overrides
    /// merged from an anchor. `variant` renames a rule and changes two code rules' actions, for
    /// diff (changing many rules that meet paths and header values makes diff's text itself
    /// grow with paths × header values: every seventh action changed gives 277 MB of text).
    static func mixedPolicy(_ count: Int, variant: Bool = false) -> String {
        var text = """
            policy: 1
            name: mixed
            x-fast-retry: &fast-retry
              do: retry
              max-retries: 2
              backoff: constant
              initial: 250ms
            classify:
              code: body.status
            rules:

            """
        let actions = ["refresh", "logout", "retry", "fail", "deliver"]
        var current = 0
        func then(_ action: String) -> String {
            guard variant, current == 10 || current == count / 2 else { return action }
            return action == "fail" ? "deliver" : "fail"
        }
        for i in 0..<count {
            current = i
            let code = 100_000 + 2 * i
            let svc = "/svc-\(i)/*"
            let name = variant && i == 5 ? "rule-5-renamed" : "rule-\(i)"
            text += "  - name: \(name)\n"
            switch i % 10 {
            case 0, 1, 2:
                text += "    when:\n      code: [\(code), \(code + 1)]\n    then: \(then(actions[i % 5]))\n"
            case 3:
                text += "    when: { code: [\(code)], method: [GET, PUT] }\n    then: \(then(actions[(i / 10) % 5]))\n"
            case 4:
                text += "    when: { status: [502, 503, 504], path: \"\(svc)\" }\n    then: \(then("retry"))\n"
            case 5:
                text += "    when:\n      status: [\"520-599\"]\n      path: \"\(svc)\"\n    then: \(then("retry"))\n"
            case 6:
                text += "    when: { error: [timeout, connection], method: [GET, HEAD], path: \"\(svc)\" }\n"
                text += "    then: \(then("retry"))\n"
            case 7:
                text += "    when:\n      status: [429]\n      header: { X-Reason: \"quota-\(i)-*\" }\n"
                text += "    then: \(then("retry"))\n"
            case 8:
                text += "    when: { code: [\(code)] }\n    then:\n      <<: *fast-retry\n      on-exhausted: fail\n"
            default:
                text += "    when: { status: [401], code: [\"\(code)\"], path: \"\(svc)\" }\n    then: refresh\n"
            }
        }
        text += """
            refresh:
              use: oauth2
              with: { token-url: "https://auth.example.com/oauth/token", client-id: mobile }
            retry:
              max-retries: 4
              max-delay: 10s
              deadline: 90s
            routes:
              - match: { path: "/oauth/*" }
                rules: []

            """
        return text
    }

    /// Lint (`Policy.analyze`: parse, decode, compile the graph, every lint rule) of a
    /// `count`-rule file, against libyaml merely parsing it, best of `rounds` each, interleaved so
    /// both see the same load. Memory: the peak RSS of a child process linting the file, against
    /// one only parsing it, both as multiples of the file's size.
    static func lint(quick: Bool, count: Int, memory: Bool) -> BenchResult {
        let rules = quick ? 200 : count
        let bytes = Array(rulesPolicy(rules).utf8)
        let rounds = quick ? 1 : (count > 20_000 ? 2 : 5)
        var lint = Double.infinity
        var parse = Double.infinity
        var findings = 0
        for _ in 0..<rounds {
            let start = ContinuousClock.now
            let analysis = Policy.analyze(bytes: bytes, file: "bench.yaml", catalog: PluginCatalog(), limits: .default)
            lint = min(lint, (ContinuousClock.now - start).nanoseconds / 1e6)
            findings = analysis.diagnostics.count
            let parseStart = ContinuousClock.now
            blackHole(YAMLLoader.countEvents(bytes))
            parse = min(parse, (ContinuousClock.now - parseStart).nanoseconds / 1e6)
        }
        var extra: [(String, Double)] = [
            ("rules", Double(rules)), ("file_bytes", Double(bytes.count)), ("findings", Double(findings)),
        ]
        if memory {
            let file = FileManager.default.temporaryDirectory.appendingPathComponent("policy-bench-lint-\(rules).yaml")
            if (try? Data(bytes).write(to: file)) != nil {
                defer { try? FileManager.default.removeItem(at: file) }
                let lintPeak = peakInChildProcess(["--peak-rss", "lint", file.path])
                let parsePeak = peakInChildProcess(["--peak-rss", "parse", file.path])
                let idlePeak = peakInChildProcess(["--peak-rss", "idle", file.path])
                let size = Double(bytes.count)
                extra += [
                    ("peak_rss_mib", lintPeak / 1_048_576), ("peak_rss_per_file_byte", lintPeak / size),
                    ("parse_only_peak_rss_mib", parsePeak / 1_048_576),
                    ("idle_process_peak_rss_mib", idlePeak / 1_048_576),
                    ("peak_rss_above_idle_per_file_byte", (lintPeak - idlePeak) / size),
                ]
            }
        }
        return BenchResult(
            name: count >= 100_000 ? "lint-100k" : "lint-20k", value: lint, unit: "ms", baseline: parse,
            baselineName: "libyaml events", ratio: lint / parse,
            ratioMeaning: "lint ms / libyaml event parse ms, lower is better", extra: extra,
            goal: count >= 100_000 ? "seconds, memory proportional to the file" : "<= 3x libyaml, < 30x file in RSS")
    }

    /// The child process of the lint row's memory figures: reads the file, then lints it
    /// (`lint`), only parses it with libyaml (`parse`), or does nothing more (`idle`), and prints
    /// its peak RSS in bytes.
    static func peakRSS(mode: String, path: String) -> Double {
        // As `policy lint` reads a file: the bytes alone, the `Data` they came from let go.
        guard let bytes = FileManager.default.contents(atPath: path).map({ [UInt8]($0) }) else {
            return .nan
        }
        switch mode {
        case "lint":
            blackHole(
                Policy.analyze(bytes: bytes, file: path, catalog: PluginCatalog(), limits: .default).diagnostics.count)
        case "parse":
            blackHole(YAMLLoader.countEvents(bytes))
        default:
            blackHole(bytes.count)
        }
        return residentMemory().peak
    }

    static func peakInChildProcess(_ arguments: [String]) -> Double {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: CommandLine.arguments[0]).standardizedFileURL
        if !FileManager.default.isExecutableFile(atPath: process.executableURL?.path ?? "") {
            process.executableURL = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath()
        }
        process.arguments = arguments
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

    /// `policy diff` of two 1,000-rule mixed policies (400 paths, 100 header values, 900 codes),
    /// against loading the two files.
    static func diff(quick: Bool) -> BenchResult {
        let rules = quick ? 50 : 1_000
        let oldText = mixedPolicy(rules)
        let newText = mixedPolicy(rules, variant: true)
        var load = Double.infinity
        var diff = Double.infinity
        var changes = 0
        for _ in 0..<(quick ? 1 : 3) {
            let start = ContinuousClock.now
            guard let old = try? Policy.load(yaml: oldText), let new = try? Policy.load(yaml: newText) else {
                fatalError("the generated policies do not load")
            }
            load = min(load, (ContinuousClock.now - start).nanoseconds / 1e6)
            let diffStart = ContinuousClock.now
            changes = PolicyDiff(old: old, new: new).changes.count
            diff = min(diff, (ContinuousClock.now - diffStart).nanoseconds / 1e6)
        }
        return BenchResult(
            name: "diff-1k", value: diff, unit: "ms", baseline: load, baselineName: "loading both", ratio: diff / load,
            ratioMeaning: "diff ms / load ms, lower is better",
            extra: [("rules", Double(rules)), ("changes", Double(changes))], goal: "well under a few seconds")
    }

    /// Classifying one response with a server-chosen 64 KiB header against 20 glob header rules
    /// whose `?` pieces the old matcher tried at every position (4-10 s of CPU per response),
    /// against one pass over the header's characters.
    static func hostileHeader(quick: Bool) -> BenchResult {
        var yaml = "policy: 1\nname: hostile-header\nrules:\n"
        for index in 0..<20 {
            let pattern = "*" + String(repeating: "a?", count: 400 + index) + "b\(index)*"
            yaml +=
                "  - { name: h\(index), when: { status: [200], header: { X-Reason: \"\(pattern)\" } }, then: fail }\n"
        }
        guard let policy = try? Policy.load(yaml: yaml) else { fatalError("hostile-header policy invalid") }
        let scope = policy.graph.scope(method: "GET", path: "/")
        let value = String(repeating: "a", count: quick ? 1_024 : 64 << 10)
        let headers = HTTPHeaders([("X-Reason", value)])
        let iterations = quick ? 2 : 20
        let ours = measure(iterations: iterations, rounds: quick ? 1 : 3) {
            blackHole(scope.classifier.match(status: 200, code: nil, headers: headers, method: "GET", path: "/"))
        }
        let pass = measure(iterations: iterations * 20, rounds: quick ? 1 : 3) {
            var scalars = 0
            for scalar in value.unicodeScalars where scalar != "b" { scalars += 1 }
            blackHole(scalars)
        }
        return BenchResult(
            name: "hostile-header", value: ours / 1e6, unit: "ms", baseline: pass / 1e6,
            baselineName: "one pass over it", ratio: ours / pass,
            ratioMeaning: "classify ms / one scan ms (20 rules, 13-16 words each), lower is better",
            extra: [("header_bytes", Double(value.utf8.count)), ("rules", 20)], goal: "linear: <= 20 x 17 scans")
    }
}

extension Benchmarks {
    /// Issue 32: lint, explain and graph of a 100,000-route file (`ScaleFixtures.manyRoutes`) and
    /// of a 100,000-rule file, each against libyaml's event parse of the same bytes (same run).
    static func scale(quick: Bool) -> [BenchResult] {
        // POLICY_BENCH_SCALE_COUNT=N measures N instead, to see the growth (the rows keep their names).
        let asked = ProcessInfo.processInfo.environment["POLICY_BENCH_SCALE_COUNT"].flatMap { Int($0) }
        let count = quick ? 500 : asked ?? 100_000
        let files: [(String, String)] = [
            ("scale-100k-routes", ScaleFixtures.manyRoutes(count)), ("scale-100k-rules", rulesPolicy(count)),
        ]
        return files.map { name, text in
            let bytes = Array(text.utf8)
            let start = ContinuousClock.now
            blackHole(YAMLLoader.countEvents(bytes))
            let parse = (ContinuousClock.now - start).nanoseconds / 1e6
            let lintStart = ContinuousClock.now
            let analysis = Policy.analyze(bytes: bytes, file: "bench.yaml", catalog: PluginCatalog(), limits: .default)
            let lint = (ContinuousClock.now - lintStart).nanoseconds / 1e6
            var explain = Double.nan
            var graph = Double.nan
            if let policy = analysis.policy {
                let explainStart = ContinuousClock.now
                blackHole(PolicyExplainer.explain(policy).utf8.count)
                explain = (ContinuousClock.now - explainStart).nanoseconds / 1e6
                let graphStart = ContinuousClock.now
                blackHole(GraphRenderer.dot(policy).utf8.count)
                graph = (ContinuousClock.now - graphStart).nanoseconds / 1e6
            }
            return BenchResult(
                name: name, value: lint + explain + graph, unit: "ms", baseline: parse,
                baselineName: "libyaml events", ratio: (lint + explain + graph) / parse,
                ratioMeaning: "lint + explain + graph ms / libyaml event parse ms, lower is better",
                extra: [
                    ("count", Double(count)), ("file_bytes", Double(bytes.count)), ("lint_ms", lint),
                    ("explain_ms", explain), ("graph_ms", graph),
                ],
                goal: "seconds (linear in routes and rules)")
        }
    }
}
