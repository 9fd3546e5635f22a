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
    /// The largest file read, in bytes.
    public var maxFileBytes: Int
    /// How deep mappings and lists may nest.
    public var maxDepth: Int
    /// How many nodes a file may have, aliases expanded.
    public var maxNodes: Int

    /// Limits; the defaults are ``default``'s.
    public init(maxFileBytes: Int = 16 << 20, maxDepth: Int = 64, maxNodes: Int = 2_000_000) {
        self.maxFileBytes = maxFileBytes
        self.maxDepth = maxDepth
        self.maxNodes = maxNodes
    }

    /// 16 MiB, 64 levels, 2,000,000 nodes.
    public static let `default` = YAMLLimits()
}
