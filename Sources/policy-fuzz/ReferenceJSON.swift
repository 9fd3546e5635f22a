import ResponsePolicy

/// The fuzz oracle's JSON reader: a plain recursive-descent parser with the rules the engine's
/// ``JSONCodeScanner`` promises, written the obvious way so the two can be compared on any input.
///
/// A business code exists only in a body that is valid JSON as a whole (RFC 8259 grammar; strings
/// with valid escapes and valid UTF-8; one value, whitespace around it, an optional UTF-8 BOM
/// first; at most ``JSONCodeScanner/maxDepth`` nested containers), and of duplicate keys the last
/// wins. Recursion is fine here: inputs are small and the depth is bounded.
enum ReferenceJSON {
    indirect enum Value {
        case null
        case literal([UInt8])
        /// The unescaped bytes; `nil` when an escape is a lone UTF-16 surrogate.
        case string([UInt8]?)
        case array([Value])
        case object([(key: [UInt8]?, value: Value)])
    }

    /// The code at `path` in `bytes`, as the scanner should find it.
    static func code(in bytes: [UInt8], at path: JSONPath) -> String? {
        var parser = Parser(bytes: bytes)
        if bytes.starts(with: [0xEF, 0xBB, 0xBF]) { parser.index = 3 }
        guard let root = parser.document() else { return nil }
        var current = root
        for segment in path.segments {
            let key: [UInt8]
            switch segment {
            case .key(let bytes): key = bytes
            case .index(let index): key = Array(String(index).utf8)
            }
            switch current {
            case .object(let members):
                guard let member = members.last(where: { $0.key == key }) else { return nil }
                current = member.value
            case .array(let elements):
                guard case .index(let index) = segment, elements.indices.contains(index) else { return nil }
                current = elements[index]
            default:
                return nil
            }
        }
        switch current {
        case .literal(let text): return String(decoding: text, as: UTF8.self)
        case .string(let text?): return String(decoding: text, as: UTF8.self)
        default: return nil
        }
    }

    struct Parser {
        let bytes: [UInt8]
        var index = 0

        init(bytes: [UInt8]) { self.bytes = bytes }

        var current: UInt8? { index < bytes.count ? bytes[index] : nil }

        mutating func whitespace() {
            while let c = current, c == 0x20 || c == 0x09 || c == 0x0A || c == 0x0D { index += 1 }
        }

        mutating func document() -> Value? {
            guard let value = value(depth: 0) else { return nil }
            whitespace()
            return index == bytes.count ? value : nil
        }

        mutating func value(depth: Int) -> Value? {
            whitespace()
            guard let c = current else { return nil }
            switch c {
            case UInt8(ascii: "{"):
                guard depth < JSONCodeScanner.maxDepth else { return nil }
                index += 1
                var members: [(key: [UInt8]?, value: Value)] = []
                whitespace()
                if current == UInt8(ascii: "}") {
                    index += 1
                    return .object(members)
                }
                while true {
                    whitespace()
                    guard current == UInt8(ascii: "\""), let key = string() else { return nil }
                    whitespace()
                    guard current == UInt8(ascii: ":") else { return nil }
                    index += 1
                    guard let member = value(depth: depth + 1) else { return nil }
                    members.append((key, member))
                    whitespace()
                    if current == UInt8(ascii: ",") {
                        index += 1
                        continue
                    }
                    guard current == UInt8(ascii: "}") else { return nil }
                    index += 1
                    return .object(members)
                }
            case UInt8(ascii: "["):
                guard depth < JSONCodeScanner.maxDepth else { return nil }
                index += 1
                var elements: [Value] = []
                whitespace()
                if current == UInt8(ascii: "]") {
                    index += 1
                    return .array(elements)
                }
                while true {
                    guard let element = value(depth: depth + 1) else { return nil }
                    elements.append(element)
                    whitespace()
                    if current == UInt8(ascii: ",") {
                        index += 1
                        continue
                    }
                    guard current == UInt8(ascii: "]") else { return nil }
                    index += 1
                    return .array(elements)
                }
            case UInt8(ascii: "\""):
                guard let text = string() else { return nil }
                return .string(text)
            case UInt8(ascii: "t"): return word("true")
            case UInt8(ascii: "f"): return word("false")
            case UInt8(ascii: "n"): return word("null").map { _ in .null }
            case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): return number()
            default: return nil
            }
        }

        mutating func word(_ text: String) -> Value? {
            let expected = Array(text.utf8)
            guard bytes.count - index >= expected.count, Array(bytes[index..<(index + expected.count)]) == expected
            else { return nil }
            index += expected.count
            return .literal(expected)
        }

        mutating func number() -> Value? {
            let start = index
            func digits() -> Int {
                var count = 0
                while let c = current, c >= 0x30, c <= 0x39 {
                    index += 1
                    count += 1
                }
                return count
            }
            if current == UInt8(ascii: "-") { index += 1 }
            if current == UInt8(ascii: "0") {
                index += 1
            } else if digits() == 0 {
                return nil
            }
            if current == UInt8(ascii: ".") {
                index += 1
                guard digits() > 0 else { return nil }
            }
            if current == UInt8(ascii: "e") || current == UInt8(ascii: "E") {
                index += 1
                if current == UInt8(ascii: "+") || current == UInt8(ascii: "-") { index += 1 }
                guard digits() > 0 else { return nil }
            }
            return .literal(Array(bytes[start..<index]))
        }

        /// A string at `index` (its opening quote): `nil` when invalid; `.some(nil)` when valid
        /// but holding a lone surrogate escape.
        mutating func string() -> [UInt8]?? {
            index += 1
            var out: [UInt8] = []
            var lone = false
            while true {
                guard let c = current else { return nil }
                if c == UInt8(ascii: "\"") {
                    index += 1
                    return lone ? .some(nil) : .some(out)
                }
                if c < 0x20 { return nil }
                if c == UInt8(ascii: "\\") {
                    index += 1
                    guard let e = current else { return nil }
                    index += 1
                    switch e {
                    case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"): out.append(e)
                    case UInt8(ascii: "b"): out.append(0x08)
                    case UInt8(ascii: "f"): out.append(0x0C)
                    case UInt8(ascii: "n"): out.append(0x0A)
                    case UInt8(ascii: "r"): out.append(0x0D)
                    case UInt8(ascii: "t"): out.append(0x09)
                    case UInt8(ascii: "u"):
                        guard let unit = hex() else { return nil }
                        var scalar = unit
                        if unit >= 0xD800, unit <= 0xDBFF {
                            // A high surrogate makes a pair only with a low one right after it.
                            let save = index
                            if current == UInt8(ascii: "\\"), index + 1 < bytes.count,
                                bytes[index + 1] == UInt8(ascii: "u")
                            {
                                index += 2
                                guard let low = hex() else { return nil }
                                if low >= 0xDC00, low <= 0xDFFF {
                                    scalar = 0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00)
                                } else {
                                    index = save
                                    lone = true
                                    continue
                                }
                            } else {
                                lone = true
                                continue
                            }
                        } else if unit >= 0xDC00, unit <= 0xDFFF {
                            lone = true
                            continue
                        }
                        if let value = Unicode.Scalar(scalar) { out += Array(String(value).utf8) }
                    default:
                        return nil
                    }
                    continue
                }
                if c < 0x80 {
                    out.append(c)
                    index += 1
                    continue
                }
                // Non-ASCII: one valid UTF-8 sequence, as Swift's own validation reads it.
                let length = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1
                guard index + length <= bytes.count else { return nil }
                let sequence = Array(bytes[index..<(index + length)])
                guard let decoded = String(validating: sequence, as: UTF8.self), decoded.unicodeScalars.count == 1
                else {
                    return nil
                }
                out += sequence
                index += length
            }
        }

        mutating func hex() -> UInt32? {
            guard bytes.count - index >= 4 else { return nil }
            var value: UInt32 = 0
            for _ in 0..<4 {
                let c = bytes[index]
                let digit: UInt32
                switch c {
                case 0x30...0x39: digit = UInt32(c - 0x30)
                case 0x61...0x66: digit = UInt32(c - 0x61 + 10)
                case 0x41...0x46: digit = UInt32(c - 0x41 + 10)
                default: return nil
                }
                value = value << 4 | digit
                index += 1
            }
            return value
        }
    }
}
