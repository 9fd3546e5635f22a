import ResponsePolicy

/// A seeded SplitMix64 generator: the same seed gives the same draws.
public final class SeededRandomSource: RandomSource {
    private let state: Locked<UInt64>
    /// A generator starting from `seed`.
    public init(seed: UInt64) { state = Locked(seed) }
    /// The next 64 bits of the sequence.
    public func nextBits() -> UInt64 {
        state.withLock { state in
            state &+= 0x9E37_79B9_7F4A_7C15
            var z = state
            z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
            z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
            return z ^ (z >> 31)
        }
    }
}
