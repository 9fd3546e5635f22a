import Foundation

/// The sealed forms of the values a store keeps in fields of their own (Redis: the lease, the
/// cooldown's end, the refresh.limit grants), where the store's own scripts compare them and so
/// the number must stay first: `<number>:<more fields>:<seal>`. A store's script reads the number
/// (`string.match(v, '^[^:]*')`); a process checks the seal before it uses any of it.
///
/// Why a signed expiry in a lease: a lease's life is the store's TTL, which no seal can cover, so
/// the holder seals the time it expires by its clock; a lease whose sealed expiry passed more than
/// ``clockSkew`` ago is an old one put back (a replay), refused like a forged one.
///
/// ```swift
/// let value = "7" + signer.leaseSuffix(fence: 7, expires: now + 15_000)   // "7:<ms>:v1.…"
/// signer.checkLease(value, now: now)                                    // .success((7, …))
/// ```
extension SharedStateSigner {
    /// How far the clocks of two hosts of a fleet may disagree before a sealed time is taken for
    /// a replay.
    package static let clockSkew: Int64 = 60_000

    /// What follows a lease's fencing token: its sealed expiry (ms since 1970).
    package func leaseSuffix(fence: UInt64, expires: Int64) -> String {
        ":\(expires):" + seal("lease", [String(fence), String(expires)])
    }

    /// A lease (or a refresh.limit grant, which is its lease's value) read from the store: its
    /// fencing token and sealed expiry, or why it is refused. `notBefore`: the earliest expiry a
    /// current one can have (now for a lease; the limit's window for a grant), less ``clockSkew``.
    package func checkLease(_ value: String, notBefore: Int64) -> Result<
        (fence: UInt64, expires: Int64), CoordinationError
    > {
        let parts = value.split(separator: ":", maxSplits: 2, omittingEmptySubsequences: false).map(String.init)
        guard parts.count == 3, let fence = UInt64(parts[0]), fence < 9_000_000_000_000_000,
            let expires = Int64(parts[1])
        else {
            let refusal = parts.count == 1 ? Check.missing.refusal ?? "" : "it is malformed"
            return .failure(CoordinationError("was refused: \(refusal)"))
        }
        if let refusal = check(parts[2], "lease", [String(fence), String(expires)]).refusal {
            return .failure(CoordinationError("was refused: \(refusal)"))
        }
        guard expires >= notBefore - Self.clockSkew else {
            return .failure(
                CoordinationError("was refused: it ended long ago (an old lease put back: replayed; signing-key-env)"))
        }
        return .success((fence, expires))
    }

    /// What follows a cooldown's end in the store: the session epoch the logout was decided in
    /// (``epochValue(_:)``) and the seal of both, `:<epoch>:<seal>`.
    ///
    /// Why the epoch: a logout ends the session of one epoch (the sign-in that started it). Put
    /// back after a later sign-in ended it, a genuine, validly sealed logout would log the fleet
    /// out again; bound to its epoch, it is refused by a process that knows of a later one.
    package func logoutSuffix(until: Int64, epoch: UInt64 = 0) -> String {
        ":\(epoch):" + seal("logout-until", [String(until), String(epoch)])
    }

    /// A cooldown's end read from the store (`0` or absent: none), or why it is refused.
    package func checkLogout(_ value: String?) -> Result<Int64?, CoordinationError> {
        checkLogoutEnd(value).map { $0?.until }
    }

    /// A cooldown's end read from the store with the session epoch it was decided in (`0` or
    /// absent: none), or why it is refused.
    package func checkLogoutEnd(_ value: String?) -> Result<(until: Int64, epoch: UInt64)?, CoordinationError> {
        guard let value, !value.isEmpty, value != "0" else { return .success(nil) }
        let parts = value.split(separator: ":", maxSplits: 2, omittingEmptySubsequences: false).map(String.init)
        guard let until = Int64(parts[0]), until >= 0, until <= SharedCredentialsCodec.maxMilliseconds else {
            return .failure(CoordinationError("was refused: it is out of range"))
        }
        guard parts.count == 3 else {
            return .failure(CoordinationError("was refused: \(Check.missing.refusal ?? "")"))
        }
        guard let epoch = Self.epochNumber(parts[1]) else {
            return .failure(CoordinationError("was refused: it is malformed"))
        }
        if let refusal = check(parts[2], "logout-until", [String(until), String(epoch)]).refusal {
            return .failure(CoordinationError("was refused: \(refusal)"))
        }
        return .success((until, epoch))
    }

    /// A session epoch as the store keeps it (the session hash's `epoch` field, a sign-in's
    /// announcement): `<epoch>:<seal>`. An epoch is the generation a sign-in stored its
    /// credentials at; refreshes keep it, only a sign-in starts a new one.
    package func epochValue(_ epoch: UInt64) -> String {
        "\(epoch):" + seal("epoch", [String(epoch)])
    }

    /// A session epoch read from the store (absent: 0, no sign-in yet), or why it is refused.
    package func checkEpoch(_ value: String?) -> Result<UInt64, CoordinationError> {
        guard let value, !value.isEmpty else { return .success(0) }
        let parts = value.split(separator: ":", maxSplits: 1, omittingEmptySubsequences: false).map(String.init)
        guard let epoch = Self.epochNumber(parts[0]) else {
            return .failure(CoordinationError("was refused: it is malformed"))
        }
        if let refusal = check(parts.count == 2 ? parts[1] : nil, "epoch", [String(epoch)]).refusal {
            return .failure(CoordinationError("was refused: \(refusal)"))
        }
        return .success(epoch)
    }

    private static func epochNumber(_ text: String) -> UInt64? {
        guard let epoch = UInt64(text), epoch < 9_000_000_000_000_000 else { return nil }
        return epoch
    }
}
