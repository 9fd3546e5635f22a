import Foundation

/// Signs and checks what a process shares through a coordination store, with a key every process
/// of the fleet reads from the environment variable `coordination.with.signing-key-env`.
///
/// Why: whoever can write to a shared store (any client with the Redis password, any process of
/// the user owning the state file) could otherwise sign the fleet in with tokens of their choosing,
/// log it out, or hold its refreshes with an eternal lease (issue 23). With a key, every value a
/// process reads from the store is used only when its HMAC-SHA256 seal matches; anything else is
/// refused with a `problem` naming the source, and treated as coordination trouble (a refresh
/// waits or fails with the reason, never a logout, never adoption of what was forged).
///
/// What it covers (each seal names its kind and the store's scope, so a value cannot be moved from
/// one field, key or fleet to another):
/// - the file store: the whole record as one value (``CoordinationRecord/sealFields``), with a
///   revision that grows with every write, so an older copy put back is refused too;
/// - Redis: the credentials with the generation they are stored at, the logout cooldown's end with
///   the session epoch it was decided in (a logout put back after a sign-in is refused), the lease
///   (its fencing token and signed expiry), the recent lease grants (`refresh.limit`), and every
///   announcement on the channel; the fencing counter is checked by prediction (a grant must carry
///   the token the process asked for) and never goes back below what a process has seen.
///
/// A seal reads `v1.<key id>.<mac>`: the key id (8 hex digits of an HMAC of a constant) tells a
/// value signed with another key (a rotation half done) from an unsigned or forged one, without
/// revealing the key.
///
/// ```swift
/// let signer = SharedStateSigner(key: Data(env["FLEET_KEY"]!.utf8), scope: "redis:mobile-api")
/// let seal = signer.seal("logout", ["1767225600000"])
/// signer.check(seal, "logout", ["1767225600000"])   // .valid
/// ```
///
/// Concurrency contract: a value; every method is pure.
package struct SharedStateSigner: Sendable, Equatable {
    /// The key padded to a block and XORed with HMAC's inner and outer pads, worked out once.
    private let innerPad: [UInt8]
    private let outerPad: [UInt8]
    /// The store the seals are bound to (`file`, `redis:<key>`): a value signed for one fleet's
    /// key is refused under another's.
    package let scope: String
    /// 8 hex digits identifying the key (not the key): said in refusals.
    package let keyID: String

    package init(key: Data, scope: String = "") {
        var bytes = [UInt8](key)
        if bytes.count > 64 { bytes = SHA256.hash(bytes) }
        let padded = bytes + [UInt8](repeating: 0, count: 64 - bytes.count)
        innerPad = padded.map { $0 ^ 0x36 }
        outerPad = padded.map { $0 ^ 0x5c }
        self.scope = scope
        keyID = String(Self.hmac(innerPad, outerPad, "response-policy signing key id").prefix(8))
    }

    /// The HMAC-SHA256 of `message`, as 64 lower-case hex digits.
    package func sign(_ message: String) -> String { Self.hmac(innerPad, outerPad, message) }

    private static func hmac(_ innerPad: [UInt8], _ outerPad: [UInt8], _ message: String) -> String {
        let inner = SHA256.hash(innerPad + Array(message.utf8))
        let outer = SHA256.hash(outerPad + inner)
        return hex(outer)
    }

    private static let hexDigits = Array("0123456789abcdef".utf8)

    /// Lower-case hex of `bytes` (a seal is made several times per refresh turn: no `String(format:)`).
    private static func hex(_ bytes: [UInt8]) -> String {
        var digits = [UInt8]()
        digits.reserveCapacity(bytes.count * 2)
        for byte in bytes {
            digits.append(hexDigits[Int(byte >> 4)])
            digits.append(hexDigits[Int(byte & 0x0f)])
        }
        return String(decoding: digits, as: UTF8.self)
    }

    /// Whether `mac` signs `message` (compared in constant time).
    package func verify(_ message: String, mac: String?) -> Bool {
        guard let mac else { return false }
        let expected = Array(sign(message).utf8)
        let given = Array(mac.utf8)
        guard expected.count == given.count else { return false }
        var difference: UInt8 = 0
        for index in expected.indices { difference |= expected[index] ^ given[index] }
        return difference == 0
    }

    /// The seal of a value of `kind` made of `fields`, bound to this signer's scope:
    /// `v1.<key id>.<mac>`. Fields are length-prefixed, so no two lists share a message.
    package func seal(_ kind: String, _ fields: [String]) -> String {
        "v1.\(keyID).\(sign(Self.message(kind, scope: scope, fields)))"
    }

    /// What a seal says of a value.
    package enum Check: Sendable, Equatable {
        case valid
        /// No seal at all: written by a process without the key, or forged.
        case missing
        /// Sealed with another key (its id): a fleet whose processes hold different keys.
        case otherKey(String)
        /// A seal of this key that does not match the value: forged, altered or moved.
        case forged

        /// Why a value was refused, for a `problem` (never quoting the value).
        package var refusal: String? {
            switch self {
            case .valid: return nil
            case .missing: return "not signed with this fleet's key (signing-key-env)"
            case .otherKey(let id):
                return "signed with another key (key id \(id)); every process needs the same signing-key-env"
            case .forged: return "its signature does not match (forged, altered or replayed; signing-key-env)"
            }
        }
    }

    /// Checks `seal` against the value of `kind` made of `fields`.
    package func check(_ seal: String?, _ kind: String, _ fields: [String]) -> Check {
        guard let seal, !seal.isEmpty else { return .missing }
        let parts = seal.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, parts[0] == "v1" else { return .forged }
        guard parts[1] == keyID else { return parts[1].count == 8 ? .otherKey(String(parts[1])) : .forged }
        return verify(Self.message(kind, scope: scope, fields), mac: String(parts[2])) ? .valid : .forged
    }

    private static func message(_ kind: String, scope: String, _ fields: [String]) -> String {
        ([kind, scope] + fields).map { "\($0.utf8.count):\($0)" }.joined(separator: "\n")
    }

    /// The fields a credentials seal covers: the tokens, the expiry, the issue time and the
    /// generation they are stored at (so a signed pair cannot be replayed under another generation).
    package static func fields(_ credentials: Credentials, generation: UInt64) -> [String] {
        [
            String(generation), credentials.accessToken, credentials.refreshToken ?? "",
            credentials.expiresAt?.checkedMillisecondsSince1970.map(String.init) ?? "",
        ]
            // Only when there is one: credentials sealed before the issue time was kept still check.
            + (credentials.issuedAt?.checkedMillisecondsSince1970.map { ["issued", String($0)] } ?? [])
    }
}

extension CoordinationRecord {
    /// Every field of the record, in one order, for the file store's seal: a field changed alone
    /// (a generation, a lease's holder or expiry, the fencing counter, the cooldown's end) breaks
    /// the seal of the whole.
    var sealFields: [String] {
        var fields = [String(revision), String(generation), String(fence)]
        if let credentials {
            fields += ["credentials"] + SharedStateSigner.fields(credentials, generation: generation)
        } else {
            fields.append("no-credentials")
        }
        if let lease {
            fields += ["lease", String(lease.fence), String(lease.holder), String(lease.expires)]
            // Only when there is one: a record sealed before askers were kept still checks.
            if lease.asker != 0 { fields += ["asker", String(lease.asker)] }
        }
        if let loggedOutUntil { fields += ["logged-out-until", String(loggedOutUntil)] }
        if let failure { fields += ["failure", String(failure.fence), failure.reason] }
        fields += ["refreshes"] + refreshes.map(String.init)
        // Only once there is one: a record sealed before epochs were kept still checks.
        if epoch > 0 { fields += ["epoch", String(epoch)] }
        // The same for the token endpoint's wait and `refresh.limit`'s generations (issue 29).
        if let embargo { fields += ["retry-after", String(embargo.until), embargo.reason] }
        if !loops.isEmpty { fields += ["loops"] + loops.flatMap { [String($0.generation), String($0.at)] } }
        if accepted > 0 { fields += ["accepted", String(accepted)] }
        return fields
    }
}

/// SHA-256 (FIPS 180-4), for the HMAC above: Foundation on Linux has no CryptoKit, and the
/// package takes no dependency.
enum SHA256 {
    private static let k: [UInt32] = [
        0x428a_2f98, 0x7137_4491, 0xb5c0_fbcf, 0xe9b5_dba5, 0x3956_c25b, 0x59f1_11f1, 0x923f_82a4, 0xab1c_5ed5,
        0xd807_aa98, 0x1283_5b01, 0x2431_85be, 0x550c_7dc3, 0x72be_5d74, 0x80de_b1fe, 0x9bdc_06a7, 0xc19b_f174,
        0xe49b_69c1, 0xefbe_4786, 0x0fc1_9dc6, 0x240c_a1cc, 0x2de9_2c6f, 0x4a74_84aa, 0x5cb0_a9dc, 0x76f9_88da,
        0x983e_5152, 0xa831_c66d, 0xb003_27c8, 0xbf59_7fc7, 0xc6e0_0bf3, 0xd5a7_9147, 0x06ca_6351, 0x1429_2967,
        0x27b7_0a85, 0x2e1b_2138, 0x4d2c_6dfc, 0x5338_0d13, 0x650a_7354, 0x766a_0abb, 0x81c2_c92e, 0x9272_2c85,
        0xa2bf_e8a1, 0xa81a_664b, 0xc24b_8b70, 0xc76c_51a3, 0xd192_e819, 0xd699_0624, 0xf40e_3585, 0x106a_a070,
        0x19a4_c116, 0x1e37_6c08, 0x2748_774c, 0x34b0_bcb5, 0x391c_0cb3, 0x4ed8_aa4a, 0x5b9c_ca4f, 0x682e_6ff3,
        0x748f_82ee, 0x78a5_636f, 0x84c8_7814, 0x8cc7_0208, 0x90be_fffa, 0xa450_6ceb, 0xbef9_a3f7, 0xc671_78f2,
    ]

    static func hash(_ message: [UInt8]) -> [UInt8] {
        var h: [UInt32] = [
            0x6a09_e667, 0xbb67_ae85, 0x3c6e_f372, 0xa54f_f53a, 0x510e_527f, 0x9b05_688c, 0x1f83_d9ab, 0x5be0_cd19,
        ]
        var data = message
        let bitLength = UInt64(message.count) &* 8
        data.append(0x80)
        while data.count % 64 != 56 { data.append(0) }
        for shift in stride(from: 56, through: 0, by: -8) { data.append(UInt8(truncatingIfNeeded: bitLength >> shift)) }
        var w = [UInt32](repeating: 0, count: 64)
        for chunk in stride(from: 0, to: data.count, by: 64) {
            for i in 0..<16 {
                let b = chunk + i * 4
                w[i] =
                    UInt32(data[b]) << 24 | UInt32(data[b + 1]) << 16 | UInt32(data[b + 2]) << 8 | UInt32(data[b + 3])
            }
            for i in 16..<64 {
                let s0 = rotate(w[i - 15], 7) ^ rotate(w[i - 15], 18) ^ (w[i - 15] >> 3)
                let s1 = rotate(w[i - 2], 17) ^ rotate(w[i - 2], 19) ^ (w[i - 2] >> 10)
                w[i] = w[i - 16] &+ s0 &+ w[i - 7] &+ s1
            }
            var (a, b, c, d, e, f, g, hh) = (h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7])
            for i in 0..<64 {
                let s1 = rotate(e, 6) ^ rotate(e, 11) ^ rotate(e, 25)
                let choice = (e & f) ^ (~e & g)
                let t1 = hh &+ s1 &+ choice &+ k[i] &+ w[i]
                let s0 = rotate(a, 2) ^ rotate(a, 13) ^ rotate(a, 22)
                let majority = (a & b) ^ (a & c) ^ (b & c)
                let t2 = s0 &+ majority
                (hh, g, f, e, d, c, b, a) = (g, f, e, d &+ t1, c, b, a, t1 &+ t2)
            }
            h[0] &+= a
            h[1] &+= b
            h[2] &+= c
            h[3] &+= d
            h[4] &+= e
            h[5] &+= f
            h[6] &+= g
            h[7] &+= hh
        }
        return h.flatMap { word in (0..<4).map { UInt8(truncatingIfNeeded: word >> (24 - 8 * $0)) } }
    }

    private static func rotate(_ value: UInt32, _ count: UInt32) -> UInt32 {
        (value >> count) | (value << (32 - count))
    }
}
