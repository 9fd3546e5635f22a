/// Uniform random numbers for jitter and idempotency keys; injected so tests and simulations
/// are deterministic.
public protocol RandomSource: Sendable {
    /// A uniform draw from [0, 1).
    func nextUnit() -> Double
    /// 64 random bits.
    func nextBits() -> UInt64
}

extension RandomSource {
    /// The top 53 bits of ``nextBits()``, as a `Double` in [0, 1).
    public func nextUnit() -> Double { Double(nextBits() >> 11) * 0x1.0p-53 }
}

/// The system's random number generator.
package struct SystemRandomSource: RandomSource {
    /// The system's generator.
    package init() {}
    /// 64 bits from `SystemRandomNumberGenerator`.
    package func nextBits() -> UInt64 {
        var generator = SystemRandomNumberGenerator()
        return generator.next()
    }
}
