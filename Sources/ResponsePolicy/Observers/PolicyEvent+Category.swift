import Foundation

// Where the engine's values become an event's ``PolicyEvent/Category``: one mapping per source,
// read by the engine where it builds the event, so metrics never parse a reason's text.

extension PolicyEvent.Category {
    /// A refresh's end: new tokens, the session changed meanwhile (`discarded`: its tokens were
    /// not taken for this session), coordination trouble, or the failure's kind.
    init(_ ending: RefreshFlight.Ending, discarded: Bool) {
        switch ending.outcome {
        case .success: self = discarded ? .superseded : .ok
        case .failure(let failure):
            if ending.trouble {
                self = .coordination
            } else {
                self = failure.kind == .definitive ? .definitive : .transient
            }
        }
    }
}

extension RefreshFlight.Refusal {
    /// Why a trigger made no call, as a `refresh-end`'s category.
    var category: PolicyEvent.Category {
        switch self {
        case .limit: return .limited
        case .remembered: return .remembered
        case .retryAfter: return .retryAfter
        }
    }
}

extension LogoutReason {
    /// What ended the session, as a `logout` event's category.
    var category: PolicyEvent.Category {
        switch self {
        case .rule: return .rule
        case .refreshFailed: return .refreshFailed
        case .host: return .host
        case .elsewhere: return .fleet
        }
    }
}
