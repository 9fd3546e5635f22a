/// A shell-style pattern for paths and header values: `*` matches any run of characters
/// (slashes included, so `/oauth/*` matches `/oauth/v2/token`), `?` matches one character,
/// everything else matches itself.
public struct Glob: Sendable, Hashable, CustomStringConvertible {
    public let pattern: String
    private let scalars: [Unicode.Scalar]
    private let isLiteral: Bool

    public init(_ pattern: String) {
        self.pattern = pattern
        scalars = Array(pattern.unicodeScalars)
        isLiteral = !pattern.contains("*") && !pattern.contains("?")
    }

    public var description: String { pattern }

    public func matches(_ text: String) -> Bool {
        if isLiteral { return text == pattern }
        // Walks the text's scalar view in place (no copy: this runs for every request that
        // reaches a route), backtracking to the last `*` on a mismatch.
        let input = text.unicodeScalars
        var p = 0
        var t = input.startIndex
        var starP = -1
        var starT = input.startIndex
        while t < input.endIndex {
            if p < scalars.count, scalars[p] == "?" || scalars[p] == input[t] {
                p += 1
                t = input.index(after: t)
            } else if p < scalars.count, scalars[p] == "*" {
                starP = p
                starT = t
                p += 1
            } else if starP >= 0 {
                p = starP + 1
                starT = input.index(after: starT)
                t = starT
            } else {
                return false
            }
        }
        while p < scalars.count, scalars[p] == "*" { p += 1 }
        return p == scalars.count
    }

    /// True when every text this glob matches, `other` matches too (a conservative check used
    /// to find shadowed rules: `*` covers everything, a literal is covered by itself).
    func isCovered(by other: Glob) -> Bool {
        if other.pattern == "*" || other.pattern == pattern { return true }
        return isLiteral && other.matches(pattern)
    }
}
