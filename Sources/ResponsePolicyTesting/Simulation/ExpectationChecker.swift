import ResponsePolicy

/// Checks a run against ``SimulationExpectations`` as its events arrive.
///
/// It keeps only what the expectations need: per expected request its attempt count, its
/// outcome and its last few events; for the expected event sequence the position reached and a
/// few events since the last match. Memory is bounded by the expectations, not by the run, so a
/// simulation that streams its events never has to keep them.
///
/// ```swift
/// var checker = ExpectationChecker(expectations)
/// for event in events { checker.observe(event) }
/// let failures = checker.failures(summary: result.summary)
/// ```
///
/// Concurrency contract: a value type; feed it from one thread, in event order.
package struct ExpectationChecker: Sendable {
    /// One unmet expectation: where the script states it, what it said and what happened,
    /// and the events that show where the run went another way.
    package struct Failure: Sendable, Equatable {
        package var range: SourceRange
        package var message: String
        /// What to show under the message, in order.
        package var context: [PolicyEvent]
        /// Says what `context` is: `events of 'a'`.
        package var contextTitle: String
    }

    struct Track: Sendable {
        var attempts = 0
        var outcome: PolicyEvent?
        var recent: [PolicyEvent] = []
    }

    /// How many events of a request, or after the last matched event, a failure shows.
    package static let contextSize = 6

    let expectations: SimulationExpectations
    private var tracks: [String: Track] = [:]
    private var nextEvent = 0
    private var lastMatched: PolicyEvent?
    private var sinceMatch: [PolicyEvent] = []

    package init(_ expectations: SimulationExpectations) {
        self.expectations = expectations
        for request in expectations.requests { tracks[request.id] = Track() }
    }

    /// Takes the run's next event; in a fleet, `process` names whose it is and the event's
    /// `request` is `process/request`.
    package mutating func observe(_ event: PolicyEvent, process: String? = nil) {
        if let id = event.request, var track = tracks[id] {
            if event.kind == .send { track.attempts += 1 }
            if event.kind == .outcome, track.outcome == nil { track.outcome = event }
            if track.outcome == nil || event.kind == .outcome {
                Self.keepLast(&track.recent, event)
            }
            tracks[id] = track
        }
        guard nextEvent < expectations.events.count else { return }
        let expected = expectations.events[nextEvent]
        if expected.matches(event, process: process) {
            nextEvent += 1
            lastMatched = event
            sinceMatch = []
        } else if expected.request == nil || expected.request == event.request,
            sinceMatch.count < Self.contextSize
        {
            sinceMatch.append(event)
        }
    }

    /// Every unmet expectation, in the order the script states them.
    package func failures(summary: Simulator.Summary) -> [Failure] {
        failures(value: { SimulationExpectations.value($0, in: summary) }, processValue: { _, _ in nil })
    }

    /// Every unmet expectation of a fleet run: `value` reads the fleet summary by its script name,
    /// `processValue` a process's (nil for a process the run does not know).
    package func failures(value: (String) -> Int, processValue: (String, String) -> Int?) -> [Failure] {
        var failures: [Failure] = []
        for request in expectations.requests {
            let track = tracks[request.id] ?? Track()
            let context = Failure.Context(events: track.recent, title: "last events of '\(request.id)'")
            guard let outcome = track.outcome else {
                failures.append(
                    Failure(
                        range: request.range, message: "request '\(request.id)' has no outcome; the run ended first",
                        context: context.events, contextTitle: context.title))
                continue
            }
            var wrong: [String] = []
            if let expected = request.outcome, outcome.result != expected {
                var text = "outcome '\(expected.rawValue)', got '\(outcome.result?.rawValue ?? "none")'"
                if expected == .cancelled, outcome.result == .loggedOut {
                    text +=
                        " (a request a logout ends, on the wire, waiting or refused during the cooldown, has the "
                        + "outcome 'logged-out'; 'cancelled' is for a caller that cancels its own request)"
                }
                wrong.append(text)
            }
            if let expected = request.status, outcome.status != expected {
                wrong.append("status \(expected), got \(outcome.status.map(String.init) ?? "no response")")
            }
            if let expected = request.code, outcome.code != expected {
                wrong.append("code '\(expected)', got \(outcome.code.map { "'\($0)'" } ?? "no code")")
            }
            if let expected = request.attempts, track.attempts != expected {
                wrong.append("\(expected) attempt\(expected == 1 ? "" : "s"), got \(track.attempts)")
            }
            if !wrong.isEmpty {
                failures.append(
                    Failure(
                        range: request.range,
                        message: "request '\(request.id)': expected " + wrong.joined(separator: "; expected "),
                        context: context.events, contextTitle: context.title))
            }
        }
        for (key, expected, range) in expectations.summary {
            let actual = value(key)
            if actual != expected {
                failures.append(
                    Failure(
                        range: range, message: "summary: expected \(key) \(expected), got \(actual)", context: [],
                        contextTitle: ""))
            }
        }
        for (process, key, expected, range) in expectations.processSummaries {
            let actual = processValue(process, key)
            if actual != expected {
                failures.append(
                    Failure(
                        range: range,
                        message:
                            "process '\(process)': expected \(key) \(expected), got \(actual.map(String.init) ?? "no such process")",
                        context: [], contextTitle: ""))
            }
        }
        if nextEvent < expectations.events.count {
            let expected = expectations.events[nextEvent]
            let position = "expected event \(nextEvent + 1) of \(expectations.events.count)"
            let after = nextEvent == 0 ? "" : " after event \(nextEvent) matched"
            let whose = expected.request.map { "events of '\($0)'" } ?? "events"
            failures.append(
                Failure(
                    range: expected.range, message: "\(position), \(expected), did not occur\(after)",
                    context: (lastMatched.map { [$0] } ?? []) + sinceMatch,
                    contextTitle: nextEvent == 0 ? "first \(whose)" : "last match, then \(whose)"))
        }
        return failures.sorted { $0.range.start < $1.range.start }
    }

    private static func keepLast(_ list: inout [PolicyEvent], _ event: PolicyEvent) {
        if list.count == contextSize { list.removeFirst() }
        list.append(event)
    }
}

extension ExpectationChecker.Failure {
    struct Context {
        var events: [PolicyEvent]
        var title: String
    }
}

extension SimulationExpectations {
    /// A summary counter by its script name.
    static func value(_ key: String, in summary: Simulator.Summary) -> Int {
        switch key {
        case "requests": return summary.requests
        case "delivered": return summary.delivered
        case "failed": return summary.failed
        case "logged-out": return summary.loggedOut
        case "cancelled": return summary.cancelled
        case "refreshes": return summary.refreshes
        case "logouts": return summary.logouts
        default: return summary.attempts
        }
    }
}
