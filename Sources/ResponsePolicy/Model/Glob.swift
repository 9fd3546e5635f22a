/// A shell-style pattern for paths and header values: `*` matches any run of characters
/// (slashes included, so `/oauth/*` matches `/oauth/v2/token`), `?` matches one character,
/// everything else matches itself.
///
/// Matching takes time linear in the text, whatever the text and the pattern: a server chooses
/// header values, and a policy's rules are matched against every response, so the work one
/// response can buy must not grow with text × pattern. The pattern is cut at its `*`s into
/// pieces; the first must start the text, the last must end it, and each one between is found,
/// leftmost, by a search that never steps back in the text: Knuth–Morris–Pratt for a piece of
/// plain characters, bit-parallel Shift-And (Baeza-Yates–Gonnet) for a piece holding a `?`, which
/// costs one machine word per 64 characters of the piece for each character of the text.
/// (The textbook "back up to the last `*`" loop is quadratic: `*aaa…ab` against `/aaa…a` took
/// minutes on a 300 KB policy; trying a `?` piece at every start took 4–10 s of CPU for 20 rules
/// against a 64 KiB header.) So one match costs at most `(n + m) × (1 + m / 64)` steps for a text
/// of n and a pattern of m characters, with m at most ``maxLength`` (1,024), and allocates
/// nothing for pieces up to 64 characters (longer ones use a stack buffer).
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
        /// The Shift-And tables; `nil` when the piece has no `?`.
        var shiftAnd: ShiftAnd?

        init(_ scalars: [Unicode.Scalar]) {
            self.scalars = scalars
            guard !scalars.contains("?") else {
                failure = nil
                shiftAnd = ShiftAnd(scalars)
                return
            }
            shiftAnd = nil
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

    /// The bit masks of Shift-And for a piece with `?`: for each character, which positions of the
    /// piece it may stand in (its own, and every `?`'s).
    private struct ShiftAnd: Sendable {
        /// Machine words per mask: one per 64 characters of the piece.
        let words: Int
        let length: Int
        /// Row r is `masks[r * words ..< (r + 1) * words]`. Row 0: a character the piece does not
        /// name (only the `?` positions); row 1: nothing (a `*` of another pattern, in covering).
        let masks: [UInt64]
        /// The row of each ASCII scalar.
        let ascii: [UInt16]
        /// The rows of the other scalars the piece names, sorted by scalar value.
        let others: [(scalar: UInt32, row: UInt16)]

        init(_ piece: [Unicode.Scalar]) {
            length = piece.count
            words = (piece.count + 63) / 64
            var rows: [UInt32: Int] = [:]
            var order: [UInt32] = []
            for scalar in piece where scalar != "?" && rows[scalar.value] == nil {
                rows[scalar.value] = order.count + 2
                order.append(scalar.value)
            }
            var masks = [UInt64](repeating: 0, count: (order.count + 2) * words)
            for (position, scalar) in piece.enumerated() {
                let bit: UInt64 = 1 << UInt64(position % 64)
                let word = position / 64
                if scalar == "?" {
                    // A `?` takes any character: set in row 0 and in every named character's row.
                    masks[word] |= bit
                    for row in 2..<(order.count + 2) { masks[row * words + word] |= bit }
                } else if let row = rows[scalar.value] {
                    masks[row * words + word] |= bit
                }
            }
            self.masks = masks
            var ascii = [UInt16](repeating: 0, count: 128)
            var others: [(scalar: UInt32, row: UInt16)] = []
            for (value, row) in rows {
                if value < 128 { ascii[Int(value)] = UInt16(row) } else { others.append((value, UInt16(row))) }
            }
            self.ascii = ascii
            self.others = others.sorted { $0.scalar < $1.scalar }
        }

        /// The row for a character of the text; a symbolic `*` (another pattern's) matches no position.
        @inline(__always)
        func row(_ character: Unicode.Scalar, symbolic: Bool) -> Int {
            let value = character.value
            if value < 128 {
                if symbolic && character == "*" { return 1 }
                return Int(ascii[Int(value)])
            }
            var low = 0
            var high = others.count
            while low < high {
                let middle = (low + high) / 2
                if others[middle].scalar < value { low = middle + 1 } else { high = middle }
            }
            return low < others.count && others[low].scalar == value ? Int(others[low].row) : 0
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

    /// ``matches(_:)`` with the steps it took (a character read or compared, per machine word of
    /// a Shift-And piece): what the tests bound, since counting is deterministic and wall time is not.
    package func matchWithSteps(_ text: String) -> (matched: Bool, steps: Int) {
        if storage.rejected { return (false, 0) }
        if isLiteral { return (text == pattern, text.utf8.count) }
        var budget = Int.max
        let matched = match(text.unicodeScalars, symbolic: false, budget: &budget) ?? false
        return (matched, Int.max - budget)
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
            guard let after = find(piece, in: text, from: start, to: end, symbolic: symbolic, budget: &budget) else {
                return budget > 0 ? false : nil
            }
            start = after
        }
        return true
    }

    /// The end of the leftmost occurrence of `piece` in `text[from..<to]`, `nil` when there is none.
    private func find<Text: BidirectionalCollection>(
        _ piece: Piece, in text: Text, from: Text.Index, to end: Text.Index, symbolic: Bool, budget: inout Int
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
        guard let shiftAnd = piece.shiftAnd else { return nil }
        return shiftAndFind(shiftAnd, in: text, from: from, to: end, symbolic: symbolic, budget: &budget)
    }

    /// Shift-And: bit i of the state is set when the piece's first i + 1 characters end at the
    /// current character; each character of the text costs one shift and one AND per word.
    private func shiftAndFind<Text: BidirectionalCollection>(
        _ table: ShiftAnd, in text: Text, from: Text.Index, to end: Text.Index, symbolic: Bool, budget: inout Int
    ) -> Text.Index? where Text.Element == Unicode.Scalar {
        let words = table.words
        let lastWord = (table.length - 1) / 64
        let lastBit: UInt64 = 1 << UInt64((table.length - 1) % 64)
        if words == 1 {
            var state: UInt64 = 0
            var index = from
            while index < end {
                state = ((state << 1) | 1) & table.masks[table.row(text[index], symbolic: symbolic)]
                index = text.index(after: index)
                budget -= 1
                if state & lastBit != 0 { return index }
                if budget <= 0 { return nil }
            }
            return nil
        }
        return withUnsafeTemporaryAllocation(of: UInt64.self, capacity: words) { state in
            state.initialize(repeating: 0)
            var index = from
            while index < end {
                let base = table.row(text[index], symbolic: symbolic) * words
                var carry: UInt64 = 1
                for word in 0..<words {
                    let value = state[word]
                    state[word] = ((value << 1) | carry) & table.masks[base + word]
                    carry = value >> 63
                }
                index = text.index(after: index)
                budget -= words
                if state[lastWord] & lastBit != 0 { return index }
                if budget <= 0 { return nil }
            }
            return nil
        }
    }
}
