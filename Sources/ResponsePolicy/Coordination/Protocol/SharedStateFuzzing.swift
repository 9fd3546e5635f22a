import Foundation

/// The fuzz entry of the shared-state codecs (issue 23): what a hostile store can hand a process
/// — a credentials value, a state file, a publication — goes through every decoder, which must
/// never trap, and whatever is accepted must be in range and survive a round trip unchanged.
/// `policy-fuzz` runs it on every input (`scripts/fuzz.sh`); `FuzzRegressionTests` replay it.
///
/// ```swift
/// SharedStateFuzzing.exercise(Data(#"{"access_token":"a","expires_at":1e300}"#.utf8))
/// ```
package enum SharedStateFuzzing {
    /// Decodes `data` every way a store's bytes are decoded; traps (a fuzz finding) only when an
    /// accepted value breaks the codecs' own contract.
    package static func exercise(_ data: Data) {
        guard data.count <= 1 << 16 else { return }
        let text = String(decoding: data, as: UTF8.self)
        let signer = SharedStateSigner(key: Data("fuzz".utf8), scope: "redis:fuzz")
        // The sealed forms a Redis store keeps (`<number>:<fields>:<seal>`): refused or accepted,
        // never a trap; what is accepted is in range.
        if case .success(let lease) = signer.checkLease(text, notBefore: 0) {
            precondition(lease.fence < 9_000_000_000_000_000, "an accepted fencing token is out of range")
        }
        if case .success(let until?) = signer.checkLogout(text) {
            precondition(until <= SharedCredentialsCodec.maxMilliseconds, "an accepted cooldown is out of range")
        }
        _ = signer.check(text, "record", [text])
        for key in [nil, signer] {
            if case .success(let credentials) = SharedCredentialsCodec.check(text, signer: key) {
                let again = SharedCredentialsCodec.decode(
                    SharedCredentialsCodec.encode(credentials, signer: key, generation: 7), signer: key, generation: 7)
                precondition(
                    again?.sameTokens(as: credentials) == true, "a shared credentials round trip changed the tokens")
                if let expiry = credentials.expiresAt {
                    precondition(expiry.checkedMillisecondsSince1970 != nil, "an accepted expiry is out of range")
                }
            }
            if case .success(let record?) = FileSessionCoordinator.decode(data, source: "fuzz", signer: key) {
                // Its seal is computable over every field it holds.
                if let key { _ = key.seal("record", record.sealFields) }
                // What was accepted drives the protocol without a trap.
                var copy = record
                _ = copy.begin(failedGeneration: 0, leaseMs: 1000, limit: (3, 1000), holder: 1, now: 1_000)
                _ = copy.session(now: 0)
            }
        }
        _ = RedisEndpoint.parse(text)
    }
}
