import Foundation
import Testing

@testable import ResponsePolicy

/// Expectations of simulation scripts, parsed and checked as values over hand-made event streams.
struct ExpectationCheckerTests {
    static func expectations(_ yaml: String) throws -> SimulationExpectations {
        let parsed = Policy.parse(bytes: Array(yaml.utf8), limits: .default)
        let (expectations, diagnostics) = SimulationExpectations.parse(parsed, file: "s.yaml")
        #expect(diagnostics.isEmpty)
        return expectations
    }

    static func event(
        _ kind: PolicyEvent.Kind, _ request: String?, at ms: Int = 0, status: Int? = nil,
        result: PolicyEvent.Result? = nil
    ) -> PolicyEvent {
        var event = PolicyEvent(kind, time: .milliseconds(ms), request: request)
        event.status = status
        event.result = result
        return event
    }

    @Test func repeatedRequestsExpectTheSameOfEveryCopy() throws {
        let expectations = try Self.expectations(
            """
            policy: p.yaml
            requests:
              - { id: b, repeat: 3, responses: [{ status: 200 }], expect: { outcome: delivered, attempts: 1 } }

            """)
        #expect(expectations.policy == "p.yaml")
        #expect(expectations.requests.map(\.id) == ["b-1", "b-2", "b-3"])
        var checker = ExpectationChecker(expectations)
        for id in ["b-1", "b-2", "b-3"] {
            checker.observe(Self.event(.send, id))
            checker.observe(Self.event(.outcome, id, status: 200, result: id == "b-2" ? .failed : .delivered))
        }
        let failures = checker.failures(summary: Simulator.Summary())
        #expect(failures.map(\.message) == ["request 'b-2': expected outcome 'delivered', got 'failed'"])
        #expect(failures.first?.range.start == SourcePosition(line: 3, column: 63))
    }

    @Test func eventsMatchInOrderWithOthersBetween() throws {
        let expectations = try Self.expectations(
            """
            requests: [{ id: a, responses: [{ status: 200 }] }]
            expect:
              events:
                - { request: a, event: send }
                - { event: refresh-start }
                - { request: a, event: outcome, result: delivered }

            """)
        var inOrder = ExpectationChecker(expectations)
        for event in [
            Self.event(.send, "a"), Self.event(.response, "a", status: 401), Self.event(.refreshStart, "a"),
            Self.event(.send, "a"), Self.event(.outcome, "a", result: .delivered),
        ] {
            inOrder.observe(event)
        }
        #expect(inOrder.failures(summary: Simulator.Summary()) == [])

        var outOfOrder = ExpectationChecker(expectations)
        for event in [
            Self.event(.refreshStart, "a"), Self.event(.send, "a"), Self.event(.outcome, "a", result: .delivered),
        ] {
            outOfOrder.observe(event)
        }
        let failures = outOfOrder.failures(summary: Simulator.Summary())
        #expect(failures.count == 1)
        #expect(
            failures.first?.message
                == "expected event 2 of 3, { event: refresh-start }, did not occur after event 1 matched")
        #expect(failures.first?.context.map(\.kind) == [.send, .outcome])
    }

    /// The checker keeps a bounded window, however long the run: a streamed simulation never
    /// has to keep its events for the expectations' sake.
    @Test func contextStaysBoundedOnALongRun() throws {
        let expectations = try Self.expectations(
            """
            requests: [{ id: a, responses: [{ status: 200 }], expect: delivered }]
            expect:
              events: [{ request: a, event: logout }]

            """)
        var checker = ExpectationChecker(expectations)
        for index in 0..<100_000 { checker.observe(Self.event(.send, "a", at: index)) }
        let failures = checker.failures(summary: Simulator.Summary())
        #expect(failures.count == 2)
        #expect(failures.allSatisfy { $0.context.count <= ExpectationChecker.contextSize })
        #expect(failures.first?.message == "request 'a' has no outcome; the run ended first")
    }

    @Test func summaryCountersAreCompared() throws {
        let expectations = try Self.expectations(
            "requests: [{ id: a, responses: [{ status: 200 }] }]\nexpect: { summary: { refreshes: 1, attempts: 2 } }\n")
        var summary = Simulator.Summary()
        summary.refreshes = 1
        summary.attempts = 3
        let failures = ExpectationChecker(expectations).failures(summary: summary)
        #expect(failures.map(\.message) == ["summary: expected attempts 2, got 3"])
    }
}
