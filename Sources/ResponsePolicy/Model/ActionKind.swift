/// What a matched rule does with a response or a failed attempt.
public enum ActionKind: String, Sendable, Hashable, CaseIterable, Codable {
    /// Hand the response to the caller.
    case deliver
    /// End the request with an error carrying the response.
    case fail
    /// Send the request again after the backoff delay, within `retry.max-retries`.
    case retry
    /// Get a fresh token (single flight), re-sign the request and send it again.
    case refresh
    /// End the session: cancel in-flight requests, call the logout plugin, start the cooldown.
    case logout
}
