import ResponsePolicy
import Testing

// What the random-mix suites (`TransportRandomMixTests`, `EngineTransportMixTests`) share: their
// callers, each a sequence of calls run one after another, all at once; the check that every
// outcome is one its call allows; and the burst of calls afterwards that finds a place kept.

/// Runs each sequence on a task of its own, its calls one after another, every sequence at
/// once; returns each call with its outcome.
func runSequences<Call: Sendable, Outcome: Sendable>(
    _ sequences: [[Call]], _ run: @escaping @Sendable (Call) async -> Outcome
) async -> [(Call, Outcome)] {
    await withTaskGroup(of: [(Call, Outcome)].self) { group in
        for sequence in sequences {
            group.addTask {
                var ended: [(Call, Outcome)] = []
                for call in sequence { ended.append((call, await run(call))) }
                return ended
            }
        }
        return await group.reduce(into: [(Call, Outcome)]()) { $0 += $1 }
    }
}

/// One call of a mix: its id (in its URL, to find it among what the server received), its kind,
/// its request, and where a cancelled kind is cancelled.
struct MixCall<Kind: Hashable & CaseIterable & Sendable>: Sendable {
    var id: String
    var kind: Kind
    var request: HTTPRequest
    /// When a cancelled kind is cancelled: after this many yields (before or as it starts), or
    /// after `pause` (mostly on the wire). Either way every outcome it may have is checked; the
    /// pause only varies the point, nothing waits on it.
    var yields: Int
    var pause: Duration?
    /// Revokes the server's access token before it goes out (the engine's mix).
    var revokes = false
}

/// Expects every outcome to be one its call allows, and the calls to reach every kind; a failure
/// names `label`, the call's id and kind, and the outcome.
func expectAllowed<Kind, Outcome>(
    _ outcomes: [(MixCall<Kind>, Outcome)], label: String, allowed: (MixCall<Kind>, Outcome) -> Bool,
    sourceLocation: SourceLocation = #_sourceLocation
) {
    var seen: Set<Kind> = []
    for (call, outcome) in outcomes {
        seen.insert(call.kind)
        let ok = allowed(call, outcome)
        #expect(ok, "\(label) \(call.id) \(call.kind): \(outcome)", sourceLocation: sourceLocation)
    }
    #expect(seen == Set(Kind.allCases), "the seed reaches every kind: \(seen)", sourceLocation: sourceLocation)
}

/// How many of `count` calls made at once succeeded (`call` is given each one's index).
func succeedingAtOnce(_ count: Int, _ call: @escaping @Sendable (Int) async -> Bool) async -> Int {
    await withTaskGroup(of: Bool.self) { group in
        for index in 0..<count { group.addTask { await call(index) } }
        return await group.reduce(0) { $0 + ($1 ? 1 : 0) }
    }
}

/// Cancels `task` at a call's random point: after `pause` (mostly on the wire), or, without
/// one, after `yields` yields (before or as it starts). Nothing waits on the point itself.
func cancel<Success>(_ task: Task<Success, any Error>, after pause: Duration?, yields: Int) async {
    if let pause {
        try? await Task.sleep(for: pause)
    } else {
        for _ in 0..<yields { await Task.yield() }
    }
    task.cancel()
}
