import Foundation

/// One request of a recording, ready to be sent again on the virtual clock: a simulation script's
/// request (its time offset, method, path, and the recorded answer to each of its attempts) and
/// what the recording shows it came to.
package struct ReplayRequest: Sendable {
    package var request: SimulationScript.Request
    package var recorded: RecordedOutcome
    /// Where it starts in the recording (a HAR entry's line and column; an event line).
    package var position: TextPosition?
    /// For each recorded answer, which credential its attempt carried: 0 for the recording's
    /// first, 1 for the next one seen, …; `nil` when the recording does not show it. A replayed
    /// attempt signed after more refreshes than that skips the answers older credentials got.
    package var generations: [Int?] = []
}

/// What the recording shows a request came to: its last answer, and the result when the recording
/// says (the engine's own events do; a HAR shows only what the server answered, so the result is
/// what the live policy makes of that last answer).
package struct RecordedOutcome: Sendable, Equatable {
    package var result: PolicyEvent.Result?
    package var status: Int?
    package var code: String?
    package var error: TransportErrorClass?

    package init(
        result: PolicyEvent.Result? = nil, status: Int? = nil, code: String? = nil, error: TransportErrorClass? = nil
    ) {
        self.result = result
        self.status = status
        self.code = code
        self.error = error
    }
}

/// A call to the token endpoint the recording shows: when it started (on the recording's clock,
/// from its first request) and what a refresh at about that time gets.
package struct RecordedTokenCall: Sendable {
    package var at: Duration
    /// The answer, as a simulation script's refresh step (its `after`: the call's duration).
    /// Never carries a token: a 2xx answer becomes `ok` with the lifetime it gave.
    package var step: SimulationScript.RefreshStep
}

/// What a recording held, counted while it was read.
package struct ReplayStats: Sendable, Equatable {
    /// HAR entries, or event lines read.
    package var entries = 0
    package var requests = 0
    package var tokenCalls = 0
    package var logoutCalls = 0
    /// Entries that were neither (the page itself, data: URLs, lines that are not events).
    package var skipped = 0
    /// Requests whose chain of attempts was cut because more requests were open at once than
    /// ``ReplayLimits/maxOpenRequests``.
    package var forcedClosed = 0

    package init() {}
}

/// The bounds of a replay, so a huge or hostile recording costs bounded memory.
package struct ReplayLimits: Sendable {
    /// A body (request or response) keeps its first `1 MiB`, the engine's default
    /// ``PolicyEngine/Options/bodyScanLimit``: the engine reads a code only from a whole body of
    /// at most that length, and a body cut here is no longer JSON, so it has no code in the replay
    /// either.
    package var maxBodyBytes = ReplayLimits.engineScanLimit
    /// The engine's default ``PolicyEngine/Options/bodyScanLimit``, read once (not per response).
    package static let engineScanLimit = PolicyEngine.Options().bodyScanLimit
    /// Headers kept per message: `200`.
    package var maxHeaders = 200
    /// Any other string in an entry keeps its first `8 KiB`.
    package var maxStringBytes = 8_192
    /// Requests whose attempts are not all read yet, at once: `100,000` (past it the oldest is
    /// taken as complete).
    package var maxOpenRequests = 100_000
    /// Entries may be out of time order by at most this much (`5s`): they are sorted within it.
    package var reorderWindow: Duration = .seconds(5)
    /// An entry continues a request (its retry or re-send) only within this time of its last
    /// attempt's end: `60s` by default.
    package var continuationWindow: Duration = .seconds(60)
    /// The most attempts one request may have in a recording: `100`.
    package var maxAttemptsPerRequest = 100

    package init() {}
}

/// Recorded traffic, read a piece at a time: requests in the order they started, each complete
/// (every recorded attempt), and the token calls read so far.
///
/// Concurrency contract: one reader belongs to one replay; the replay calls it from its one
/// thread.
package protocol ReplaySource: AnyObject {
    /// The next request by start time, `nil` at the end.
    /// - Throws: ``ReplayInputError`` at a malformed place in the recording.
    func next() throws(ReplayInputError) -> ReplayRequest?
    /// Token calls read so far whose start is at or after `since` (older ones may be forgotten).
    func tokenCalls(since: Duration) -> [RecordedTokenCall]
    var stats: ReplayStats { get }
}

// MARK: - What the live policy makes of an answer

/// The live policy's view of one recorded answer, a lookup in its compiled flow (as the engine
/// classifies it): the rule it matches, its action, and the business code.
package struct ReplayVerdict: Sendable {
    package var code: String?
    package var action: ActionKind?
    /// How many times the rule lets a request go again (`max-retries` for a retry rule,
    /// `max-per-request` for a refresh rule); 0 for other actions.
    package var again: Int
    /// The attempt got no answer (a reset, a timeout, or a client that gave up on it).
    package var noAnswer = false

    /// What `policy` makes of `response` to `method path`.
    package init(policy: Policy, method: String, path: String, response: SimulationScript.Response) {
        let scope = policy.graph.scope(method: method, path: path)
        let headers = HTTPHeaders(response.headers)
        if let error = response.error {
            code = nil
            noAnswer = true
            let index = scope.classifier.match(error: error, method: method, path: path)
            action = index.map { scope.compiled[$0].action }
            again = index.map { scope.compiled[$0].retry.maxRetries } ?? 0
            return
        }
        switch scope.classify {
        case .header(let name)?: code = headers[name]
        case .body?:
            let body = Data(response.body.utf8)
            code = scope.codePath.flatMap { path in
                body.withUnsafeBytes { JSONCodeScanner.code(in: $0, at: path, maxBytes: ReplayLimits.engineScanLimit) }
            }
        default: code = nil
        }
        guard
            let index = scope.classifier.match(
                status: response.status, code: code, headers: headers, method: method, path: path)
        else {
            action = nil
            again = 0
            return
        }
        let flow = scope.compiled[index]
        action = flow.action
        switch flow.action {
        case .retry: again = flow.retry.maxRetries
        case .refresh: again = flow.refresh.maxPerRequest
        default: again = 0
        }
    }

    /// The result a request has when this answer is its last: delivered (no rule, or `deliver`),
    /// failed (`fail`), logged out (`logout`); `nil` for an answer the policy would not stop at.
    package var result: PolicyEvent.Result? {
        // No answer and no rule: a transport failure, or a caller that gave up (a logout's
        // cancellation looks the same on the wire), so the recording does not say which.
        if noAnswer, action == nil { return nil }
        switch action {
        case nil, .deliver?: return .delivered
        case .fail?: return .failed
        case .logout?: return .loggedOut
        case .retry?, .refresh?: return nil
        }
    }
}

// MARK: - Chains of attempts

/// Gathers recorded exchanges into requests: an exchange continues the oldest open request with
/// the same method, URL and body whose last answer the live policy sends again (a `retry` or
/// `refresh` rule with turns left) and whose last attempt ended before this one started, within
/// ``ReplayLimits/continuationWindow``; otherwise it starts a new request. A request is complete
/// when its last answer is one the policy stops at, when the window has passed, or at the end.
/// Complete requests leave in the order they started.
package struct ReplayChains {
    struct Chain {
        var number: Int
        var key: String
        var start: Double
        var method: String
        var path: String
        var headers: [(String, String)]
        var body: String?
        var responses: [SimulationScript.Response] = []
        var generations: [Int?] = []
        var lastEnd: Double
        var verdict: ReplayVerdict?
        /// When its last attempt started, and a hash of the credential it was sent with (never
        /// the credential: a re-send after a refresh carries another one).
        var lastStart: Double
        var credential: Int?
        var position: TextPosition
        var sentAgain = 0
        var complete = false
    }

    let policy: Policy
    let limits: ReplayLimits
    private(set) var origin: Double?
    /// The requests held, in start order: `chains[i]` is request `base + i`'s chain.
    private var chains: [Chain] = []
    /// Index in `chains` of the first request still held (those before it have left).
    private var head = 0
    /// The request number of `chains[0]`.
    private var base = 1
    /// Requests not complete yet, by key: their numbers, oldest first.
    private var open: [String: [Int]] = [:]
    private var openCount = 0
    package var forcedClosed = 0

    package init(policy: Policy, limits: ReplayLimits) {
        self.policy = policy
        self.limits = limits
    }

    /// One exchange (start and end in seconds since the epoch); `key` names the request it repeats.
    /// Notes an exchange's start: the first one read is the recording's time 0.
    mutating func noteStart(_ start: Double) {
        if origin == nil { origin = start }
    }

    /// A token call the recording shows ending at `end` (seconds since the epoch).
    mutating func tokenCallEnded(at end: Double) {
        tokenEnds.append(end)
        if tokenEnds.count > 64 { tokenEnds.removeFirst(tokenEnds.count - 64) }
    }

    /// Recent token calls' ends.
    private var tokenEnds: [Double] = []
    /// Each credential's generation, in the order the recording first shows them (at most
    /// 10,000; past that a credential has none).
    private var credentialGenerations: [Int: Int] = [:]

    private mutating func generation(of credential: Int) -> Int {
        if let known = credentialGenerations[credential] { return known }
        guard credentialGenerations.count < 10_000 else { return Int.max }
        credentialGenerations[credential] = credentialGenerations.count
        return credentialGenerations.count - 1
    }

    /// Whether an attempt starting at `start` with `credential` can be the re-send of `chain`:
    /// after a retry, any; after a refresh trigger, one with another credential than the last
    /// attempt's (when both carry one), else one after a token call that ended since that attempt
    /// started (when the recording shows token calls).
    private func continues(_ chain: Chain, start: Double, credential: Int?) -> Bool {
        guard chain.lastEnd <= start + 0.001 else { return false }
        guard chain.verdict?.action == .refresh else { return true }
        if let before = chain.credential, let now = credential { return before != now }
        guard !tokenEnds.isEmpty else { return true }
        return tokenEnds.contains { $0 > chain.lastStart && $0 <= start + 0.001 }
    }

    mutating func add(
        key: String, start: Double, end: Double, method: String, path: String, headers: [(String, String)],
        body: String?, response: SimulationScript.Response, credential: Int?, position: TextPosition
    ) {
        var generation: Int?
        if let credential { generation = self.generation(of: credential) }
        if origin == nil { origin = start }
        let window = limits.continuationWindow.seconds
        // Requests the window has passed are complete.
        if openCount > 0 {
            for (openKey, numbers) in open {
                for number in numbers where start - chains[number - base].lastEnd > window {
                    complete(number, key: openKey)
                }
            }
        }
        let verdict = ReplayVerdict(policy: policy, method: method, path: path, response: response)
        if let candidates = open[key] {
            for number in candidates {
                let index = number - base
                guard continues(chains[index], start: start, credential: credential) else { continue }
                chains[index].responses.append(response)
                chains[index].generations.append(generation)
                chains[index].lastEnd = end
                chains[index].lastStart = start
                chains[index].credential = credential
                chains[index].sentAgain += 1
                settle(number, verdict)
                return
            }
        }
        let number = base + chains.count
        var chain = Chain(
            number: number, key: key, start: start, method: method, path: path, headers: headers, body: body,
            lastEnd: end, lastStart: start, credential: credential, position: position)
        chain.responses = [response]
        chain.generations = [generation]
        chains.append(chain)
        open[key, default: []].append(number)
        openCount += 1
        settle(number, verdict)
        if openCount > limits.maxOpenRequests,
            let oldest = open.values.compactMap(\.first).min()
        {
            complete(oldest, key: chains[oldest - base].key)
            forcedClosed += 1
        }
    }

    /// Marks request `number` complete: it takes no more attempts.
    private mutating func complete(_ number: Int, key: String) {
        let index = number - base
        guard !chains[index].complete else { return }
        chains[index].complete = true
        openCount -= 1
        if var numbers = open[key] {
            numbers.removeAll { $0 == number }
            open[key] = numbers.isEmpty ? nil : numbers
        }
    }

    /// Decides whether the request is complete after its latest answer.
    private mutating func settle(_ number: Int, _ verdict: ReplayVerdict) {
        let index = number - base
        chains[index].verdict = verdict
        let again = verdict.action == .retry || verdict.action == .refresh
        if !again || chains[index].sentAgain >= verdict.again
            || chains[index].responses.count >= limits.maxAttemptsPerRequest
        {
            complete(number, key: chains[index].key)
        }
    }

    /// The next complete request in start order, or with `flush` (the recording ended) the next one.
    mutating func next(flush: Bool) -> ReplayRequest? {
        guard head < chains.count, flush || chains[head].complete else { return nil }
        if !chains[head].complete { complete(chains[head].number, key: chains[head].key) }
        let chain = chains[head]
        // Its answers are handed over: the slot keeps only what the bookkeeping reads.
        chains[head].responses = []
        chains[head].generations = []
        head += 1
        if head == chains.count {
            base += chains.count
            chains.removeAll(keepingCapacity: true)
            head = 0
        } else if head > 4096, head * 2 > chains.count {
            base += head
            chains.removeFirst(head)
            head = 0
        }
        let origin = origin ?? chain.start
        var request = SimulationScript.Request(id: "r\(chain.number)")
        request.at = .seconds(max(0, chain.start - origin))
        request.method = chain.method
        request.path = chain.path
        request.headers = chain.headers
        request.body = chain.body
        request.responses = chain.responses
        let last = chain.responses.last
        let recorded = RecordedOutcome(
            result: chain.verdict?.result, status: last?.error == nil ? last?.status : nil,
            code: chain.verdict?.code, error: last?.error)
        var ready = ReplayRequest(request: request, recorded: recorded, position: chain.position)
        ready.generations = chain.generations.map { $0 == Int.max ? nil : $0 }
        return ready
    }

    /// Requests held (open or waiting for an older one to leave).
    var held: Int { chains.count - head }
}

extension ReplayChains {
    /// The recording's time `seconds` (since the epoch) as an offset from its first request.
    func offset(_ seconds: Double) -> Duration { .seconds(max(0, seconds - (origin ?? seconds))) }
}

// MARK: - Token calls

/// What a recorded token endpoint answer makes a refresh do: a 2xx answer with an
/// `access_token` is new tokens (with the `expires_in` it gave; the tokens themselves are never
/// kept); a 4xx, 5xx or an answer without `access_token` fails with that status and the answer's
/// `error` (its other fields are dropped); no answer at all is transient trouble.
package func refreshStep(
    status: Int?, body: String, retryAfter: String?, duration: Duration, error: Bool
) -> SimulationScript.RefreshStep {
    var step = SimulationScript.RefreshStep()
    step.after = duration
    guard let status, !error else {
        step.result = .transient
        return step
    }
    let object = (try? JSONSerialization.jsonObject(with: Data(body.utf8))) as? [String: Any]
    if (200..<300).contains(status), object?["access_token"] != nil {
        step.result = .ok
        if let seconds = (object?["expires_in"] as? NSNumber)?.doubleValue, seconds > 0, seconds < 1e9 {
            step.expiresIn = .seconds(seconds)
        }
        return step
    }
    step.result = .fail
    step.status = status
    // Only what classifies the failure: the OAuth error code, never anything else it said.
    if let code = object?["error"] as? String, code.count < 100 {
        step.body = "{\"error\":" + PolicyEvent.quote(code) + "}"
    }
    if let retryAfter, let seconds = Double(retryAfter.trimmingCharacters(in: .whitespaces)), seconds >= 0 {
        step.retryAfter = .seconds(seconds)
    }
    return step
}

/// The token calls a reader has seen, oldest first, forgetting those before what a replay can
/// still ask for.
package struct TokenCallWindow: Sendable {
    private var calls: [RecordedTokenCall] = []

    package init() {}

    mutating func append(_ call: RecordedTokenCall) { calls.append(call) }

    /// The calls at or after `since`; older ones are dropped (the replay's clock only moves on).
    mutating func since(_ since: Duration) -> [RecordedTokenCall] {
        // Keep one before `since`: the nearest call to a refresh may be just before it.
        if let firstKept = calls.firstIndex(where: { $0.at >= since }), firstKept > 1 {
            calls.removeFirst(firstKept - 1)
        }
        return calls
    }
}
