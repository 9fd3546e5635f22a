import Foundation
import Testing

@testable import ResponsePolicy

/// Every finding for a policy text, as `policy lint` would report it.
func findings(_ yaml: String, catalog: PluginCatalog = PluginCatalog(), limits: YAMLLimits = .default) -> [Diagnostic] {
    Policy.analyze(bytes: Array(yaml.utf8), file: "test.yaml", catalog: catalog, limits: limits).diagnostics
}

/// The findings rendered one per line, `test.yaml:L:C: severity: message [rule]`.
func rendered(_ yaml: String) -> String {
    findings(yaml).map(\.description).joined(separator: "\n")
}

/// The errors only, rendered one per line.
func renderedErrors(_ yaml: String) -> String {
    findings(yaml).filter { $0.severity == .error }.map(\.description).joined(separator: "\n")
}

/// Loads a policy that must be valid, recording its errors otherwise.
func validPolicy(_ yaml: String, sourceLocation: SourceLocation = #_sourceLocation) throws -> Policy {
    do {
        return try Policy.load(yaml: yaml, file: "test.yaml")
    } catch {
        Issue.record("policy did not load: \(error)", sourceLocation: sourceLocation)
        throw error
    }
}

/// The repository root, found from this file's location.
let repositoryRoot: URL = {
    var url = URL(fileURLWithPath: #filePath)
    while url.path != "/" {
        url.deleteLastPathComponent()
        if FileManager.default.fileExists(atPath: url.appendingPathComponent("Package.swift").path) { return url }
    }
    return URL(fileURLWithPath: FileManager.default.currentDirectoryPath)
}()

/// SplitMix64: a tiny, well-distributed, seeded generator, so "random" test inputs are the same
/// on every run. (The library's `SeededRandomSource` is the same algorithm behind a lock; tests
/// that generate inputs in a loop use this value type.)
struct SplitMix64: RandomNumberGenerator {
    private var state: UInt64

    init(seed: UInt64) { state = seed }

    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }

    mutating func int(_ range: ClosedRange<Int>) -> Int {
        range.lowerBound + Int(next() % UInt64(range.count))
    }

    /// True with probability 1/n.
    mutating func chance(_ n: Int) -> Bool { next() % UInt64(n) == 0 }
}
