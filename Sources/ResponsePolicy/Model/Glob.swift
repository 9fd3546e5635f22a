/// A shell-style pattern for paths and header values: `*` matches any run of characters
/// (slashes included, so `/oauth/*` matches `/oauth/v2/token`), `?` matches one character,
/// everything else matches itself.
///
/// Matching takes time linear in the text for the usual patterns, whatever the input: the pattern
/// is cut at its `*`s into pieces; the first must start the text, the last must end it, and each
/// one between is found, leftmost, with Knuth–Morris–Pratt, which never steps back in the text.
/// (The textbook "back up to the last `*`" loop is quadratic: `*aaa…ab` against `/aaa…a` took
/// minutes on a 300 KB policy.) Only a piece holding a `?` is searched naively, which costs at most
/// its length per character of text; ``maxLength`` bounds that, and the policy decoder refuses a
/// longer pattern with a positioned error.
package struct Glob: Sendable, Hashable, CustomStringConvertible {
    /// Everything in one immutable object, so that copying a glob (rules and conditions are
    /// copied often, in lint above all) costs one reference count.
    private final class Storage: Sendable {
        let pattern: String
        let scalars: [Unicode.Scalar]
        let isLiteral: Bool
        /// The pattern cut at `*`: `nil` without any `*`.
        let pieces: [Piece]?
        let patternHash: Int
        /// Over ``Glob/maxLength`` in a policy: an error was reported, and the glob matches nothing.
        let rejected: Bool

        /// A pattern the decoder refused: kept only to name it, without the work of compiling it.
        init(rejected pattern: String) {
            self.pattern = pattern
            scalars = []
            isLiteral = true
            pieces = nil
            patternHash = pattern.utf8.count
            rejected = true
        }

        init(_ pattern: String) {
            self.pattern = pattern
            rejected = false
            scalars = Array(pattern.unicodeScalars)
            isLiteral = !scalars.contains("*") && !scalars.contains("?")
            pieces =
                scalars.contains("*")
                ? scalars.split(separator: "*", omittingEmptySubsequences: false).map { Piece(Array($0)) } : nil
            var hasher = Hasher()
            hasher.combine(pattern)
            patternHash = hasher.finalize()
        }
    }

    private let storage: Storage

    package var pattern: String { storage.pattern }
    private var scalars: [Unicode.Scalar] { storage.scalars }
    private var isLiteral: Bool { storage.isLiteral }
    private var pieces: [Piece]? { storage.pieces }

    /// The longest pattern a policy may hold, in characters (Unicode scalars): 1,024.
    package static let maxLength = 1024

    /// How many comparison steps one lint run may spend on glob-against-glob covering checks
    /// (`shadowed-rule`) before it stops proving coverage: 20 million, about 0.1 s. Real policies
    /// need a few thousand; only a file built to be slow reaches it, and then its later glob rules
    /// are not reported as shadowed rather than making lint hang.
    static let coverBudget = 20_000_000

    /// One run of a pattern between `*`s, ready to search for.
    private struct Piece: Sendable {
        var scalars: [Unicode.Scalar]
        /// The Knuth–Morris–Pratt failure table; `nil` when the piece holds a `?`.
        var failure: [Int]?

        init(_ scalars: [Unicode.Scalar]) {
            self.scalars = scalars
            guard !scalars.contains("?") else {
                failure = nil
                return
            }
            var table = [Int](repeating: 0, count: scalars.count)
            var k = 0
            for index in scalars.indices.dropFirst() {
                while k > 0, scalars[index] != scalars[k] { k = table[k - 1] }
                if scalars[index] == scalars[k] { k += 1 }
                table[index] = k
            }
            failure = table
        }
    }

    package init(_ pattern: String) {
        storage = Storage(pattern)
    }

    /// A pattern over ``maxLength`` that the decoder reported as an error: it matches nothing and
    /// covers nothing, so the rest of lint neither spends time on it nor reads its rule as
    /// matching everything.
    init(rejected pattern: String) {
        storage = Storage(rejected: pattern)
    }

    package var description: String { pattern }

    package static func == (a: Glob, b: Glob) -> Bool {
        a.storage === b.storage
            || (!a.storage.rejected && !b.storage.rejected && a.storage.patternHash == b.storage.patternHash
                && a.pattern == b.pattern)
    }

    package func hash(into hasher: inout Hasher) {
        hasher.combine(storage.patternHash)
    }

    package func matches(_ text: String) -> Bool {
        if storage.rejected { return false }
        if isLiteral { return text == pattern }
        var budget = Int.max
        return match(text.unicodeScalars, symbolic: false, budget: &budget) ?? false
    }

    /// True when every text this glob matches, `other` matches too. Conservative: `false` also
    /// when that is not proven, or when proving it would take more than `budget` steps.
    ///
    /// It holds when `other`, read as a pattern, matches this pattern read as a text in which this
    /// pattern's `*` and `?` are symbols of their own: `other`'s `*` may take any of them, its `?`
    /// a `?` or a character, and its characters only themselves. (`/api/*` covers `/api/v?/*`.)
    func isCovered(by other: Glob, budget: inout Int) -> Bool {
        if storage.rejected || other.storage.rejected { return false }
        if other == self || (other.scalars.count == 1 && other.scalars[0] == "*") { return true }
        if other.isLiteral { return false }  // a different literal, or a pattern with wildcards
        // A pattern over the limit is already an error; proving anything about it is not worth the time.
        if storage.rejected || other.storage.rejected || scalars.count > Self.maxLength
            || other.scalars.count > Self.maxLength
        {
            return false
        }
        return other.match(scalars, symbolic: true, budget: &budget) ?? false
    }

    /// ``isCovered(by:budget:)`` without a limit.
    func isCovered(by other: Glob) -> Bool {
        var budget = Int.max
        return isCovered(by: other, budget: &budget)
    }

    // MARK: - Matching

    /// Whether the pattern matches `text`; `nil` when `budget` ran out first. With `symbolic`,
    /// `*` and `?` in `text` are wildcards of another pattern: this pattern's `?` does not match a `*`.
    private func match<Text: BidirectionalCollection>(
        _ text: Text, symbolic: Bool, budget: inout Int
    ) -> Bool? where Text.Element == Unicode.Scalar {
        func same(_ p: Unicode.Scalar, _ t: Unicode.Scalar) -> Bool {
            p == "?" ? !(symbolic && t == "*") : p == t
        }
        guard let pieces else {
            // No `*`: one character for each of the pattern's.
            var index = text.startIndex
            for p in scalars {
                budget -= 1
                guard index < text.endIndex, budget > 0 else { return index < text.endIndex ? nil : false }
                guard same(p, text[index]) else { return false }
                index = text.index(after: index)
            }
            return index == text.endIndex
        }
        // The first piece starts the text.
        var start = text.startIndex
        for p in pieces[0].scalars {
            budget -= 1
            guard start < text.endIndex, same(p, text[start]) else { return false }
            start = text.index(after: start)
        }
        // The last piece ends it, after the first.
        var end = text.endIndex
        for p in pieces[pieces.count - 1].scalars.reversed() {
            budget -= 1
            guard end > start else { return false }
            end = text.index(before: end)
            guard same(p, text[end]) else { return false }
        }
        // Each piece between, leftmost, in order.
        for piece in pieces.dropFirst().dropLast() where !piece.scalars.isEmpty {
            guard budget > 0 else { return nil }
            guard let after = find(piece, in: text, from: start, to: end, same: same, budget: &budget) else {
                return budget > 0 ? false : nil
            }
            start = after
        }
        return true
    }

    /// The end of the leftmost occurrence of `piece` in `text[from..<to]`, `nil` when there is none.
    private func find<Text: BidirectionalCollection>(
        _ piece: Piece, in text: Text, from: Text.Index, to end: Text.Index,
        same: (Unicode.Scalar, Unicode.Scalar) -> Bool, budget: inout Int
    ) -> Text.Index? where Text.Element == Unicode.Scalar {
        let needle = piece.scalars
        if let failure = piece.failure {
            // Knuth–Morris–Pratt: each character of the text is read once.
            var matched = 0
            var index = from
            while index < end {
                let character = text[index]
                while matched > 0, needle[matched] != character {
                    matched = failure[matched - 1]
                    budget -= 1
                }
                if needle[matched] == character { matched += 1 }
                index = text.index(after: index)
                budget -= 1
                if matched == needle.count { return index }
                if budget <= 0 { return nil }
            }
            return nil
        }
        // A piece with `?`: tried at each start; at most its length per character.
        var candidate = from
        while candidate < end {
            var index = candidate
            var matched = 0
            while matched < needle.count {
                guard index < end else { return nil }  // no room here, so none further on either
                budget -= 1
                guard same(needle[matched], text[index]) else { break }
                matched += 1
                index = text.index(after: index)
            }
            if matched == needle.count { return index }
            if budget <= 0 { return nil }
            candidate = text.index(after: candidate)
        }
        return nil
    }
}
