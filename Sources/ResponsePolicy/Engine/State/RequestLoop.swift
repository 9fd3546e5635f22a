import Foundation

/// What a request's transitions read and write besides the shared state: its own loop
/// (``EngineState/RequestLoop``), the event its driver makes (``EngineState/RequestEvent``) and
/// what the driver does next (``EngineState/Next``).
extension EngineState {
    /// What a request's loop keeps between its events and its decisions read: its counters and
    /// what it waits for. Owned by the request's driver (``RequestMachine``), handed to each
    /// transition `inout`.
    struct RequestLoop {
        /// What a park waits for.
        enum Parked {
            /// A backoff; a refresh this request started or joined (`proactive`: one ahead of
            /// expiry, or one a new request waits for under `hold-new-requests`); a dispatch slot.
            case backoff, refresh(proactive: Bool), dispatch
        }

        var waitingFor = Parked.backoff
        /// The rule whose refresh is awaited (`nil`: the scope's settings), for its failure edges.
        var refreshRule: Int?
        var attempt = 0
        var retries = 0
        /// Re-sends after a refresh this request waited for (`max-per-request` counts them).
        var refreshResends = 0
        /// Whether the last refresh trigger counted one (a token expired in flight does not).
        var triggerCounted = false
        /// The token generation the last attempt was signed with.
        var signedGeneration: UInt64 = 0
        /// When that token expires, as issued, if it had not expired yet when the attempt left
        /// (`nil`: no known lifetime, or sent already expired).
        var signedExpiry: Date?
        /// The proactive refresh for this turn of the loop is done.
        var skipProactive = false
        /// A proactive refresh of this request that failed, and the token generation it failed for:
        /// while that generation is current, the request neither refreshes ahead again nor calls the
        /// refresh plugin for a trigger, but meets this failure (one failure is one failure: the
        /// same dead refresh token is not sent twice). Boxed, to keep waiting requests small.
        var proactiveFailure: ProactiveFailure?
        /// The proactive refresh awaited gets the first credentials (there were none): its failure
        /// follows the failure edges, since there is no token to send instead.
        var signingIn = false
        /// The request has waited for a refresh before the attempt about to go out (held, ahead of
        /// expiry, signing in): it is not held again before that attempt, so each attempt waits for
        /// at most one refresh before it goes out (the bound ``WorstCase`` states).
        var preSendWaited = false
        /// The reason of the refresh that failed, for the outcome and the logout it leads to, and
        /// the token endpoint's answer to it, when it answered.
        var refreshFailureReason: String?
        var refreshFailureResponse: HTTPResponse?
        /// The escalation edge taken after a refresh ended, reported with the outcome.
        var lastEdge: RuleGraph.Edge?
        /// Why a retry was refused (`budget`, `not-retryable`), for the outcome's reason.
        var refusal: RuleGraph.EdgeKind?
        /// The logout its awaited refresh's failure led to, started by the refresh's end (see
        /// ``Wake/flight(_:logout:)``): this request performs its effects.
        var decidedLogout: DecidedLogout?
        /// The last attempt's answer: its response (or transport error, a timeout included) and
        /// business code, for events and for delivering it when an edge says so. Written by the
        /// attempt's end (``attemptEnded(_:_:_:into:)``); a cancelled attempt leaves the one before.
        var lastResponse: HTTPResponse?
        var failure: TransportError?
        var lastCode: String?

        /// Why this request asks for a refresh, for the refresh plugin (``RefreshContext/reason``).
        func refreshReason(_ scope: RuleGraph.Scope) -> String {
            if signingIn { return "sign-in" }
            if case .refresh(proactive: true) = waitingFor { return "ahead" }
            return refreshRule.map { scope.compiled[$0].rule.name } ?? "refresh"
        }
    }

    /// A refresh ahead of expiry of a request that failed, and the token generation it failed for.
    final class ProactiveFailure {
        let failure: RefreshFailure
        let generation: UInt64

        init(_ failure: RefreshFailure, generation: UInt64) {
            self.failure = failure
            self.generation = generation
        }
    }

    /// What a request's transition knows of it besides its loop: fixed for the request (its number,
    /// scope, context), or read by its driver for this event (the time, the last attempt's answer,
    /// and a departure made ready in case it goes out now).
    struct RequestEvent {
        let id: UInt64
        let scope: RuleGraph.Scope
        let scopeIndex: Int
        let context: RequestContext
        var now: Duration
        var date: Date
        /// What the gate needs if the request goes out in this transition (its attempt's
        /// cancellation made ready).
        var departure: Departure
        /// The last attempt's response (or transport error) and business code, for events and for
        /// delivering it when an edge says so.
        var lastResponse: HTTPResponse?
        var failure: TransportError?
        var code: String?
        /// Whether the token endpoint's answer to a failed refresh matches a `logout` rule of the
        /// request's scope (classified by the shell, outside the lock, when ``Next/judge(_:_:)``
        /// asked for it); `nil`: not classified.
        var answerLogsOut: Bool?

        var observed: Bool { !context.runtime.observers.isEmpty }

        /// Takes the last answer the loop holds (after an attempt's end changed it).
        mutating func answer(_ loop: RequestLoop) {
            (lastResponse, failure, code) = (loop.lastResponse, loop.failure, loop.lastCode)
        }
    }

    /// What the driver does after a request's transition.
    enum Next {
        /// It goes out: the attempt began (its timeout armed); signed with these credentials.
        case send(CredentialsBox?, generation: UInt64)
        /// It waits (held, queued, a refresh, a backoff) until its park ends.
        case park
        /// It has its outcome; its slot was removed in the same transition.
        case finish(Result<HTTPResponse, PolicyEngineError>)
        /// A refresh it waited for failed definitively with an answer that the rule's
        /// `refresh-answer` edge may take: the shell classifies the answer outside the lock (a code
        /// scan), then ``refreshFailed(_:_:_:rule:_:into:)`` decides.
        case judge(rule: Int, RefreshFailure)
    }
}
