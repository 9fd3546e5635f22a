import Foundation
import ResponsePolicy

/// The token server a simulated fleet shares: single-use refresh tokens, and the whole family
/// revoked when a spent one is presented again (OAuth 2.0 Security BCP, RFC 9700 §4.14.2), the
/// way the identity providers issue 19 was measured against behave.
///
/// Pair n is `sim-token-n` / `sim-refresh-n`; the fleet starts with pair 0. Refresh call n (counted
/// across the fleet, as the server sees calls) takes the script's `refresh:` step n (the last
/// repeats). What the server does with the presented refresh token, once the step's `after` has
/// passed:
/// - the family's current token: `ok` spends it and issues the next pair; `fail` and `transient`
///   answer as the step says and spend nothing;
/// - a token already spent: a **reuse**; the family is revoked (no access or refresh token of it is
///   accepted any more) and the answer is `400 invalid_grant`;
/// - anything else (the family revoked, no token, a token never issued): `400 invalid_grant`.
///
/// Concurrency contract: any task may call it; the state lives behind one lock.
final class FleetTokenServer: Sendable {
    /// What one call to the token endpoint came to, for the fleet's output.
    enum Answer: String, Sendable {
        case ok, reuse, refused, failed, transient
    }

    private struct State {
        var calls = 0
        var answered = 0
        var issued = 0
        var current: Int? = 0
        var spent: Set<Int> = []
        var reuses = 0
        var expiries: [Int: Date] = [:]
    }

    let steps: [SimulationScript.RefreshStep]
    let clock: VirtualClock
    /// Checks access tokens when the script has `tokens:`.
    let tokens: TokenServer?
    private let state = Locked(State())
    /// The pair handed out by the call in progress, and when it is sent.
    private let issuing = Locked<(Int, Duration)?>(nil)

    init(steps: [SimulationScript.RefreshStep], clock: VirtualClock, tokens: TokenServer?) {
        self.steps = steps
        self.clock = clock
        self.tokens = tokens
    }

    /// Calls that reached the server (a process killed before its call arrived is not one).
    var tokenCalls: Int { state.withLock { $0.answered } }
    /// Spent refresh tokens presented again.
    var reuses: Int { state.withLock { $0.reuses } }
    /// The newest pair's number.
    var newest: Int { state.withLock { $0.issued } }

    /// Pair `number` as a credentials file keeps it: `expires_at` to the second (issue 19: the
    /// same token read from the file and from the store must not look new).
    func pair(_ number: Int) -> Credentials {
        let expiry = state.withLock { $0.expiries[number] }
        return Credentials(
            accessToken: "\(TokenServer.prefix)\(number)", refreshToken: "\(Self.refreshPrefix)\(number)",
            expiresAt: expiry.map { Date(timeIntervalSince1970: $0.timeIntervalSince1970.rounded(.down)) })
    }

    static let refreshPrefix = "sim-refresh-"

    /// The number of the pair whose refresh token `token` is; nil for anything else.
    static func pairNumber(_ token: String?) -> Int? {
        guard let token, token.hasPrefix(refreshPrefix) else { return nil }
        return Int(token.dropFirst(refreshPrefix.count))
    }

    /// The step the next call takes; counts the call.
    func nextStep() -> SimulationScript.RefreshStep {
        let call = state.withLock { state -> Int in
            state.calls += 1
            return state.calls
        }
        return steps.isEmpty ? SimulationScript.RefreshStep() : steps[min(call, steps.count) - 1]
    }

    /// The server's answer to `presented` under `step`: new credentials, or a ``RefreshFailure``.
    /// `answer` says what it was, for the output. The call is handled now (a refresh token is
    /// spent when the call arrives); the pair it issues is valid from when it is sent, `after`
    /// from now (as the scripted expiries count it).
    func answer(presented: String?, step: SimulationScript.RefreshStep, sentAfter after: Duration = .zero) -> (
        Swift.Result<Credentials, RefreshFailure>, Answer, Int
    ) {
        let number = Self.pairNumber(presented)
        let now = clock.now + after
        let date = clock.date.addingTimeInterval(after.seconds)
        let (outcome, answer, call, revoke, issue):
            (Swift.Result<Credentials, RefreshFailure>, Answer, Int, Bool, Int?) =
                state.withLock { state in
                    state.answered += 1
                    let call = state.answered
                    guard let number, state.current != nil else {
                        return (
                            .failure(Self.invalidGrant("the refresh token is not valid")), .refused, call, false, nil
                        )
                    }
                    if state.spent.contains(number) {
                        state.reuses += 1
                        state.current = nil
                        return (
                            .failure(Self.invalidGrant("refresh token reused; the token family is revoked")), .reuse,
                            call,
                            true, nil
                        )
                    }
                    guard number == state.current else {
                        return (
                            .failure(Self.invalidGrant("the refresh token is not valid")), .refused, call, false, nil
                        )
                    }
                    switch step.result {
                    case .ok:
                        state.spent.insert(number)
                        state.issued += 1
                        state.current = state.issued
                        let expiry = step.expiresIn.map { date.addingTimeInterval($0.seconds) }
                        state.expiries[state.issued] = expiry
                        return (
                            .success(
                                Credentials(
                                    accessToken: "\(TokenServer.prefix)\(state.issued)",
                                    refreshToken: "\(Self.refreshPrefix)\(state.issued)", expiresAt: expiry)),
                            .ok, call, false, state.issued
                        )
                    case .fail:
                        let response = step.status.map { HTTPResponse(status: $0, body: Data((step.body ?? "").utf8)) }
                        let answered =
                            response.map { " (answered \($0.status)\(TokenEndpoint.oauthError(in: $0)))" } ?? ""
                        return (
                            .failure(
                                RefreshFailure(
                                    "scripted refresh failure" + answered, response: response,
                                    retryAfter: step.retryAfter)),
                            .failed, call, false, nil
                        )
                    case .transient:
                        return (
                            .failure(
                                RefreshFailure(
                                    "scripted refresh failure: no answer (connection reset)", kind: .transient,
                                    retryAfter: step.retryAfter)), .transient, call, false, nil
                        )
                    }
                }
        if revoke { tokens?.revoke() }
        if let issue { issuing.withLock { $0 = (issue, now) } }
        return (outcome, answer, call)
    }

    /// The pair the last call issued, when it is sent (`after` its arrival): from then on its
    /// access token is the accepted one. Called by the caller once the answer is on its way,
    /// whether or not the caller lives to read it.
    func sendIssued() {
        guard
            let (number, at) = issuing.withLock({ state -> (Int, Duration)? in
                defer { state = nil }
                return state
            })
        else { return }
        // A family revoked meanwhile (a reuse that arrived after this call) stays revoked.
        guard state.withLock({ $0.current != nil }) else { return }
        tokens?.issued(number, at: at)
    }

    static func invalidGrant(_ why: String) -> RefreshFailure {
        RefreshFailure(
            "the token server refused: \(why)",
            response: HTTPResponse(status: 400, body: Data(#"{"error":"invalid_grant"}"#.utf8)))
    }
}
