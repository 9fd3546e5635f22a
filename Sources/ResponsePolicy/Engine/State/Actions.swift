import Foundation

/// What one attempt came to, as the transport returned it.
enum AttemptResult: Sendable {
    case response(HTTPResponse)
    case error(TransportError)
    /// Cancelled: by its timer (a timeout), a logout, or its caller; its transition says which.
    case cancelled

    /// A failure over the size limit (`too-large`): never retried.
    var isTooLarge: Bool {
        if case .error(let error) = self { return error.errorClass == .tooLarge }
        return false
    }
}

/// What the shell does after a transition, once it has unlocked: one list, in order.
///
/// A transition never awaits, locks or reads a clock; what it decides that touches the world
/// outside the state (a parked task, an attempt on the wire, the timer heap) is an action here.
/// `arm` and `disarm` are about the timer of the request the event is about: its own driver
/// performs them (every other request's timer leaves the heap in that request's own task).
enum Action {
    /// Resumes a parked request.
    case resume(UnsafeContinuation<Void, Never>)
    /// Cancels an attempt on the wire.
    case cancel(AttemptCancellation)
    /// Schedules the request's timer at `at` with `token` (the token that counts in its phase).
    case arm(at: Duration, token: UInt64)
    /// Takes the request's timer off the heap: the wait or the attempt it bounded ended first.
    case disarm
    /// Hands an event to the observers (made only when someone observes: a transition builds
    /// none for an engine nobody watches, so the request path allocates nothing for it).
    indirect case emit(PolicyEvent)
    /// Saves the credentials now held to the credential store (a refresh, an adoption).
    case save
    /// Work of the refresh flight for the shell (``RefreshWork``): a plugin call, a coordinator
    /// turn or publication, a timer, a problem to report.
    indirect case refresh(RefreshWork)
    /// Tells the fleet and the logout plugin that the session ended: the coordinator first (the
    /// other processes stop sending), then the plugin, in the background.
    indirect case publish(LogoutNotice)
}

/// What the shell does for the refresh flight (``Action/refresh(_:)``); each result comes back as
/// an event of the flight (`PolicyEngine+Refresh.swift`).
enum RefreshWork {
    /// Calls the refresh plugin; its answer is ``RefreshFlight/answered(_:call:_:_:now:date:)``.
    case call(RefreshFlight.Call)
    /// Asks the coordinator for a refresh turn (publishing a pair kept through an outage first);
    /// its answer is ``RefreshFlight/turn(_:_:now:)``.
    case ask(UInt64, RefreshTurnRequest, PolicyRuntime)
    /// Publishes the pair the session took under its lease (``RefreshFlight/unpublished``): at
    /// once after a refresh, again when the coordinator is back after trouble.
    case publishPending(PolicyRuntime)
    /// Tells the coordinator the turn failed, with the reason, and the end of a wait the token
    /// endpoint asked for (`Retry-After`), so no process calls it before then.
    case endTurn(RefreshLease, String, retryAfter: Date? = nil)
    /// Tells the coordinator a response accepted the token of this shared generation
    /// (`refresh.limit` never counts it fleet-wide).
    case noteAccepted(UInt64)
    /// Arms the flight's timer (one at a time: a newer one replaces it).
    case arm(RefreshFlight.Timer)
    /// Takes the timer of a flight that ended off the heap.
    case disarm(UInt64)
    /// Reports a `problem` event.
    case problem(String, PolicyRuntime)
}

/// A logout a transition decided, for the world outside (``Action/publish(_:)``): its cooldown's
/// end and reason, the ended session's credentials (read with the cooldown's start, so a sign-in
/// right after is not the session the plugin ends), and whether the plugin is called and the
/// coordinator told (not for news from another process).
struct LogoutNotice {
    let until: Date
    let reason: LogoutReason
    let credentials: Credentials?
    let requestID: String?
    let plugin: (any LogoutPlugin)?
    let publishes: Bool
    /// The session epoch of the credentials it was decided on (an attempt signed before the last
    /// sign-in, here or adopted, decides none), as the coordinator numbers it; 0 when unknown (the
    /// coordinator then uses the latest it knows).
    var epoch: UInt64 = 0
}

/// The ordered list of ``Action``s a transition returns. The first two are kept inline: most
/// transitions return at most a timer to arm or disarm and one request to resume, and a list on
/// the heap for each would cost an allocation per event on every request's path.
struct Actions: Sequence, ExpressibleByArrayLiteral {
    private var first: Action?
    private var second: Action?
    private var more: [Action] = []
    private(set) var count = 0

    init() {}

    init(arrayLiteral elements: Action...) {
        for element in elements { append(element) }
    }

    var isEmpty: Bool { count == 0 }

    mutating func append(_ action: Action) {
        switch count {
        case 0: first = action
        case 1: second = action
        default: more.append(action)
        }
        count += 1
    }

    static func += (list: inout Actions, other: Actions) {
        for action in other { list.append(action) }
    }

    static func + (list: Actions, other: Actions) -> Actions {
        var joined = list
        joined += other
        return joined
    }

    struct Iterator: IteratorProtocol {
        let actions: Actions
        var index = 0

        mutating func next() -> Action? {
            defer { index += 1 }
            switch index {
            case actions.count...: return nil
            case 0: return actions.first
            case 1: return actions.second
            default: return actions.more[index - 2]
            }
        }
    }

    func makeIterator() -> Iterator { Iterator(actions: self) }
}
