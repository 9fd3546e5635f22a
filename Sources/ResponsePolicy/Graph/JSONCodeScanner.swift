// A bounded, single-pass, allocation-free locator for one scalar ("business code") inside a JSON body.
//
// Why this exists: the HTTP engine looks at the business code of *every* response (for example `status` in
// `{"status":1401,...}` or `errors.0.code`). Decoding the whole body with `JSONDecoder`/`JSONSerialization` would
// allocate a full object graph just to read one value. This scanner instead walks the bytes once, descends only
// into the containers named by the path, skips everything else with tight loops, and stops as soon as the value
// at the path is complete. It never looks at the rest of the document.
//
// Design notes:
// - No recursion: containers that are skipped are skipped with an integer depth counter, so hostile nesting depth
//   cannot overflow the stack. Every loop advances its index and is bounded by `min(body.count, maxBytes)`.
// - Bytes are examined eight at a time with SWAR ("SIMD within a register") bit tricks on `UInt64`: strings are
//   skipped by looking only for `"` and `\`, and skipped containers are classified (quotes, escapes, brackets,
//   in-string mask, bracket counts) without a data-dependent branch per structural byte. This is portable, needs no
//   libc (`memchr` would need Glibc/Darwin), no Foundation and no CPU feature beyond the baseline.
// - Validation is strict where it decides the answer and cheap everywhere else: the containers on the path, the
//   keys/commas/colons of their members, sibling scalars and the value itself are checked against the JSON grammar.
//   The *inside* of a skipped nested container is only checked for balanced brackets and terminated strings; the
//   exact grammar of data we are not interested in is deliberately not validated (that is what makes skipping
//   fast). The remainder of the document after the value is never read beyond the one delimiter that proves the
//   value is complete.
// - `JSONPath` pre-flattens its segments into plain integers and one contiguous key buffer, so the hot loop does no
//   reference counting and no allocation.

/// A dot path into a JSON document: `status`, `data.result.code`, `errors.0.code`.
///
/// Objects are addressed by key, arrays by 0-based index. A segment made only of ASCII digits in canonical form
/// (`0`, `7`, `42`, not `007`, and representable as `Int`) is an ``Segment/index(_:)``; it also matches the object
/// key with the same text when the container at that point is an object. A digit segment with leading zeros
/// (`007`) or one too large for `Int` is kept as a ``Segment/key(_:)`` — following RFC 6901, such text is not an
/// array index — so it only ever matches an object key with exactly that text.
///
/// Keys containing `.` cannot be written in the text form (there is no escape syntax); they are still matched
/// correctly by the scanner when a path is built from segments.
///
/// `JSONPath` is an immutable value type and `Sendable`; build it once (e.g. when a policy is loaded) and reuse it
/// from any thread.
package struct JSONPath: Sendable, Hashable {
    package enum Segment: Sendable, Hashable { case key([UInt8]), index(Int) }

    package let segments: [Segment]

    /// One step of the walk, flattened to plain integers so the scanner's loop touches no reference-counted data.
    struct Step: Sendable {
        /// Offset of this step's key text in `keyBytes`.
        var keyStart: Int
        /// Byte count of this step's key text (the decimal digits for an index segment).
        var keyCount: Int
        /// The array index, or -1 when the segment is a key (a key never matches inside an array).
        var index: Int
    }

    /// The key text of every segment, back to back: the UTF-8 of a key, or the decimal digits of an index.
    let keyBytes: [UInt8]
    let steps: [Step]

    /// Parses "a.b.0.c": a segment of only ASCII digits is an index (also usable as an object key "0" – when the
    /// container at that point is an object, match the key text "0"; when it is an array, use the index). Empty
    /// segments are invalid -> nil.
    package init?(_ text: String) {
        var segments: [Segment] = []
        for part in text.utf8.split(separator: UInt8(ascii: "."), omittingEmptySubsequences: false) {
            guard !part.isEmpty else { return nil }
            segments.append(Self.segment(for: part))
        }
        self.init(segments: segments)
    }

    /// Builds a path from already split segments (keys may contain any bytes, including `.`).
    /// Returns nil for an empty segment list: the scanner only looks up values inside a container.
    init?(segments: [Segment]) {
        guard !segments.isEmpty else { return nil }
        var keyBytes: [UInt8] = []
        var steps: [Step] = []
        steps.reserveCapacity(segments.count)
        for segment in segments {
            let start = keyBytes.count
            let index: Int
            switch segment {
            case .key(let key):
                keyBytes.append(contentsOf: key)
                index = -1
            case .index(let value):
                keyBytes.append(contentsOf: String(value).utf8)
                index = value >= 0 ? value : -1
            }
            steps.append(Step(keyStart: start, keyCount: keyBytes.count - start, index: index))
        }
        self.segments = segments
        self.keyBytes = keyBytes
        self.steps = steps
    }

    /// Classifies one non-empty dot-separated part of a text path.
    private static func segment(for part: Substring.UTF8View.SubSequence) -> Segment {
        let isDigits = part.allSatisfy { $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }
        let isCanonical = part.count == 1 || part.first != UInt8(ascii: "0")
        if isDigits, isCanonical, let value = Int(Substring(part)) {
            return .index(value)
        }
        return .key(Array(part))
    }

    // Equality and hashing are defined by the segments alone; the flattened fields are derived from them.
    package static func == (lhs: JSONPath, rhs: JSONPath) -> Bool {
        lhs.segments == rhs.segments
    }

    package func hash(into hasher: inout Hasher) {
        hasher.combine(segments)
    }
}

/// Finds the scalar at a ``JSONPath`` in a JSON body in one bounded pass, without building a document.
///
/// **Result.** The code is the text of a JSON scalar: a string's unescaped content (`"1401"` -> `1401`), a
/// number's literal exactly as written (`1401`, `-3`, `1.5e3`), or `true`/`false`. The result is `nil` for `null`,
/// an object or array at the path, a missing path, malformed JSON met before the value is complete, a value that is
/// not complete within `maxBytes`, an empty body, or an empty/negative `maxBytes`.
///
/// **Completeness.** A value counts as complete only when the delimiter after it (`,` or the closing bracket of its
/// container, after optional whitespace) lies within the scanned window. So a number cut by `maxBytes` (`14` of
/// `1401`) is never reported, and a cut body gives either the same answer as the full body or `nil`.
///
/// **Input.** Bytes are UTF-8 JSON; a leading UTF-8 BOM and JSON whitespace (space, tab, CR, LF) are accepted.
/// Unescaped control characters inside the value string are malformed. Invalid UTF-8 inside a string is passed
/// through unchanged by ``withCode(in:at:maxBytes:_:)`` and repaired (U+FFFD) by ``code(in:at:maxBytes:)``.
/// Duplicate keys: the first occurrence wins. Lone UTF-16 surrogates in `\u` escapes are malformed.
///
/// **Safety and cost.** Reads never go past `min(body.count, maxBytes)`; every loop advances, so any input
/// terminates; skipping uses an integer depth counter, not recursion. Time is O(bytes scanned). No allocation
/// happens on the hot path (`withCode` with a number, boolean or escape-free string); see
/// ``withCode(in:at:maxBytes:_:)`` for the one rare allocating case.
///
/// **Concurrency.** Both functions are pure: they read only their arguments, keep no state, and are safe to call
/// concurrently from any thread or isolation domain. The caller must keep `body` valid and unmodified for the
/// duration of the call (the raw buffer pointer itself is not `Sendable`, so sharing it is the caller's contract).
package enum JSONCodeScanner {
    /// Size of the stack buffer used by ``withCode(in:at:maxBytes:_:)`` to unescape a string value.
    static let inlineUnescapeCapacity = 64

    /// Finds the scalar at `path` in the first `maxBytes` bytes of `body`.
    /// Returns the code as text: a JSON string's unescaped content (so "1401" -> 1401), a number's literal text
    /// exactly as written (1401, -3, 1.5e3), "true"/"false".
    /// Returns nil for: null, an object or array at the path, a missing path, malformed JSON met before the value is
    /// found, a value not finished within maxBytes, leading whitespace/BOM issues you can't handle.
    ///
    /// Allocates only the returned `String` (none for codes of up to 15 UTF-8 bytes, which `String` stores inline).
    package static func code(in body: UnsafeRawBufferPointer, at path: JSONPath, maxBytes: Int = 65_536) -> String? {
        withCode(in: body, at: path, maxBytes: maxBytes) { bytes in
            bytes.map { String(decoding: $0, as: UTF8.self) }
        }
    }

    /// Same as ``code(in:at:maxBytes:)``, but calls `use` with the raw UTF-8 bytes of the value instead of creating
    /// a `String`, so a caller can look the code up in a table without allocating. `use` receives `nil` exactly when
    /// `code` would return `nil`; an empty string value gives an empty, non-nil buffer.
    ///
    /// - Numbers, `true`/`false` and strings without escapes are passed as a slice of `body` (no copy).
    /// - A string with escapes is unescaped into a 64-byte stack buffer (`withUnsafeTemporaryAllocation`). When its
    ///   escaped form is longer than 64 bytes (its unescaped form is never longer than its escaped form), it is
    ///   unescaped into a heap array instead: a found value is never reported as missing, and real-world codes are
    ///   far shorter, so this allocation is off the hot path.
    ///
    /// The buffer passed to `use` is valid only during the call; do not let it escape.
    package static func withCode<R>(
        in body: UnsafeRawBufferPointer, at path: JSONPath, maxBytes: Int = 65_536,
        _ use: (UnsafeRawBufferPointer?) -> R
    ) -> R {
        guard let base = body.baseAddress, maxBytes > 0, !body.isEmpty else { return use(nil) }
        let limit = min(body.count, maxBytes)
        let bytes = Bytes(base: base)
        let found = path.keyBytes.withUnsafeBufferPointer { keys in
            path.steps.withUnsafeBufferPointer { steps in
                locate(bytes, limit: limit, steps: steps, keys: keys)
            }
        }
        switch found {
        case nil:
            return use(nil)
        case .slice(let start, let end):
            return use(UnsafeRawBufferPointer(start: base + start, count: end - start))
        case .escapedString(let start, let end):
            return withUnescaped(bytes, from: start, to: end, use)
        }
    }

    /// Unescapes `b[from..<to]` and passes the result to `use`. Kept out of line: the stack allocation needs generic
    /// metadata when `R` is not specialized (a caller in another module), which would otherwise be paid on every call.
    @inline(never)
    static func withUnescaped<R>(_ b: Bytes, from: Int, to: Int, _ use: (UnsafeRawBufferPointer?) -> R) -> R {
        let capacity = to - from
        if capacity <= inlineUnescapeCapacity {
            return withUnsafeTemporaryAllocation(byteCount: inlineUnescapeCapacity, alignment: 1) { buffer in
                guard let out = buffer.baseAddress, let count = unescape(b, from: from, to: to, into: out)
                else { return use(nil) }
                return use(UnsafeRawBufferPointer(start: out, count: count))
            }
        }
        var valid = true
        let heap = [UInt8](unsafeUninitializedCapacity: capacity) { buffer, initialized in
            if let out = buffer.baseAddress, let count = unescape(b, from: from, to: to, into: out) {
                initialized = count
            } else {
                initialized = 0
                valid = false
            }
        }
        guard valid else { return use(nil) }
        return heap.withUnsafeBytes { use($0) }
    }
}

// MARK: - Internals

extension JSONCodeScanner {
    /// Where the value was found, as byte offsets into the body.
    enum Location: Equatable {
        /// The value's bytes are `body[start..<end]` verbatim (number, boolean, string content without escapes).
        case slice(start: Int, end: Int)
        /// A string whose raw content `body[start..<end]` contains escapes and must be unescaped.
        case escapedString(start: Int, end: Int)
    }

    /// Byte reader over raw memory. `load(as: UInt8)` is valid whatever type the memory is bound to; in release
    /// builds it compiles to a plain byte load. Callers guarantee `0 <= i < limit <= body.count`.
    struct Bytes {
        let base: UnsafeRawPointer

        @inline(__always)
        subscript(_ i: Int) -> UInt8 { base.load(fromByteOffset: i, as: UInt8.self) }

        /// Eight bytes starting at `i`, byte `i` in the lowest bits. Requires `i + 8 <= limit`.
        @inline(__always)
        func word(at i: Int) -> UInt64 {
            UInt64(littleEndian: base.loadUnaligned(fromByteOffset: i, as: UInt64.self))
        }
    }

    // ASCII bytes used by the grammar.
    static let quote: UInt8 = 0x22  // "
    static let backslash: UInt8 = 0x5C  // \
    static let openObject: UInt8 = 0x7B  // {
    static let closeObject: UInt8 = 0x7D  // }
    static let openArray: UInt8 = 0x5B  // [
    static let closeArray: UInt8 = 0x5D  // ]
    static let comma: UInt8 = 0x2C  // ,
    static let colon: UInt8 = 0x3A  // :
    static let minus: UInt8 = 0x2D  // -
    static let zero: UInt8 = 0x30  // 0
    static let nine: UInt8 = 0x39  // 9

    /// Walks `steps` from the document root and returns the location of the scalar they lead to.
    static func locate(
        _ b: Bytes, limit: Int, steps: UnsafeBufferPointer<JSONPath.Step>, keys: UnsafeBufferPointer<UInt8>
    ) -> Location? {
        guard !steps.isEmpty else { return nil }
        var i = 0
        if limit >= 3, b[0] == 0xEF, b[1] == 0xBB, b[2] == 0xBF { i = 3 }
        var closer: UInt8 = 0
        for step in steps {
            i = skipWhitespace(b, from: i, limit: limit)
            guard i < limit else { return nil }
            let c = b[i]
            if c == openObject {
                let key = UnsafeBufferPointer(rebasing: keys[step.keyStart..<(step.keyStart + step.keyCount)])
                guard let value = findMember(b, from: i + 1, limit: limit, key: key) else { return nil }
                i = value
                closer = closeObject
            } else if c == openArray {
                guard step.index >= 0, let value = findElement(b, from: i + 1, limit: limit, index: step.index)
                else { return nil }
                i = value
                closer = closeArray
            } else {
                return nil
            }
        }
        // `i` is at the first byte of the value (findMember/findElement skipped the whitespace before it).
        let found: Location
        let end: Int
        switch b[i] {
        case quote:
            guard let (close, escaped) = scanValueString(b, from: i + 1, limit: limit) else { return nil }
            found = escaped ? .escapedString(start: i + 1, end: close) : .slice(start: i + 1, end: close)
            end = close + 1
        case minus, zero...nine:
            guard let numberEnd = scanNumber(b, from: i, limit: limit) else { return nil }
            found = .slice(start: i, end: numberEnd)
            end = numberEnd
        case UInt8(ascii: "t"):
            guard matchesTrue(b, at: i, limit: limit) else { return nil }
            found = .slice(start: i, end: i + 4)
            end = i + 4
        case UInt8(ascii: "f"):
            guard matchesFalse(b, at: i, limit: limit) else { return nil }
            found = .slice(start: i, end: i + 5)
            end = i + 5
        default:
            return nil  // null, an object, an array, or garbage.
        }
        // The value is complete only once the delimiter after it is seen.
        let next = skipWhitespace(b, from: end, limit: limit)
        guard next < limit, b[next] == comma || b[next] == closer else { return nil }
        return found
    }

    /// Scans the members of an object whose `{` precedes `from`; returns the offset of the first byte of the value
    /// of the first member whose unescaped key equals `key`, or nil when absent or malformed.
    static func findMember(_ b: Bytes, from: Int, limit: Int, key: UnsafeBufferPointer<UInt8>) -> Int? {
        var i = skipWhitespace(b, from: from, limit: limit)
        guard i < limit, b[i] != closeObject else { return nil }
        while true {
            guard i < limit, b[i] == quote, let (close, escaped) = scanString(b, from: i + 1, limit: limit)
            else { return nil }
            let matched =
                escaped
                ? escapedKey(b, from: i + 1, to: close, equals: key)
                : plainKey(b, from: i + 1, to: close, equals: key)
            i = skipWhitespace(b, from: close + 1, limit: limit)
            guard i < limit, b[i] == colon else { return nil }
            i = skipWhitespace(b, from: i + 1, limit: limit)
            guard i < limit else { return nil }
            if matched { return i }
            guard let after = skipValue(b, at: i, limit: limit) else { return nil }
            i = skipWhitespace(b, from: after, limit: limit)
            // `}` here means the key is missing; anything but `,` is malformed.
            guard i < limit, b[i] == comma else { return nil }
            i = skipWhitespace(b, from: i + 1, limit: limit)
        }
    }

    /// Scans the elements of an array whose `[` precedes `from`; returns the offset of the first byte of element
    /// `index`, or nil when the array is shorter or malformed.
    static func findElement(_ b: Bytes, from: Int, limit: Int, index: Int) -> Int? {
        var i = skipWhitespace(b, from: from, limit: limit)
        guard i < limit, b[i] != closeArray else { return nil }
        var position = 0
        while true {
            if position == index { return i }
            guard let after = skipValue(b, at: i, limit: limit) else { return nil }
            i = skipWhitespace(b, from: after, limit: limit)
            // `]` here means the index is out of range; anything but `,` is malformed.
            guard i < limit, b[i] == comma else { return nil }
            i = skipWhitespace(b, from: i + 1, limit: limit)
            guard i < limit else { return nil }
            position += 1
        }
    }

    @inline(__always)
    static func isWhitespace(_ c: UInt8) -> Bool {
        c == 0x20 || c == 0x0A || c == 0x0D || c == 0x09
    }

    @inline(__always)
    static func skipWhitespace(_ b: Bytes, from: Int, limit: Int) -> Int {
        var i = from
        while i < limit, isWhitespace(b[i]) { i &+= 1 }
        return i
    }

    /// Skips the value starting at `at` (`at < limit`) and returns the offset just after it.
    static func skipValue(_ b: Bytes, at i: Int, limit: Int) -> Int? {
        switch b[i] {
        case quote:
            guard let (close, _) = scanString(b, from: i + 1, limit: limit) else { return nil }
            return close + 1
        case openObject, openArray:
            return skipContainer(b, from: i + 1, limit: limit)
        case minus, zero...nine:
            return scanNumber(b, from: i, limit: limit)
        case UInt8(ascii: "t"):
            return matchesTrue(b, at: i, limit: limit) ? i + 4 : nil
        case UInt8(ascii: "f"):
            return matchesFalse(b, at: i, limit: limit) ? i + 5 : nil
        case UInt8(ascii: "n"):
            return matchesNull(b, at: i, limit: limit) ? i + 4 : nil
        default:
            return nil
        }
    }

    /// Skips an object or array whose opening bracket precedes `from`; returns the offset after its closing
    /// bracket. Uses a depth counter (no recursion) and only checks that strings terminate and brackets balance.
    ///
    /// The bulk loop classifies eight bytes per step without data-dependent branches (a byte loop that branches on
    /// every `"`, `{` or `]` of typical dense JSON is dominated by branch mispredictions):
    /// - `"`, `\`, `{`/`[` and `}`/`]` are found with exact SWAR zero-byte tests (OR-ing `0x20` into every byte
    ///   maps `[`/`]` onto `{`/`}`, and only those four bytes map onto them);
    /// - a byte-wise prefix XOR of the unescaped quotes marks the bytes inside strings, carried across words;
    /// - brackets outside strings are counted (one multiply per mask); only a word in which the depth may reach
    ///   zero is walked bracket by bracket to find the exact end.
    /// Backslashes are rare, so escapes are resolved by a small loop only in words that contain one.
    static func skipContainer(_ b: Bytes, from: Int, limit: Int) -> Int? {
        let highBits: UInt64 = 0x8080_8080_8080_8080
        var i = from
        var depth = 1
        var inString: UInt64 = 0  // `highBits` while the current position is inside a string.
        var nextEscaped = false  // The first byte of the next word follows an escaping backslash.
        while i &+ 8 <= limit {
            let word = b.word(at: i)
            var quotes = zeroBytes(word ^ 0x2222_2222_2222_2222)
            let backslashes = zeroBytes(word ^ 0x5C5C_5C5C_5C5C_5C5C)
            if inString != 0 && quotes | backslashes == 0 && !nextEscaped {
                i &+= 8  // Inside a long string: nothing can change here.
                continue
            }
            if backslashes != 0 || nextEscaped {
                var escaped: UInt64 = nextEscaped ? 0x80 : 0
                nextEscaped = false
                var pending = backslashes
                while pending != 0 {
                    let bit = pending & (0 &- pending)
                    pending &= pending &- 1
                    guard escaped & bit == 0 else { continue }  // An escaped backslash escapes nothing.
                    if bit == 0x80 << 56 {
                        nextEscaped = true
                    } else {
                        escaped |= bit << 8
                    }
                }
                quotes &= ~escaped
            }
            var inside = quotes
            inside ^= inside << 8
            inside ^= inside << 16
            inside ^= inside << 32
            inside ^= inString
            inString = (0 &- (inside >> 63)) & highBits
            let folded = word | 0x2020_2020_2020_2020
            let opens = zeroBytes(folded ^ 0x7B7B_7B7B_7B7B_7B7B) & ~inside
            let closes = zeroBytes(folded ^ 0x7D7D_7D7D_7D7D_7D7D) & ~inside
            let closeCount = countHighBits(closes)
            if depth > closeCount {
                depth &+= countHighBits(opens) &- closeCount
                i &+= 8
                continue
            }
            var brackets = opens | closes
            while brackets != 0 {
                let bit = brackets & (0 &- brackets)
                brackets &= brackets &- 1
                if opens & bit != 0 {
                    depth &+= 1
                } else {
                    depth &-= 1
                    if depth == 0 { return i &+ (bit.trailingZeroBitCount &>> 3) &+ 1 }
                }
            }
            i &+= 8
        }
        // Fewer than eight bytes left: finish byte by byte, resuming a string or escape the bulk loop was inside.
        if nextEscaped { i &+= 1 }
        if inString != 0 {
            guard let (close, _) = scanString(b, from: i, limit: limit) else { return nil }
            i = close &+ 1
        }
        while i < limit {
            switch b[i] {
            case quote:
                guard let (close, _) = scanString(b, from: i &+ 1, limit: limit) else { return nil }
                i = close
            case openObject, openArray:
                depth &+= 1
            case closeObject, closeArray:
                depth &-= 1
                if depth == 0 { return i &+ 1 }
            default:
                break
            }
            i &+= 1
        }
        return nil
    }

    /// Number of bytes of `x` whose high bit is set, for masks from ``zeroBytes(_:)`` (only `0x80` bits). One multiply
    /// sums the eight 0/1 bytes into the top byte; unlike `nonzeroBitCount` it needs no `popcnt` instruction, which
    /// the baseline x86-64 target does not assume (it would otherwise be emulated with about a dozen instructions).
    @inline(__always)
    static func countHighBits(_ x: UInt64) -> Int {
        Int(truncatingIfNeeded: ((x &>> 7) &* 0x0101_0101_0101_0101) &>> 56)
    }

    /// High bit set in exactly the bytes of `x` that are zero (no false positives, unlike the shorter variant).
    @inline(__always)
    static func zeroBytes(_ x: UInt64) -> UInt64 {
        let low7: UInt64 = 0x7F7F_7F7F_7F7F_7F7F
        return ~(((x & low7) &+ low7) | x | low7)
    }

    /// Finds the closing quote of a string whose opening quote precedes `from`, eight bytes at a time. Returns its
    /// offset and whether a backslash occurred. Escapes are not validated here (only `\x` pairs are stepped over).
    @inline(__always)
    static func scanString(_ b: Bytes, from: Int, limit: Int) -> (close: Int, escaped: Bool)? {
        var i = from
        var escaped = false
        while true {
            while i &+ 8 <= limit {
                let word = b.word(at: i)
                let hits = zeroBytes(word ^ 0x2222_2222_2222_2222) | zeroBytes(word ^ 0x5C5C_5C5C_5C5C_5C5C)
                if hits != 0 {
                    i &+= hits.trailingZeroBitCount &>> 3
                    break
                }
                i &+= 8
            }
            guard i < limit else { return nil }
            let c = b[i]
            if c == quote { return (i, escaped) }
            if c == backslash {
                escaped = true
                i &+= 2
            } else {
                i &+= 1
            }
        }
    }

    /// Strict scan of the value string (short in practice, so byte by byte): rejects raw control characters.
    static func scanValueString(_ b: Bytes, from: Int, limit: Int) -> (close: Int, escaped: Bool)? {
        var i = from
        var escaped = false
        while i < limit {
            let c = b[i]
            if c == quote { return (i, escaped) }
            if c == backslash {
                escaped = true
                i &+= 2
            } else {
                guard c >= 0x20 else { return nil }
                i &+= 1
            }
        }
        return nil
    }

    /// Scans a number per the JSON grammar `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?` and returns the offset
    /// after it. A number running into `limit` returns `limit`; the caller's delimiter check then rejects it.
    static func scanNumber(_ b: Bytes, from: Int, limit: Int) -> Int? {
        @inline(__always) func isDigit(_ i: Int) -> Bool { i < limit && b[i] &- zero < 10 }
        var i = from
        if b[i] == minus { i += 1 }
        guard i < limit else { return nil }
        if b[i] == zero {
            i += 1
        } else if isDigit(i) {
            repeat { i += 1 } while isDigit(i)
        } else {
            return nil
        }
        if i < limit, b[i] == UInt8(ascii: ".") {
            i += 1
            guard isDigit(i) else { return nil }
            repeat { i += 1 } while isDigit(i)
        }
        if i < limit, b[i] | 0x20 == UInt8(ascii: "e") {
            i += 1
            if i < limit, b[i] == UInt8(ascii: "+") || b[i] == minus { i += 1 }
            guard isDigit(i) else { return nil }
            repeat { i += 1 } while isDigit(i)
        }
        return i
    }

    @inline(__always)
    static func matchesTrue(_ b: Bytes, at i: Int, limit: Int) -> Bool {
        i + 4 <= limit && b[i] == UInt8(ascii: "t") && b[i + 1] == UInt8(ascii: "r") && b[i + 2] == UInt8(ascii: "u")
            && b[i + 3] == UInt8(ascii: "e")
    }

    @inline(__always)
    static func matchesFalse(_ b: Bytes, at i: Int, limit: Int) -> Bool {
        i + 5 <= limit && b[i] == UInt8(ascii: "f") && b[i + 1] == UInt8(ascii: "a") && b[i + 2] == UInt8(ascii: "l")
            && b[i + 3] == UInt8(ascii: "s") && b[i + 4] == UInt8(ascii: "e")
    }

    @inline(__always)
    static func matchesNull(_ b: Bytes, at i: Int, limit: Int) -> Bool {
        i + 4 <= limit && b[i] == UInt8(ascii: "n") && b[i + 1] == UInt8(ascii: "u") && b[i + 2] == UInt8(ascii: "l")
            && b[i + 3] == UInt8(ascii: "l")
    }

    /// Compares an escape-free raw key `b[from..<to]` with `key`.
    @inline(__always)
    static func plainKey(_ b: Bytes, from: Int, to: Int, equals key: UnsafeBufferPointer<UInt8>) -> Bool {
        guard to - from == key.count else { return false }
        var k = 0
        while k < key.count {
            if b[from &+ k] != key[k] { return false }
            k &+= 1
        }
        return true
    }

    /// Compares a raw key containing escapes with `key`, unescaping on the fly. A malformed escape never matches.
    static func escapedKey(_ b: Bytes, from: Int, to: Int, equals key: UnsafeBufferPointer<UInt8>) -> Bool {
        var i = from
        var k = 0
        while i < to {
            guard let (utf8, count, next) = unescapeStep(b, at: i, end: to), k + count <= key.count else {
                return false
            }
            for n in 0..<count where key[k + n] != UInt8(truncatingIfNeeded: utf8 >> (8 * UInt32(n))) {
                return false
            }
            k += count
            i = next
        }
        return k == key.count
    }

    /// Unescapes the raw string content `b[from..<to]` into `out` (room for `to - from` bytes is enough: no escape
    /// expands). Returns the number of bytes written, or nil for a malformed escape.
    static func unescape(_ b: Bytes, from: Int, to: Int, into out: UnsafeMutableRawPointer) -> Int? {
        var i = from
        var written = 0
        while i < to {
            guard let (utf8, count, next) = unescapeStep(b, at: i, end: to) else { return nil }
            for n in 0..<count {
                out.storeBytes(
                    of: UInt8(truncatingIfNeeded: utf8 >> (8 * UInt32(n))), toByteOffset: written + n,
                    as: UInt8.self)
            }
            written += count
            i = next
        }
        return written
    }

    /// Decodes one unit of raw string content at `i < end`: a plain byte, or one escape (`\uD83D\uDE00` surrogate
    /// pairs count as one). Returns the UTF-8 bytes packed little-endian (first byte lowest), their count, and the
    /// offset of the next unit; nil for a malformed escape or a lone surrogate.
    static func unescapeStep(_ b: Bytes, at i: Int, end: Int) -> (utf8: UInt32, count: Int, next: Int)? {
        let c = b[i]
        guard c == backslash else { return (UInt32(c), 1, i + 1) }
        guard i + 1 < end else { return nil }
        let simple: UInt8
        switch b[i + 1] {
        case quote: simple = quote
        case backslash: simple = backslash
        case UInt8(ascii: "/"): simple = UInt8(ascii: "/")
        case UInt8(ascii: "b"): simple = 0x08
        case UInt8(ascii: "f"): simple = 0x0C
        case UInt8(ascii: "n"): simple = 0x0A
        case UInt8(ascii: "r"): simple = 0x0D
        case UInt8(ascii: "t"): simple = 0x09
        case UInt8(ascii: "u"):
            guard i + 6 <= end, let unit = hex4(b, at: i + 2) else { return nil }
            var scalar = unit
            var next = i + 6
            if unit >= 0xD800 && unit <= 0xDBFF {
                guard next + 6 <= end, b[next] == backslash, b[next + 1] == UInt8(ascii: "u"),
                    let low = hex4(b, at: next + 2), low >= 0xDC00 && low <= 0xDFFF
                else { return nil }
                scalar = 0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00)
                next += 6
            } else if unit >= 0xDC00 && unit <= 0xDFFF {
                return nil
            }
            let (utf8, count) = encodeUTF8(scalar)
            return (utf8, count, next)
        default:
            return nil
        }
        return (UInt32(simple), 1, i + 2)
    }

    /// Four hex digits at `b[i..<i+4]` (caller checked bounds) as a UTF-16 code unit.
    @inline(__always)
    static func hex4(_ b: Bytes, at i: Int) -> UInt32? {
        var value: UInt32 = 0
        for n in 0..<4 {
            let c = b[i + n]
            let digit: UInt8
            switch c {
            case zero...nine: digit = c - zero
            case UInt8(ascii: "a")...UInt8(ascii: "f"): digit = c - UInt8(ascii: "a") + 10
            case UInt8(ascii: "A")...UInt8(ascii: "F"): digit = c - UInt8(ascii: "A") + 10
            default: return nil
            }
            value = value << 4 | UInt32(digit)
        }
        return value
    }

    /// UTF-8 of a Unicode scalar value (not a surrogate), packed little-endian, with its byte count.
    @inline(__always)
    static func encodeUTF8(_ scalar: UInt32) -> (UInt32, Int) {
        switch scalar {
        case 0..<0x80:
            return (scalar, 1)
        case 0x80..<0x800:
            return ((0xC0 | scalar >> 6) | (0x80 | scalar & 0x3F) << 8, 2)
        case 0x800..<0x10000:
            return ((0xE0 | scalar >> 12) | (0x80 | scalar >> 6 & 0x3F) << 8 | (0x80 | scalar & 0x3F) << 16, 3)
        default:
            let first = 0xF0 | scalar >> 18
            let second = (0x80 | scalar >> 12 & 0x3F) << 8
            let third = (0x80 | scalar >> 6 & 0x3F) << 16
            let fourth = (0x80 | scalar & 0x3F) << 24
            return (first | second | third | fourth, 4)
        }
    }
}
