import Dispatch
import Foundation

/// Why a coordinator could not be made from its options. Never carries a secret.
public struct CoordinationError: Error, Sendable, Equatable, CustomStringConvertible {
    /// What is wrong, for people.
    public var reason: String
    /// An error saying `reason`.
    public init(_ reason: String) { self.reason = reason }
    /// The reason.
    public var description: String { reason }
}

/// Wakes the tasks waiting for news from other processes (a publication, a failed refresh).
///
/// A waiter reads ``version`` before it asks the shared store, then waits for a version after it:
/// news that arrives between the question and the wait is never missed.
///
/// Concurrency contract: every method may be called from any thread; ``bump()`` never blocks.
/// A wait ends at the latest after its timeout (a Dispatch timer), so it needs no cancellation.
package final class ChangeSignal: Sendable {
    package init() {}
    private struct State {
        var version: UInt64 = 0
        var nextID: UInt64 = 0
        var waiters: [UInt64: CheckedContinuation<Void, Never>] = [:]
    }
    private let state = Locked(State())

    package var version: UInt64 { state.withLock { $0.version } }

    package func bump() {
        let waiting = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            state.version += 1
            defer { state.waiters = [:] }
            return Array(state.waiters.values)
        }
        for continuation in waiting { continuation.resume() }
    }

    /// Returns when the version passes `seen`, or after `timeout`.
    package func wait(after seen: UInt64, timeout: Duration) async {
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

/// The JSON a coordinator shares credentials as: the credentials file's names, `expires_at` and
/// `issued_at` (the lifetime as issued, for `refresh.ahead`) in milliseconds since 1970. It holds the tokens themselves (sharing them is the point); it is
/// never logged and never put in an error.
///
/// Everything read from a shared store is hostile until checked (issue 23): decoding never traps,
/// and a value out of range (an expiry past year 9999 or not a number, an empty or oversized
/// token, a token with control characters that would split a header) refuses the whole
/// credentials, with a reason that names the field and never its value.
package enum SharedCredentialsCodec {
    /// 9999-12-31T23:59:59.999Z: the last instant every store and formatter can represent.
    package static let maxMilliseconds: Int64 = 253_402_300_799_999
    /// No token a real server issues comes near this; a larger one is refused, not stored.
    static let maxTokenBytes = 16_384

    /// With a `signer`, the credentials carry its seal over the tokens and `generation`: the
    /// generation they are stored at (a signed pair cannot be replayed under another one).
    package static func encode(_ credentials: Credentials, signer: SharedStateSigner? = nil, generation: UInt64 = 0)
        -> String
    {
        var object: [String: Any] = ["access_token": credentials.accessToken]
        if let signer {
            object["sig"] = signer.seal("credentials", SharedStateSigner.fields(credentials, generation: generation))
        }
        if let refresh = credentials.refreshToken { object["refresh_token"] = refresh }
        if let expires = credentials.expiresAt, let milliseconds = expires.checkedMillisecondsSince1970 {
            object["expires_at"] = milliseconds
        }
        if let issued = credentials.issuedAt, let milliseconds = issued.checkedMillisecondsSince1970 {
            object["issued_at"] = milliseconds
        }
        let data = (try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])) ?? Data("{}".utf8)
        return String(decoding: data, as: UTF8.self)
    }

    package static func decode(_ text: String, signer: SharedStateSigner? = nil, generation: UInt64 = 0) -> Credentials?
    {
        try? check(text, signer: signer, generation: generation).get()
    }

    package static func decode(object: Any, signer: SharedStateSigner? = nil, generation: UInt64 = 0) -> Credentials? {
        try? check(object: object, signer: signer, generation: generation).get()
    }

    /// Decodes `text`, or says why it is refused (never quoting a value). With a `signer`, the
    /// credentials must carry its signature (`signing-key-env`).
    package static func check(_ text: String, signer: SharedStateSigner? = nil, generation: UInt64 = 0)
        -> Result<Credentials, CoordinationError>
    {
        guard !text.isEmpty, text.utf8.count <= 4 * maxTokenBytes,
            let object = try? JSONSerialization.jsonObject(with: Data(text.utf8))
        else { return .failure(CoordinationError("the shared credentials are not a JSON object")) }
        return check(object: object, signer: signer, generation: generation)
    }

    package static func check(object: Any, signer: SharedStateSigner? = nil, generation: UInt64 = 0)
        -> Result<Credentials, CoordinationError>
    {
        let checked = check(unsigned: object)
        guard let signer, case .success(let credentials) = checked else { return checked }
        let seal = (object as? [String: Any])?["sig"] as? String
        let verdict = signer.check(
            seal, "credentials", SharedStateSigner.fields(credentials, generation: generation))
        if let refusal = verdict.refusal {
            return .failure(
                CoordinationError("the shared credentials (generation \(generation)) were refused: \(refusal)"))
        }
        return checked
    }

    private static func check(unsigned object: Any) -> Result<Credentials, CoordinationError> {
        guard let map = object as? [String: Any] else {
            return .failure(CoordinationError("the shared credentials are not a JSON object"))
        }
        guard let access = map["access_token"] as? String, valid(access) else {
            return .failure(CoordinationError("the shared credentials' access_token is missing or not a usable token"))
        }
        var refresh: String?
        if let value = map["refresh_token"], !(value is NSNull) {
            guard let text = value as? String, valid(text) else {
                return .failure(CoordinationError("the shared credentials' refresh_token is not a usable token"))
            }
            refresh = text
        }
        var expires: Date?
        if let value = map["expires_at"], !(value is NSNull) {
            guard let number = value as? NSNumber,
                number.doubleValue.isFinite, number.doubleValue >= 0,
                number.doubleValue <= Double(maxMilliseconds)
            else { return .failure(CoordinationError("the shared credentials' expires_at is out of range")) }
            expires = Date(timeIntervalSince1970: number.doubleValue / 1000)
        }
        var issued: Date?
        if let value = map["issued_at"], !(value is NSNull) {
            guard let number = value as? NSNumber,
                number.doubleValue.isFinite, number.doubleValue >= 0,
                number.doubleValue <= Double(maxMilliseconds)
            else { return .failure(CoordinationError("the shared credentials' issued_at is out of range")) }
            issued = Date(timeIntervalSince1970: number.doubleValue / 1000)
        }
        return .success(Credentials(accessToken: access, refreshToken: refresh, expiresAt: expires, issuedAt: issued))
    }

    /// A token a header can carry: not empty, not huge, no control characters.
    private static func valid(_ token: String) -> Bool {
        !token.isEmpty && token.utf8.count <= maxTokenBytes
            && !token.unicodeScalars.contains { $0.value < 0x20 || $0.value == 0x7F }
    }
}

extension Duration {
    /// Whole milliseconds, at least `floor`; saturates instead of trapping on huge durations.
    package func milliseconds(atLeast floor: Int64 = 1) -> Int64 {
        let (seconds, attoseconds) = components
        let (whole, overflow) = seconds.multipliedReportingOverflow(by: 1000)
        if overflow { return seconds < 0 ? floor : Int64.max / 2 }
        return max(floor, whole + attoseconds / 1_000_000_000_000_000)
    }
}

extension Date {
    /// Milliseconds since 1970, clamped to what ``SharedCredentialsCodec`` accepts (never traps).
    package var millisecondsSince1970: Int64 {
        checkedMillisecondsSince1970 ?? (timeIntervalSince1970 < 0 ? 0 : SharedCredentialsCodec.maxMilliseconds)
    }

    /// Milliseconds since 1970, or nil when out of 1970…9999 or not a number.
    package var checkedMillisecondsSince1970: Int64? {
        let value = (timeIntervalSince1970 * 1000).rounded()
        guard value.isFinite, value >= 0, value <= Double(SharedCredentialsCodec.maxMilliseconds) else { return nil }
        return Int64(value)
    }

    package init(milliseconds: Int64) { self.init(timeIntervalSince1970: Double(milliseconds) / 1000) }
}

/// Why a wait for another holder's publication ended without one, in words.
package enum WaitFailure {
    /// `holder` is the fencing token waited for (0: a re-seed's quarantine), `timeout` the request's.
    package static func reason(holder: UInt64?, timeout: Duration) -> String {
        guard holder == 0 else {
            return "another process's refresh did not finish within \(timeout.policyText)"
        }
        return "the coordination store forgot the shared session and was re-seeded; a refresh it forgot may still be "
            + "at the token endpoint, so nobody refreshes for one lease (a quarantine), which outlasted "
            + "\(timeout.policyText)"
    }
}

extension Credentials {
    /// These credentials with ``issuedAt`` set to `date` when they have an expiry and no issue
    /// time yet: what a refresh stamps on the pair it got (at the moment the answer arrived), so
    /// every store and every process that adopts the token knows its lifetime as issued (issue
    /// 30, case 7).
    package func stampedIssue(at date: Date) -> Credentials {
        guard issuedAt == nil, expiresAt != nil else { return self }
        var stamped = self
        stamped.issuedAt = date
        return stamped
    }
}

/// Healthy or not, with the one `.problem` per outage and one `.recovered` after it.
package struct CoordinatorHealth {
    package init() {}
    package var down = false
    package var failures = 0

    /// Returns the update to send, when this is news.
    package mutating func fail(_ reason: String) -> SessionUpdate? {
        failures += 1
        if down { return nil }
        down = true
        return .problem(reason)
    }

    package mutating func recover() -> SessionUpdate? {
        failures = 0
        if !down { return nil }
        down = false
        return .recovered
    }

    /// Reconnect backoff: 50 ms doubling to 2 s.
    package var backoff: Duration {
        .milliseconds(min(2000, 50 << min(max(failures - 1, 0), 6)))
    }
}

/// The random part of the temporary file names the state file and the credentials file are
/// written through (`…tmp-<pid>-<suffix>`): 64 bits from the system's secure generator, so no
/// name can be planted ahead. Tests replace the generator for one task (``override``) to plant
/// links at exactly the names the code will pick, and prove those are never followed.
enum TemporaryNames {
    @TaskLocal static var override: (@Sendable () -> UInt64)?

    static func suffix() -> UInt64 {
        if let override { return override() }
        var generator = SystemRandomNumberGenerator()
        return generator.next()
    }
}
