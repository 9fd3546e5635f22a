import Foundation

/// SeededGenerator: a tiny, well-distributed, seeded generator, so "random" test inputs are the same on
/// every run and a failing case can be replayed from its seed. The library's `SeededRandomSource`
/// (the testing product) is the same algorithm behind a lock, for an engine to share; tests that
/// draw inputs in a loop use this value type, `inout`.
public struct SeededGenerator: RandomNumberGenerator, Sendable {
    private var state: UInt64

    public init(seed: UInt64) { state = seed }

    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }

    /// A number in `range`.
    public mutating func int(_ range: ClosedRange<Int>) -> Int {
        range.lowerBound + Int(next() % UInt64(range.count))
    }

    /// True with the probability `percent` in 100.
    public mutating func chance(_ percent: Int) -> Bool { int(0...99) < percent }

    /// True with the probability 1 in `n`.
    public mutating func oneIn(_ n: Int) -> Bool { next() % UInt64(n) == 0 }

    /// One of `items`.
    public mutating func pick<T>(_ items: [T]) -> T { items[int(0...(items.count - 1))] }
}

/// The repository root, found by walking up from this file to the folder holding `Package.swift`
/// (the current folder when there is none).
public let repositoryRoot: URL = {
    var url = URL(fileURLWithPath: #filePath)
    while url.path != "/" {
        url.deleteLastPathComponent()
        if FileManager.default.fileExists(atPath: url.appendingPathComponent("Package.swift").path) { return url }
    }
    return URL(fileURLWithPath: FileManager.default.currentDirectoryPath)
}()
