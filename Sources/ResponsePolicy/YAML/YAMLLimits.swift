/// Bounds the loader enforces so hostile input fails with a positioned error instead of
/// exhausting memory or time.
///
/// The defaults fit a 20,000-rule policy with room to spare:
/// - `maxFileBytes`: `16 MiB`. A policy is configuration, not data.
/// - `maxDepth`: `64` nested mappings/lists. Real policies nest 5 deep.
/// - `maxNodes`: `2,000,000` nodes after alias expansion. Each alias counts the whole subtree it
///   repeats, so a "billion laughs" file stops at the alias that crosses the bound instead of
///   expanding exponentially.
public struct YAMLLimits: Sendable, Hashable {
    public var maxFileBytes: Int
    public var maxDepth: Int
    public var maxNodes: Int

    public init(maxFileBytes: Int = 16 << 20, maxDepth: Int = 64, maxNodes: Int = 2_000_000) {
        self.maxFileBytes = maxFileBytes
        self.maxDepth = maxDepth
        self.maxNodes = maxNodes
    }

    public static let `default` = YAMLLimits()
}
