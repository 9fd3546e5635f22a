/// What a simulation script says must happen, for `policy test`: the policy it runs under
/// (`policy:`, relative to the script), each request's outcome (`expect:` on a request), the run's
/// summary and events that must occur in order (a top-level `expect:`).
///
/// Kept apart from ``SimulationScript`` on purpose: the script model says what to run, this says
/// what to check, and ``ExpectationChecker`` checks it over the event stream as events arrive,
/// so a run's events never have to be kept.
///
/// ```yaml
/// policy: ../policies/default.yaml
/// requests:
///   - { id: a, at: 0s, responses: [{ status: 200, body: '{"status":1401}' }, { status: 200 }], expect: delivered }
///   - { id: b, at: 0s, responses: [{ status: 503 }], expect: { outcome: delivered, status: 503, attempts: 4 } }
/// expect:
///   summary: { refreshes: 1 }
///   events:
///     - { request: a, event: refresh-start }
/// ```
package struct SimulationExpectations: Sendable {
    /// One request's expected end. `nil` fields are not checked.
    package struct Request: Sendable, Equatable {
        package var id: String
        package var outcome: PolicyEvent.Result?
        package var status: Int?
        package var code: String?
        package var attempts: Int?
        package var range: SourceRange
    }

    /// An event that must occur; only the fields given are compared.
    package struct Event: Sendable, Equatable, CustomStringConvertible {
        /// In a fleet script, the process whose event it is; `request` is then `process/request`.
        package var process: String?
        package var request: String?
        package var kind: PolicyEvent.Kind?
        package var attempt: Int?
        package var status: Int?
        package var code: String?
        package var rule: String?
        package var action: ActionKind?
        package var ok: Bool?
        package var result: PolicyEvent.Result?
        package var range: SourceRange

        /// Whether `event` (of `process`, in a fleet) is this one.
        package func matches(_ event: PolicyEvent, process observed: String? = nil) -> Bool {
            if let process, observed != process { return false }
            if let request, event.request != request { return false }
            if let kind, event.kind != kind { return false }
            if let attempt, event.attempt != attempt { return false }
            if let status, event.status != status { return false }
            if let code, event.code != code { return false }
            if let rule, event.rule != rule { return false }
            if let action, event.action != action { return false }
            if let ok, event.ok != ok { return false }
            if let result, event.result != result { return false }
            return true
        }

        /// `{ request: a, event: refresh-start }`, the way the script writes it.
        package var description: String {
            var fields: [String] = []
            if let process { fields.append("process: \(process)") }
            if let request {
                let written = process.map {
                    request.hasPrefix($0 + "/") ? String(request.dropFirst($0.count + 1)) : request
                }
                fields.append("request: \(written ?? request)")
            }
            if let kind { fields.append("event: \(kind.rawValue)") }
            if let attempt { fields.append("attempt: \(attempt)") }
            if let status { fields.append("status: \(status)") }
            if let code { fields.append("code: \(code)") }
            if let rule { fields.append("rule: \(rule)") }
            if let action { fields.append("action: \(action.rawValue)") }
            if let ok { fields.append("ok: \(ok)") }
            if let result { fields.append("result: \(result.rawValue)") }
            return "{ " + fields.joined(separator: ", ") + " }"
        }
    }

    /// The policy the script runs under, as written (relative to the script), and where.
    package var policy: String?
    package var policyRange: SourceRange?
    package var requests: [Request] = []
    /// Summary counters that must have these values, in the order written.
    package var summary: [(key: String, value: Int, range: SourceRange)] = []
    package var events: [Event] = []
    /// In a fleet script, a process's own summary counters (its `expect: { summary: … }`).
    package var processSummaries: [(process: String, key: String, value: Int, range: SourceRange)] = []

    /// Whether the script states anything to check.
    package var isEmpty: Bool { requests.isEmpty && summary.isEmpty && events.isEmpty && processSummaries.isEmpty }

    /// The top-level keys a script may carry for `policy test`.
    package static let scriptKeys = ["policy", "expect"]
    /// The keys a request may carry for `policy test`.
    package static let requestKeys = ["expect"]
    static let summaryKeys = [
        "requests", "delivered", "failed", "logged-out", "cancelled", "refreshes", "logouts", "attempts",
    ]
    /// The fleet summary's counters beyond a process's (docs/commands.md, "Fleet scripts").
    package static let fleetSummaryKeys = ["processes", "token-calls", "reuses", "leases", "restarts", "kills"]
    static let eventKeys = [
        "process", "request", "event", "attempt", "status", "code", "rule", "action", "ok", "result",
    ]
    static let outcomes = ["delivered", "failed", "logged-out", "cancelled"]

    /// Reads the expectations of a parsed script; problems are positioned diagnostics.
    package static func parse(_ parsed: Policy.Parsed, file: String?) -> (SimulationExpectations, [Diagnostic]) {
        var decoder = PolicyDecoder(catalog: PluginCatalog())
        var expectations = SimulationExpectations()
        if let root = parsed.root { decoder.expectations(root, into: &expectations) }
        let diagnostics = decoder.diagnostics.sortedByPosition().map { d -> Diagnostic in
            var copy = d
            copy.file = file
            return copy
        }
        return (expectations, diagnostics)
    }
}

extension PolicyDecoder {
    /// Reads `policy:`, the requests' `expect:` and the top-level `expect:`. Everything else in
    /// the script is ``script(_:)``'s to check.
    mutating func expectations(_ root: YAMLNode, into expectations: inout SimulationExpectations) {
        guard let pairs = root.pairs else { return }
        for pair in pairs {
            switch pair.key.scalar {
            case "policy":
                if let path = string(pair.value, "policy") {
                    expectations.policy = path
                    expectations.policyRange = pair.value.range
                }
            case "requests":
                for item in pair.value.items ?? [] { requestExpectation(item, into: &expectations) }
            case "processes":
                for item in pair.value.items ?? [] { processExpectations(item, into: &expectations) }
            case "expect":
                guard let fields = mappingFields(pair.value, "'expect'", allowed: ["summary", "events"]) else {
                    continue
                }
                let fleet = pairs.contains { $0.key.scalar == "processes" }
                for (key, _, value) in fields {
                    if key == "summary" { summaryExpectation(value, fleet: fleet, into: &expectations) }
                    if key == "events" {
                        for item in list(value, "events") ?? [] {
                            if let event = eventExpectation(item) { expectations.events.append(event) }
                        }
                    }
                }
            default: continue
            }
        }
    }

    /// A fleet process's expectations: its requests' `expect:` (named `process/request`) and its
    /// own `expect: { summary: … }`. A process with `repeat: N` expects the same of each copy.
    mutating func processExpectations(_ node: YAMLNode, into expectations: inout SimulationExpectations) {
        guard let pairs = node.pairs, let id = pairs.first(where: { $0.key.scalar == "id" })?.value.scalar else {
            return
        }
        let copies = pairs.first(where: { $0.key.scalar == "repeat" })?.value.scalar.flatMap { Int($0) }
        let ids =
            copies.map { count in
                count >= 1 && count <= FleetScript.maxProcesses ? (1...count).map { "\(id)-\($0)" } : []
            } ?? [id]
        var own = SimulationExpectations()
        for item in pairs.first(where: { $0.key.scalar == "requests" })?.value.items ?? [] {
            requestExpectation(item, into: &own)
        }
        if let expect = pairs.first(where: { $0.key.scalar == "expect" })?.value,
            let fields = mappingFields(expect, "a process's 'expect'", allowed: ["summary"])
        {
            for (_, _, value) in fields {
                summaryExpectation(value, fleet: false, into: &own)
            }
        }
        // Past the script's bound the script itself is refused (`too-many-requests`); its
        // expectations are not multiplied out.
        guard expectations.requests.count + ids.count * own.requests.count <= SimulationScript.maxRequests else {
            return
        }
        for process in ids {
            for request in own.requests {
                var copy = request
                copy.id = "\(process)/\(request.id)"
                expectations.requests.append(copy)
            }
            for entry in own.summary {
                expectations.processSummaries.append((process, entry.key, entry.value, entry.range))
            }
        }
    }

    /// A request's `expect:`: an outcome, or `{ outcome, status, code, attempts }`. A request
    /// with `repeat: N` expects the same of each copy.
    mutating func requestExpectation(_ node: YAMLNode, into expectations: inout SimulationExpectations) {
        guard let pairs = node.pairs, let expect = pairs.first(where: { $0.key.scalar == "expect" })?.value,
            let id = pairs.first(where: { $0.key.scalar == "id" })?.value.scalar
        else { return }
        var expected = SimulationExpectations.Request(id: id, range: expect.range)
        if expect.pairs == nil {
            guard let outcome = outcome(expect, "expect") else { return }
            expected.outcome = outcome
        } else {
            let keys = ["outcome", "status", "code", "attempts"]
            guard let fields = mappingFields(expect, "a request's 'expect'", allowed: keys) else { return }
            for (key, _, value) in fields {
                switch key {
                case "outcome": expected.outcome = outcome(value, key)
                case "status": expected.status = integer(value, key, in: 100...599)
                case "code": expected.code = string(value, key)
                default: expected.attempts = integer(value, key, in: 0...Int.max)
                }
            }
        }
        let copies = pairs.first(where: { $0.key.scalar == "repeat" })?.value.scalar.flatMap { Int($0) }
        guard let copies, copies >= 1, copies <= SimulationScript.maxRequests else {
            expectations.requests.append(expected)
            return
        }
        for index in 1...copies {
            var copy = expected
            copy.id = "\(id)-\(index)"
            expectations.requests.append(copy)
        }
    }

    mutating func summaryExpectation(
        _ node: YAMLNode, fleet: Bool = false, into expectations: inout SimulationExpectations
    ) {
        let allowed = SimulationExpectations.summaryKeys + (fleet ? SimulationExpectations.fleetSummaryKeys : [])
        guard let fields = mappingFields(node, "'summary'", allowed: allowed) else { return }
        for (key, keyNode, value) in fields {
            if let number = integer(value, key, in: 0...Int.max) {
                expectations.summary.append((key, number, keyNode.range))
            }
        }
    }

    mutating func eventExpectation(_ node: YAMLNode) -> SimulationExpectations.Event? {
        guard let fields = mappingFields(node, "an expected event", allowed: SimulationExpectations.eventKeys)
        else { return nil }
        var event = SimulationExpectations.Event(range: node.range)
        for (key, _, value) in fields {
            switch key {
            case "process": event.process = string(value, key)
            case "request": event.request = string(value, key)
            case "event":
                guard let text = string(value, key) else { continue }
                if let kind = PolicyEvent.Kind(rawValue: text) {
                    event.kind = kind
                } else {
                    let kinds = [
                        "send", "response", "wait", "queued", "held", "cancel", "outcome", "logout", "reload",
                        "problem",
                        "refresh-start", "refresh-end",
                    ]
                    report(Self.unknownValue(text, of: key, among: kinds, at: value.range))
                }
            case "attempt": event.attempt = integer(value, key, in: 1...Int.max)
            case "status": event.status = integer(value, key, in: 100...599)
            case "code": event.code = string(value, key)
            case "rule": event.rule = string(value, key)
            case "action": event.action = action(value, key)
            case "ok": event.ok = boolean(value, key)
            default: event.result = outcome(value, key)
            }
        }
        if let process = event.process, let request = event.request {
            event.request = "\(process)/\(request)"
        }
        if event == SimulationExpectations.Event(range: node.range) {
            report(.error("missing-key", "an expected event needs at least 'event:' or 'request:'", at: node.range))
            return nil
        }
        return event
    }

    mutating func outcome(_ node: YAMLNode, _ key: String) -> PolicyEvent.Result? {
        guard let text = string(node, key) else { return nil }
        guard let result = PolicyEvent.Result(rawValue: text) else {
            report(Self.unknownValue(text, of: key, among: SimulationExpectations.outcomes, at: node.range))
            return nil
        }
        return result
    }

    static func unknownValue(_ text: String, of key: String, among choices: [String], at range: SourceRange)
        -> Diagnostic
    {
        let hint =
            Suggestion.closest(to: text, in: choices).map { "; did you mean '\($0)'?" }
            ?? "; use one of \(choices.map { "'\($0)'" }.joined(separator: ", "))"
        return .error("invalid-value", "'\(key)' cannot be '\(text.truncatedForMessage)'\(hint)", at: range)
    }
}
