import Dispatch
import Foundation

/// Why a coordinator could not be made from its options. Never carries a secret.
public struct CoordinationError: Error, Sendable, Equatable, CustomStringConvertible {
    public var reason: String
    public init(_ reason: String) { self.reason = reason }
    public var description: String { reason }
}

/// Wakes the tasks waiting for news from other processes (a publication, a failed refresh).
///
/// A waiter reads ``version`` before it asks the shared store, then waits for a version after it:
/// news that arrives between the question and the wait is never missed.
///
/// Concurrency contract: every method may be called from any thread; ``bump()`` never blocks.
/// A wait ends at the latest after its timeout (a Dispatch timer), so it needs no cancellation.
final class ChangeSignal: Sendable {
    private struct State {
        var version: UInt64 = 0
        var nextID: UInt64 = 0
        var waiters: [UInt64: CheckedContinuation<Void, Never>] = [:]
    }
    private let state = Locked(State())

    var version: UInt64 { state.withLock { $0.version } }

    func bump() {
        let waiting = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            state.version += 1
            defer { state.waiters = [:] }
            return Array(state.waiters.values)
        }
        for continuation in waiting { continuation.resume() }
    }

    /// Returns when the version passes `seen`, or after `timeout`.
    func wait(after seen: UInt64, timeout: Duration) async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let id = state.withLock { state -> UInt64? in
                guard state.version == seen else { return nil }
                state.nextID += 1
                state.waiters[state.nextID] = continuation
                return state.nextID
            }
            guard let id else { return continuation.resume() }
            let nanoseconds = max(
                0,
                Int(timeout.components.seconds) * 1_000_000_000
                    + Int(timeout.components.attoseconds / 1_000_000_000))
            DispatchQueue.global().asyncAfter(deadline: .now() + .nanoseconds(nanoseconds)) { [state] in
                let expired = state.withLock { $0.waiters.removeValue(forKey: id) }
                expired?.resume()
            }
        }
    }
}

/// The JSON a coordinator shares credentials as: the credentials file's names, `expires_at` in
/// milliseconds since 1970. It holds the tokens themselves (sharing them is the point); it is
/// never logged and never put in an error.
enum SharedCredentialsCodec {
    static func encode(_ credentials: Credentials) -> String {
        var object: [String: Any] = ["access_token": credentials.accessToken]
        if let refresh = credentials.refreshToken { object["refresh_token"] = refresh }
        if let expires = credentials.expiresAt { object["expires_at"] = Int64(expires.timeIntervalSince1970 * 1000) }
        let data = (try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])) ?? Data("{}".utf8)
        return String(decoding: data, as: UTF8.self)
    }

    static func decode(_ text: String) -> Credentials? {
        guard !text.isEmpty, let object = try? JSONSerialization.jsonObject(with: Data(text.utf8)) else { return nil }
        return decode(object: object)
    }

    static func decode(object: Any) -> Credentials? {
        guard let map = object as? [String: Any], let access = map["access_token"] as? String else { return nil }
        let expires = (map["expires_at"] as? NSNumber).map { Date(timeIntervalSince1970: $0.doubleValue / 1000) }
        return Credentials(accessToken: access, refreshToken: map["refresh_token"] as? String, expiresAt: expires)
    }
}

extension Duration {
    /// Whole milliseconds, at least `floor`.
    func milliseconds(atLeast floor: Int64 = 1) -> Int64 {
        let (seconds, attoseconds) = components
        return max(floor, seconds * 1000 + attoseconds / 1_000_000_000_000_000)
    }
}

extension Date {
    var millisecondsSince1970: Int64 { Int64((timeIntervalSince1970 * 1000).rounded()) }
    init(milliseconds: Int64) { self.init(timeIntervalSince1970: Double(milliseconds) / 1000) }
}

/// Healthy or not, with the one `.problem` per outage and one `.recovered` after it.
struct CoordinatorHealth {
    var down = false
    var failures = 0

    /// Returns the update to send, when this is news.
    mutating func fail(_ reason: String) -> SessionUpdate? {
        failures += 1
        if down { return nil }
        down = true
        return .problem(reason)
    }

    mutating func recover() -> SessionUpdate? {
        failures = 0
        if !down { return nil }
        down = false
        return .recovered
    }

    /// Reconnect backoff: 50 ms doubling to 2 s.
    var backoff: Duration {
        .milliseconds(min(2000, 50 << min(max(failures - 1, 0), 6)))
    }
}
