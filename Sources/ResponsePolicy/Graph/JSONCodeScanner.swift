// A bounded, single-pass, allocation-free locator for one scalar ("business code") inside a JSON body.
//
// Why this exists: the HTTP engine looks at the business code of *every* response (for example `status` in
// `{"status":1401,...}` or `errors.0.code`). Decoding the whole body with `JSONDecoder`/`JSONSerialization` would
// allocate a full object graph just to read one value. This scanner instead walks the bytes once, validating them,
// following only the containers named by the path, and remembering where the value at the path is.
//
// Design notes:
// - The code is the one a JSON parser would give: the whole body is read and must be valid JSON (RFC 8259 grammar,
//   strings with valid escapes and valid UTF-8, one value and nothing after it), and the last of duplicate keys wins,
//   as JavaScript's `JSON.parse` and Python's `json` keep it. (Issue 32: taking the first key and stopping at the
//   value let `{"status":1401,"status":0}` refresh, and let a body with trailing garbage, cut off or with invalid
//   UTF-8 carry a code no parser would read.)
// - No recursion: open containers are one bit each on a fixed stack of ``JSONCodeScanner/maxDepth`` (512) levels, so
//   hostile nesting cannot overflow the stack; deeper documents have no code. Every loop advances its index and is
//   bounded by the body, which must fit in `maxBytes`.
// - Strings, most of a typical body, are read eight bytes at a time with SWAR ("SIMD within a register") tests on
//   `UInt64`: a word holding no `"`, `\`, control byte or non-ASCII byte is skipped whole. Portable, no libc, no CPU
//   feature beyond the baseline.
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
/// an object or array at the path, a missing path, a body that is not valid JSON (anywhere: trailing garbage, cut
/// off, invalid UTF-8, nested deeper than ``maxDepth``), a body longer than `maxBytes`, an empty body, or an
/// empty/negative `maxBytes`.
///
/// **Duplicate keys.** The last occurrence wins, at every level of the path, as JavaScript's `JSON.parse` and
/// Python's `json` keep it: `{"status":1401,"status":0}` has the code `0`, and in `{"a":{"s":1},"a":{}}` `a.s` is
/// missing.
///
/// **Input.** Bytes are UTF-8 JSON; a leading UTF-8 BOM and JSON whitespace (space, tab, CR, LF) are accepted.
/// Lone UTF-16 surrogates in `\u` escapes are valid JSON, but a value holding one is no code.
///
/// **Safety and cost.** Reads never go past the body; every loop advances, so any input terminates; nesting is
/// a bit stack, not recursion. Time is O(body). No allocation happens on the hot path (`withCode` with a number,
/// boolean or escape-free string); see ``withCode(in:at:maxBytes:_:)`` for the one rare allocating case.
///
/// **Concurrency.** Both functions are pure: they read only their arguments, keep no state, and are safe to call
/// concurrently from any thread or isolation domain. The caller must keep `body` valid and unmodified for the
/// duration of the call (the raw buffer pointer itself is not `Sendable`, so sharing it is the caller's contract).
package enum JSONCodeScanner {
    /// Size of the stack buffer used by ``withCode(in:at:maxBytes:_:)`` to unescape a string value.
    static let inlineUnescapeCapacity = 64

    /// Finds the scalar at `path` in `body`, when the body (at most `maxBytes` bytes) is valid JSON.
    /// Returns the code as text: a JSON string's unescaped content (so "1401" -> 1401), a number's literal text
    /// exactly as written (1401, -3, 1.5e3), "true"/"false".
    /// Returns nil for: null, an object or array at the path, a missing path, malformed JSON met before the value is
    /// found, a value not finished within maxBytes, leading whitespace/BOM issues you can't handle.
    ///
    /// Allocates only the returned `String` (none for codes of up to 15 UTF-8 bytes, which `String` stores inline).
    package static func code(in body: UnsafeRawBufferPointer, at path: JSONPath, maxBytes: Int = 1 << 20) -> String? {
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
        in body: UnsafeRawBufferPointer, at path: JSONPath, maxBytes: Int = 1 << 20,
        _ use: (UnsafeRawBufferPointer?) -> R
    ) -> R {
        // The whole body is read (a code in a body that is not valid JSON is no code): one longer
        // than the scan limit has none.
        guard let base = body.baseAddress, maxBytes > 0, !body.isEmpty, body.count <= maxBytes else { return use(nil) }
        let limit = body.count
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

    /// The deepest nesting of a body read for a code: deeper documents have no code (Python's `json`
    /// stops near 1,000 levels; no API answers with 512).
    package static let maxDepth = 512

    /// Reads the whole document in `b[0..<limit]` as JSON (RFC 8259, UTF-8 checked) and returns the
    /// location of the scalar `steps` lead to; `nil` when the document is not valid JSON, nests
    /// deeper than ``maxDepth``, or has no scalar there.
    ///
    /// Duplicate keys: the last one wins at every level, as JavaScript's `JSON.parse` and Python's
    /// `json` keep it (`{"status":1401,"status":0}` has the code 0). A member whose key matches the
    /// path clears what an earlier member of that key found, then its value may set it again.
    static func locate(
        _ b: Bytes, limit: Int, steps: UnsafeBufferPointer<JSONPath.Step>, keys: UnsafeBufferPointer<UInt8>
    ) -> Location? {
        guard !steps.isEmpty else { return nil }
        return withUnsafeTemporaryAllocation(of: UInt64.self, capacity: maxDepth / 64) { kinds in
            withUnsafeTemporaryAllocation(of: Int.self, capacity: steps.count) { counters in
                parse(b, limit: limit, steps: steps, keys: keys, kinds: kinds, counters: counters)
            }
        }
    }

    /// The single pass of ``locate(_:limit:steps:keys:)``. `kinds` holds one bit per open container
    /// (1: an object); `counters[d - 1]` the index of the current element of the array at depth `d`
    /// when that array is on the path.
    private static func parse(
        _ b: Bytes, limit: Int, steps: UnsafeBufferPointer<JSONPath.Step>, keys: UnsafeBufferPointer<UInt8>,
        kinds: UnsafeMutableBufferPointer<UInt64>, counters: UnsafeMutableBufferPointer<Int>
    ) -> Location? {
        var i = 0
        if limit >= 3, b[0] == 0xEF, b[1] == 0xBB, b[2] == 0xBF { i = 3 }
        /// Open containers; the root one is depth 1.
        var depth = 0
        /// Containers 1...onPath are on the path (the one at depth d reached by steps[0..<d-1]).
        var onPath = 0
        var found: Location?
        /// Whether the value about to be read is the one at steps[0..<depth] (its member or
        /// element matched the step of an on-path container).
        var target = false
        @inline(__always) func isObject(_ level: Int) -> Bool {
            kinds[(level - 1) >> 6] & (1 << UInt64((level - 1) & 63)) != 0
        }
        @inline(__always) func push(object: Bool) -> Bool {
            guard depth < maxDepth else { return false }
            depth += 1
            let bit: UInt64 = 1 << UInt64((depth - 1) & 63)
            if object { kinds[(depth - 1) >> 6] |= bit } else { kinds[(depth - 1) >> 6] &= ~bit }
            return true
        }
        @inline(__always) func arrayElementIsTarget() -> Bool {
            guard depth == onPath, depth <= steps.count else { return false }
            return counters[depth - 1] == steps[depth - 1].index
        }
        while true {
            // A value starts at `i`.
            i = skipWhitespace(b, from: i, limit: limit)
            guard i < limit else { return nil }
            let isTarget = target
            target = false
            if isTarget {
                // Whatever an earlier member of this key found is overridden by this one.
                found = nil
            }
            let c = b[i]
            var closedEmpty = false
            switch c {
            case openObject, openArray:
                let object = c == openObject
                guard push(object: object) else { return nil }
                // The root is on the path; so is a container that is the path's value so far.
                if depth == 1 || (isTarget && depth - 1 < steps.count) {
                    onPath = depth
                    if !object, depth <= steps.count { counters[depth - 1] = 0 }
                }
                i = skipWhitespace(b, from: i + 1, limit: limit)
                guard i < limit else { return nil }
                if b[i] == (object ? closeObject : closeArray) {
                    i += 1
                    closedEmpty = true
                } else if object {
                    guard
                        let next = member(
                            b, at: i, limit: limit, steps: steps, keys: keys, depth: depth,
                            onPath: onPath, target: &target)
                    else { return nil }
                    i = next
                    continue
                } else {
                    target = arrayElementIsTarget()
                    continue
                }
            case quote:
                guard let (close, escaped) = scanString(b, from: i + 1, limit: limit) else { return nil }
                if isTarget && depth == steps.count {
                    found = escaped ? .escapedString(start: i + 1, end: close) : .slice(start: i + 1, end: close)
                }
                i = close + 1
            case minus, zero...nine:
                guard let end = scanNumber(b, from: i, limit: limit) else { return nil }
                if isTarget && depth == steps.count { found = .slice(start: i, end: end) }
                i = end
            case UInt8(ascii: "t"):
                guard matchesTrue(b, at: i, limit: limit) else { return nil }
                if isTarget && depth == steps.count { found = .slice(start: i, end: i + 4) }
                i += 4
            case UInt8(ascii: "f"):
                guard matchesFalse(b, at: i, limit: limit) else { return nil }
                if isTarget && depth == steps.count { found = .slice(start: i, end: i + 5) }
                i += 5
            case UInt8(ascii: "n"):
                guard matchesNull(b, at: i, limit: limit) else { return nil }
                i += 4
            default:
                return nil
            }
            if closedEmpty {
                if onPath >= depth { onPath = depth - 1 }
                depth -= 1
            }
            // After a value: a comma, or the end of its container(s), or the end of the document.
            while true {
                i = skipWhitespace(b, from: i, limit: limit)
                if depth == 0 { return i == limit ? found : nil }
                guard i < limit else { return nil }
                let object = isObject(depth)
                let d = b[i]
                if d == comma {
                    i = skipWhitespace(b, from: i + 1, limit: limit)
                    guard i < limit else { return nil }
                    if object {
                        guard
                            let next = member(
                                b, at: i, limit: limit, steps: steps, keys: keys, depth: depth,
                                onPath: onPath, target: &target)
                        else { return nil }
                        i = next
                    } else {
                        if depth == onPath, depth <= steps.count { counters[depth - 1] += 1 }
                        target = arrayElementIsTarget()
                    }
                    break
                }
                guard d == (object ? closeObject : closeArray) else { return nil }
                i += 1
                if onPath >= depth { onPath = depth - 1 }
                depth -= 1
            }
        }
    }

    /// Reads one member's key and colon at `i` (which must be a `"`); sets `target` when the key is
    /// the step of the on-path object at `depth`. Returns the offset after the colon.
    @inline(__always)
    private static func member(
        _ b: Bytes, at i: Int, limit: Int, steps: UnsafeBufferPointer<JSONPath.Step>, keys: UnsafeBufferPointer<UInt8>,
        depth: Int, onPath: Int, target: inout Bool
    ) -> Int? {
        guard b[i] == quote, let (close, escaped) = scanString(b, from: i + 1, limit: limit) else { return nil }
        if depth == onPath, depth <= steps.count {
            let step = steps[depth - 1]
            let key = UnsafeBufferPointer(rebasing: keys[step.keyStart..<(step.keyStart + step.keyCount)])
            target =
                escaped
                ? escapedKey(b, from: i + 1, to: close, equals: key)
                : plainKey(b, from: i + 1, to: close, equals: key)
        }
        let separator = skipWhitespace(b, from: close + 1, limit: limit)
        guard separator < limit, b[separator] == colon else { return nil }
        return separator + 1
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

    /// High bit set in exactly the bytes of `x` that are zero (no false positives, unlike the shorter variant).
    @inline(__always)
    static func zeroBytes(_ x: UInt64) -> UInt64 {
        let low7: UInt64 = 0x7F7F_7F7F_7F7F_7F7F
        return ~(((x & low7) &+ low7) | x | low7)
    }

    /// Reads a string whose opening quote precedes `from` and returns the offset of its closing quote
    /// and whether it holds an escape; `nil` unless it is a valid JSON string: terminated, no raw
    /// control character, every escape one of `\" \\ \/ \b \f \n \r \t \uXXXX`, and valid UTF-8
    /// (no overlong form, no encoded surrogate, nothing past U+10FFFF).
    ///
    /// Plain ASCII is skipped eight bytes at a time: a word with no `"`, `\`, control byte or byte
    /// of 0x80 and above needs no look at its bytes.
    @inline(__always)
    static func scanString(_ b: Bytes, from: Int, limit: Int) -> (close: Int, escaped: Bool)? {
        var i = from
        var escaped = false
        let high: UInt64 = 0x8080_8080_8080_8080
        while true {
            while i &+ 8 <= limit {
                let word = b.word(at: i)
                let special =
                    zeroBytes(word ^ 0x2222_2222_2222_2222) | zeroBytes(word ^ 0x5C5C_5C5C_5C5C_5C5C)
                    | ((word &- 0x2020_2020_2020_2020) & ~word & high) | (word & high)
                if special != 0 {
                    i &+= special.trailingZeroBitCount &>> 3
                    break
                }
                i &+= 8
            }
            guard i < limit else { return nil }
            let c = b[i]
            if c == quote { return (i, escaped) }
            if c == backslash {
                escaped = true
                guard i &+ 1 < limit else { return nil }
                switch b[i &+ 1] {
                case quote, backslash, UInt8(ascii: "/"), UInt8(ascii: "b"), UInt8(ascii: "f"), UInt8(ascii: "n"),
                    UInt8(ascii: "r"), UInt8(ascii: "t"):
                    i &+= 2
                case UInt8(ascii: "u"):
                    guard i &+ 6 <= limit, hex4(b, at: i &+ 2) != nil else { return nil }
                    i &+= 6
                default:
                    return nil
                }
            } else if c < 0x20 {
                return nil
            } else if c >= 0x80 {
                guard let next = utf8Sequence(b, at: i, limit: limit) else { return nil }
                i = next
            } else {
                i &+= 1  // A plain byte the word test stopped on (one of a word's first bytes before a special one).
            }
        }
    }

    /// The offset after the UTF-8 sequence that starts with the byte at `i` (0x80 or above), or `nil`
    /// when it is not one (RFC 3629: no overlong forms, no surrogates, nothing past U+10FFFF).
    static func utf8Sequence(_ b: Bytes, at i: Int, limit: Int) -> Int? {
        let lead = b[i]
        @inline(__always) func continuation(_ at: Int, _ low: UInt8 = 0x80, _ high: UInt8 = 0xBF) -> Bool {
            at < limit && b[at] >= low && b[at] <= high
        }
        switch lead {
        case 0xC2...0xDF:
            return continuation(i + 1) ? i + 2 : nil
        case 0xE0:
            return continuation(i + 1, 0xA0) && continuation(i + 2) ? i + 3 : nil
        case 0xE1...0xEC, 0xEE...0xEF:
            return continuation(i + 1) && continuation(i + 2) ? i + 3 : nil
        case 0xED:
            return continuation(i + 1, 0x80, 0x9F) && continuation(i + 2) ? i + 3 : nil
        case 0xF0:
            return continuation(i + 1, 0x90) && continuation(i + 2) && continuation(i + 3) ? i + 4 : nil
        case 0xF1...0xF3:
            return continuation(i + 1) && continuation(i + 2) && continuation(i + 3) ? i + 4 : nil
        case 0xF4:
            return continuation(i + 1, 0x80, 0x8F) && continuation(i + 2) && continuation(i + 3) ? i + 4 : nil
        default:
            return nil
        }
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
