import Foundation
import ResponsePolicy
import ResponsePolicyTesting

/// What one input did, for the replay mode and the regression tests.
package struct FuzzReport: Sendable {
    /// Every finding about the policy part, as `policy lint` reports them.
    package var policyDiagnostics: [Diagnostic] = []
    /// Every finding about the same bytes read as a `policy simulate` script.
    package var scriptDiagnostics: [Diagnostic] = []
    /// Whether the policy part compiled into a rule graph (it may still have lint errors).
    package var compiled = false
    /// Per scope, what the engine decides for the input's response: `default: 401 code '1401' -> token-expired`.
    package var decisions: [String] = []
    /// The business code the scanner finds at each of ``FuzzHarness/scannerPaths`` in the body.
    package var scannedCodes: [String?] = []
}

/// Runs one input through everything the package does with untrusted bytes, and checks the
/// answers against simple oracles.
///
/// Per input (see ``FuzzInput`` for how it is cut):
/// 1. The policy part is parsed once and analysed as `policy lint` does (YAML loader, decoder,
///    graph compilation, every lint rule), and decoded as a simulation script. A refusal must come
///    with an error, and every diagnostic must have a 1-based position on a line of the file (a
///    snippet with a caret can be drawn) and a kebab-case rule id; each is rendered.
/// 2. When it compiles, each scope classifies the input's response the way the engine does: the
///    business code from the body (``JSONCodeScanner``, 1 MiB bound) or a header, then
///    `classifier.match`, for the input's status and a few fixed ones, and for every transport
///    error class. Each answer must equal ``FirstMatch``'s rule-by-rule walk, and the scope chosen
///    for the request must be the first matching route. ``WorstCase`` runs for each scope as
///    `policy explain` does.
/// 3. The JSON code scanner runs on the body (or, without one, the whole input) at a few fixed
///    paths, from exactly sized copies so AddressSanitizer sees any read past the end. Its answer
///    must be ``ReferenceJSON``'s (a plain recursive parser: valid JSON only, the last of
///    duplicate keys), `withCode` must agree with `code`, and a `maxBytes` below the body's length
///    must give no code.
/// 4. The body is handed to the built-in `oauth2` and `http` refresh plugins as their token
///    endpoint's answer (``TokenAnswerFuzzing``): credentials or a failure whose reason shows no
///    token and no control character.
///
/// A broken oracle stops the process with `fatalError`, which libFuzzer records like a crash.
///
/// Concurrency contract: stateless; any number of calls may run at once.
package enum FuzzHarness {
    /// The engine's default `bodyScanLimit`.
    static let scanLimit = 1 << 20
    /// Statuses classified besides the input's own: success, the auth pair, throttling, transient.
    static let statuses = [200, 401, 403, 429, 503]
    /// Paths the scanner is run at on every body: top level, nested, array index, digit key, deep.
    package static let scannerPaths = [
        "status", "code", "data.result.code", "errors.0.code", "0", "0.1", "a.b.c.d.e.f.g.h.i.j",
    ]
    private static let compiledScannerPaths = scannerPaths.compactMap { JSONPath($0) }
    /// Host plugins declared as `policy lint --plugin` would, so `use:` of a host plugin is reachable.
    static let catalog: PluginCatalog = {
        var catalog = PluginCatalog()
        catalog.declare(.refresh, "host-sso")
        catalog.declare(.extract, "host-code")
        catalog.declare(.observe, "host-metrics")
        return catalog
    }()

    @discardableResult
    package static func run(_ bytes: UnsafeRawBufferPointer) -> FuzzReport {
        let input = FuzzInput(bytes)
        var report = FuzzReport()

        let parsed = Policy.parse(bytes: input.policy, limits: .default)
        let analysis = Policy.analyze(parsed, file: "fuzz.yaml", catalog: catalog)
        report.policyDiagnostics = analysis.diagnostics
        check(analysis.policy != nil || analysis.diagnostics.hasErrors, "a policy was refused without an error")
        checkDiagnostics(analysis.diagnostics, source: analysis.source)

        let (script, scriptDiagnostics) = SimulationScript.parse(parsed, file: "fuzz-script.yaml")
        report.scriptDiagnostics = scriptDiagnostics
        check(script != nil || scriptDiagnostics.hasErrors, "a script was refused without an error")
        checkDiagnostics(scriptDiagnostics, source: parsed.source)

        if let policy = analysis.policy {
            report.compiled = true
            withExactCopy(input.body ?? []) { body in
                report.decisions = classify(policy.graph, input, body: body)
            }
        }
        // The shared-state codecs read what a hostile store hands them: the whole input, and the body.
        SharedStateFuzzing.exercise(Data(bytes))
        if let body = input.body {
            SharedStateFuzzing.exercise(Data(body))
            // The body as a token endpoint's answer, decoded and whole, as the refresh plugins read it.
            TokenAnswerFuzzing.exercise(Data(body))
        }
        if let body = input.body {
            report.scannedCodes = withExactCopy(body, scan)
        } else {
            report.scannedCodes = scan(bytes)
        }
        return report
    }

    // MARK: - Diagnostics

    static func checkDiagnostics(_ diagnostics: [Diagnostic], source: String) {
        let renderer = DiagnosticRenderer(colour: true)
        for diagnostic in diagnostics {
            let start = diagnostic.range.start
            check(start.line >= 1 && start.column >= 1, "diagnostic at \(start): \(diagnostic)")
            check(
                !diagnostic.rule.isEmpty && diagnostic.rule.utf8.allSatisfy(isRuleIDByte),
                "rule id '\(diagnostic.rule)' is not kebab-case")
            check(!diagnostic.message.isEmpty, "empty message: \(diagnostic)")
            _ = renderer.render(diagnostic, source: source)
            check(DiagnosticRenderer.snippet(source, at: start) != nil, "no source line for \(diagnostic)")
        }
    }

    private static func isRuleIDByte(_ byte: UInt8) -> Bool {
        (byte >= UInt8(ascii: "a") && byte <= UInt8(ascii: "z"))
            || (byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9"))
            || byte == UInt8(ascii: "-")
    }

    // MARK: - Classification

    /// Classifies the input's response in every scope and checks each answer against ``FirstMatch``.
    static func classify(_ graph: RuleGraph, _ input: FuzzInput, body: UnsafeRawBufferPointer) -> [String] {
        let scopes = graph.scopes
        check(!scopes.isEmpty && scopes[scopes.count - 1].route == nil, "the last scope is not the top level")
        let chosen = graph.scope(method: input.method, path: input.path)
        let expectedScope = FirstMatch.scope(scopes, method: input.method, path: input.path)
        check(
            chosen.id == scopes[expectedScope].id, "request went to scope \(chosen.id), not \(scopes[expectedScope].id)"
        )

        var decisions: [String] = []
        checkFlow(graph)
        for scope in scopes {
            _ = WorstCase(scope: scope)
            let code = engineCode(scope, body: body, headers: input.headers)
            // The input's status, fixed ones, and each of the first rules' codes, so code tables are hit
            // even when the body names none.
            var probes = ([input.status] + statuses).map { (status: $0, code: code) }
            for rule in scope.rules.prefix(8) {
                if let first = rule.when.codes?.first { probes.append((input.status, first)) }
            }
            for (index, probe) in probes.enumerated() {
                let answer = scope.classifier.match(
                    status: probe.status, code: probe.code, headers: input.headers, method: input.method,
                    path: input.path)
                let expected = FirstMatch.response(
                    scope.rules, status: probe.status, code: probe.code, headers: input.headers, method: input.method,
                    path: input.path)
                check(
                    answer == expected,
                    "\(scope.id): status \(probe.status) code \(probe.code.map { "'\($0)'" } ?? "none") matched rule "
                        + "\(answer.map(String.init) ?? "none"), first match is \(expected.map(String.init) ?? "none")")
                if index == 0 {
                    let rule = answer.map { scope.rules[$0].name } ?? "deliver"
                    decisions.append(
                        "\(scope.id): \(probe.status) code \(probe.code.map { "'\($0)'" } ?? "none") -> \(rule)")
                }
            }
            for errorClass in TransportErrorClass.allCases {
                let answer = scope.classifier.match(error: errorClass, method: input.method, path: input.path)
                let expected = FirstMatch.error(scope.rules, errorClass, method: input.method, path: input.path)
                check(
                    answer == expected,
                    "\(scope.id): error \(errorClass) matched rule \(answer.map(String.init) ?? "none"), "
                        + "first match is \(expected.map(String.init) ?? "none")")
            }
        }
        return decisions
    }

    /// The compiled flow is whole: every edge the engine can follow from a rule is an edge of the
    /// graph, leaves the rule's action node and leads to a node of the graph; every node but a
    /// classifier has an edge into it (no orphan).
    static func checkFlow(_ graph: RuleGraph) {
        let ids = Set(graph.nodes.map(\.id))
        let edges = Set(graph.edges)
        let targets = Set(graph.edges.map(\.to))
        for node in graph.nodes where node.kind != .classifier {
            check(targets.contains(node.id), "node \(node.id) has no edge into it")
        }
        for edge in graph.edges {
            check(ids.contains(edge.from) && ids.contains(edge.to), "edge \(edge.id) names a missing node")
        }
        for scope in graph.scopes {
            check(scope.compiled.count == scope.rules.count, "\(scope.id): a rule was not compiled")
            for flow in scope.compiled {
                let followed =
                    [
                        flow.onExhausted, flow.onFailure, flow.refreshAnswer, flow.budget, flow.notRetryable,
                        flow.deadline,
                    ].compactMap { $0?.edge } + [flow.again].compactMap { $0 }
                for edge in followed {
                    check(
                        edges.contains(edge), "\(scope.id): rule \(flow.index + 1) follows \(edge.id), not in the graph"
                    )
                    check(edge.from == flow.actionNode, "\(scope.id): \(edge.id) does not leave \(flow.actionNode)")
                }
            }
        }
    }

    /// The business code as `PolicyRuntime.code(of:scopeIndex:scanLimit:)` finds it; a host
    /// extractor plugin is not run (the harness has none), so its code is `nil`.
    static func engineCode(_ scope: RuleGraph.Scope, body: UnsafeRawBufferPointer, headers: HTTPHeaders) -> String? {
        switch scope.classify {
        case nil, .plugin: return nil
        case .header(let name): return headers[name]
        case .body:
            guard let path = scope.codePath else { return nil }
            let code = JSONCodeScanner.code(in: body, at: path, maxBytes: scanLimit)
            let raw = JSONCodeScanner.withCode(in: body, at: path, maxBytes: scanLimit) { bytes in
                bytes.map { String(decoding: $0, as: UTF8.self) }
            }
            check(code == raw, "code() found \(String(describing: code)), withCode() \(String(describing: raw))")
            return code
        }
    }

    // MARK: - JSON code scanner

    /// Scans `body` at every fixed path, checking the truncation and `maxBytes` contracts.
    static func scan(_ body: UnsafeRawBufferPointer) -> [String?] {
        compiledScannerPaths.map { path in
            let count = body.count
            let full = JSONCodeScanner.code(in: body, at: path, maxBytes: max(count, 1))
            let raw = JSONCodeScanner.withCode(in: body, at: path, maxBytes: max(count, 1)) { bytes in
                bytes.map { String(decoding: $0, as: UTF8.self) }
            }
            check(full == raw, "code() and withCode() disagree at '\(path.segments)'")
            check(JSONCodeScanner.code(in: body, at: path, maxBytes: 0) == nil, "maxBytes 0 found a code")
            for cut in Set([1, 2, 3, 7, 8, 9, 16, count / 2, count - 1]) where cut > 0 && cut < count {
                // A body longer than the limit is not read: no code, whatever it holds.
                let limited = JSONCodeScanner.code(in: body, at: path, maxBytes: cut)
                check(
                    limited == nil, "a \(count)-byte body read with maxBytes \(cut) gave \(String(describing: limited))"
                )
                // A prefix is a document of its own (usually not valid JSON); it never reads past its end
                // (the exact copy makes an over-read an AddressSanitizer report).
                _ = withExactCopy(Array(body.prefix(cut))) { prefix in
                    JSONCodeScanner.code(in: prefix, at: path, maxBytes: scanLimit)
                }
            }
            // The reference: a plain recursive parser with the same rules (valid JSON, last key wins).
            if count <= 4_096 {
                let expected = ReferenceJSON.code(in: Array(body), at: path)
                check(
                    full == expected, "scanner \(String(describing: full)), reference \(String(describing: expected))")
            }
            return full
        }
    }

    // MARK: - Helpers

    /// Calls `body` with a heap copy of exactly `bytes.count` bytes, so any read past the end is an
    /// AddressSanitizer report (an `Array`'s storage may have spare capacity after its last byte).
    static func withExactCopy<R>(_ bytes: [UInt8], _ body: (UnsafeRawBufferPointer) -> R) -> R {
        guard !bytes.isEmpty else { return body(UnsafeRawBufferPointer(start: nil, count: 0)) }
        let copy = UnsafeMutableRawBufferPointer.allocate(byteCount: bytes.count, alignment: 1)
        defer { copy.deallocate() }
        copy.copyBytes(from: bytes)
        return body(UnsafeRawBufferPointer(copy))
    }

    static func check(_ condition: Bool, _ message: @autoclosure () -> String) {
        if !condition { fatalError("policy-fuzz oracle: \(message())") }
    }
}
