import Foundation
import ResponsePolicy

/// Runs a policy against a scripted server on a virtual clock, from a service's own tests: the
/// same engine, script format and expectations as `policy simulate` and `policy test`.
///
/// Why: a service that registers its own plugins or ships its own policy wants to pin what the
/// policy does (one refresh for a storm, a logout on its revoked code) in its own test suite,
/// without a network or real sleeping. The script format is in docs/commands.md
/// ("policy simulate"); a script's `expect:` entries are checked and reported in ``Result/unmet``.
///
/// ```swift
/// import ResponsePolicy
/// import ResponsePolicyTesting
///
/// let policy = try Policy.load(contentsOf: policyURL)
/// let result = try await PolicySimulation.run(policy: policy, script: """
///     requests:
///       - { id: a, responses: [{ body: '{"status":1401}' }, { body: '{"status":0}' }], expect: delivered }
///     refresh: [{ after: 100ms, result: ok }]
///     """)
/// #expect(result.unmet.isEmpty)
/// #expect(result.summary.refreshes == 1)
/// ```
///
/// Concurrency contract: any number of runs may go at once; each runs on a thread of its own
/// with its own ``VirtualClock``, so a run never waits on real time.
public enum PolicySimulation {
    /// What a run did, counted as `policy simulate --format json` prints its last line.
    public struct Summary: Sendable, Equatable {
        /// Requests the script sent.
        public var requests: Int
        /// Requests that ended with a response.
        public var delivered: Int
        /// Requests that ended with an error.
        public var failed: Int
        /// Requests that ended because the session was logged out.
        public var loggedOut: Int
        /// Requests that ended cancelled.
        public var cancelled: Int
        /// Calls to the refresh plugin (the script's `refresh:` steps).
        public var refreshes: Int
        /// Times the session was logged out.
        public var logouts: Int
        /// Requests put on the wire, those later cancelled included.
        public var attempts: Int
    }

    /// What only a fleet script (`processes:`) has: each process's summary and what the shared
    /// token server and store saw.
    public struct Fleet: Sendable, Equatable {
        /// Each process's own counters, by process id.
        public var processes: [String: Summary]
        /// Calls that reached the token server.
        public var tokenCalls: Int
        /// Spent refresh tokens presented again (each revokes the token family).
        public var reuses: Int
        /// Refresh leases the store granted.
        public var leases: Int
        /// Processes the script restarted (`restart:`).
        public var restarts: Int
        /// Processes the script killed (`kill:`).
        public var kills: Int
    }

    /// A run's events in order, its summary, and the script's expectations it did not meet.
    public struct Result: Sendable {
        /// In a fleet script, each event's `request` is `process/request`, and events of no
        /// request are left out.
        public var events: [PolicyEvent]
        /// In a fleet script, the processes' counters summed.
        public var summary: Summary
        /// A fleet script's own counters; `nil` for a one-process script.
        public var fleet: Fleet?
        /// One line per unmet `expect:` entry, `FILE:LINE:COL: what was expected, what happened`;
        /// empty when every expectation held (or the script states none).
        public var unmet: [String]
    }

    /// Why a run could not be made or finished.
    public enum Failure: Error, Equatable, CustomStringConvertible {
        /// The script has errors (every one, positioned).
        case invalidScript([Diagnostic])
        /// The run stopped: it stalled, passed its virtual time limit or put too many attempts
        /// on the wire.
        case stopped(String)

        /// The script's errors, one per line, or why the run stopped.
        public var description: String {
            switch self {
            case .invalidScript(let diagnostics):
                return "the simulation script has errors:\n"
                    + diagnostics.filter { $0.severity == .error }.map(\.description).joined(separator: "\n")
            case .stopped(let reason): return reason
            }
        }
    }

    /// Runs `script` (YAML text) under `policy`.
    ///
    /// - Parameters:
    ///   - policy: a loaded policy; the script's own `policy:` is not read.
    ///   - script: the simulation script.
    ///   - file: names the script in diagnostics and unmet expectations; `"script"` by default.
    ///   - loadPolicy: loads the files a script's `reload:` steps name; `Policy.load(path:)` by default.
    /// - Throws: ``Failure``.
    public static func run(
        policy: Policy, script: String, file: String = "script",
        loadPolicy: @escaping @Sendable (String) throws(PolicyError) -> Policy = { path throws(PolicyError) in
            try Policy.load(path: path)
        }
    ) async throws(Failure) -> Result {
        let parsed = Policy.parse(bytes: Array(script.utf8), limits: .default)
        let (decoded, diagnostics) = SimulationScript.parse(parsed, file: file)
        let (expectations, expectationDiagnostics) = SimulationExpectations.parse(parsed, file: file)
        let errors = (diagnostics + expectationDiagnostics).filter { $0.severity == .error }
        guard let decoded, errors.isEmpty else { throw .invalidScript(errors) }
        if decoded.fleet != nil { return try await runFleet(policy: policy, script: decoded, expectations, file: file) }
        let result: Simulator.Result
        do {
            result = try await Simulator.run(policy: policy, script: decoded, loadPolicy: loadPolicy)
        } catch {
            throw .stopped(error.description)
        }
        var checker = ExpectationChecker(expectations)
        for event in result.events { checker.observe(event) }
        let unmet = checker.failures(summary: result.summary).map {
            "\(file):\($0.range.start.line):\($0.range.start.column): \($0.message)"
        }
        let s = result.summary
        return Result(
            events: result.events,
            summary: Summary(
                requests: s.requests, delivered: s.delivered, failed: s.failed, loggedOut: s.loggedOut,
                cancelled: s.cancelled, refreshes: s.refreshes, logouts: s.logouts, attempts: s.attempts),
            unmet: unmet)
    }

    /// A fleet script's run (docs/commands.md, "Fleet scripts").
    static func runFleet(
        policy: Policy, script: SimulationScript, _ expectations: SimulationExpectations, file: String
    ) async throws(Failure) -> Result {
        let result: FleetSimulator.Result
        do {
            result = try await FleetSimulator.run(policy: policy, script: script)
        } catch {
            throw .stopped(error.description)
        }
        var checker = ExpectationChecker(expectations)
        var events: [PolicyEvent] = []
        for line in result.lines {
            guard case .engine(let process, var event) = line else { continue }
            event.request = event.request.map { "\(process)/\($0)" }
            checker.observe(event, process: process)
            if event.request != nil { events.append(event) }
        }
        let fleet = result.summary
        let unmet = checker.failures(value: { fleet.value($0) }, processValue: { fleet.value($1, of: $0) }).map {
            "\(file):\($0.range.start.line):\($0.range.start.column): \($0.message)"
        }
        func summary(_ s: Simulator.Summary) -> Summary {
            Summary(
                requests: s.requests, delivered: s.delivered, failed: s.failed, loggedOut: s.loggedOut,
                cancelled: s.cancelled, refreshes: s.refreshes, logouts: s.logouts, attempts: s.attempts)
        }
        return Result(
            events: events, summary: summary(fleet.total),
            fleet: Fleet(
                processes: Dictionary(uniqueKeysWithValues: fleet.processes.map { ($0.process, summary($0.summary)) }),
                tokenCalls: fleet.tokenCalls, reuses: fleet.reuses, leases: fleet.leases, restarts: fleet.restarts,
                kills: fleet.kills),
            unmet: unmet)
    }
}
