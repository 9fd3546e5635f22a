/// "Did you mean" suggestions for misspelt keys and names.
package enum Suggestion {
    /// The candidate closest to `word` by edit distance, when it is close enough to be a likely
    /// typo: one edit for a word of two letters or more (`od` for `do`), else fewer edits than half
    /// the word's length, and at most 2 (3 for a word of 9 letters or more, so a singular of a long
    /// key finds it: `max-retry` is 3 edits from `max-retries`).
    package static func closest(to word: String, in candidates: [String]) -> String? {
        let source = Array(word.lowercased().unicodeScalars)
        guard source.count <= 64 else { return nil }
        let most = source.count >= 9 ? 3 : 2
        var best: (String, Int)?
        for candidate in candidates {
            let distance = editDistance(source, Array(candidate.unicodeScalars))
            let close = distance == 1 ? source.count >= 2 : distance * 2 < source.count
            if distance <= most, close, distance < (best?.1 ?? Int.max) {
                best = (candidate, distance)
            }
        }
        return best?.0
    }

    /// `; did you mean 'x'?` or nothing.
    package static func hint(for word: String, in candidates: [String]) -> String {
        closest(to: word, in: candidates).map { "; did you mean '\($0)'?" } ?? ""
    }

    /// Optimal string alignment distance (Levenshtein plus adjacent transpositions).
    static func editDistance(_ a: [Unicode.Scalar], _ b: [Unicode.Scalar]) -> Int {
        if a.isEmpty { return b.count }
        if b.isEmpty { return a.count }
        var previous2 = [Int](repeating: 0, count: b.count + 1)
        var previous = Array(0...b.count)
        var current = [Int](repeating: 0, count: b.count + 1)
        for i in 1...a.count {
            current[0] = i
            for j in 1...b.count {
                let cost = a[i - 1] == b[j - 1] ? 0 : 1
                current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + cost)
                if i > 1, j > 1, a[i - 1] == b[j - 2], a[i - 2] == b[j - 1] {
                    current[j] = min(current[j], previous2[j - 2] + 1)
                }
            }
            (previous2, previous, current) = (previous, current, previous2)
        }
        return previous[b.count]
    }
}
