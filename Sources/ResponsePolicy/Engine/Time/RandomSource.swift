/// Uniform random numbers for jitter and idempotency keys; injected so tests and simulations
/// are deterministic.
public protocol RandomSource: Sendable {
    /// A uniform draw from [0, 1).
    func nextUnit() -> Double
    /// 64 random bits.
    func nextBits() -> UInt64
}

extension RandomSource {
    public func nextUnit() -> Double { Double(nextBits() >> 11) * 0x1.0p-53 }
}

/// The system's random number generator.
public struct SystemRandomSource: RandomSource {
    public init() {}
    public func nextBits() -> UInt64 {
        var generator = SystemRandomNumberGenerator()
        return generator.next()
    }
}
