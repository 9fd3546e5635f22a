import Foundation

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// A JSON value read with bounds: strings past a limit are cut (and say so), nesting is bounded.
package indirect enum JSONValue: Sendable, Equatable {
    case object([(String, JSONValue)])
    case array([JSONValue])
    /// The text (cut at the reader's limit) and whether it was cut.
    case string(String, truncated: Bool)
    case number(Double)
    case bool(Bool)
    case null

    package static func == (a: JSONValue, b: JSONValue) -> Bool {
        switch (a, b) {
        case (.object(let x), .object(let y)):
            return x.count == y.count && zip(x, y).allSatisfy { $0.0 == $1.0 && $0.1 == $1.1 }
        case (.array(let x), .array(let y)): return x == y
        case (.string(let x, let t), .string(let y, let u)): return x == y && t == u
        case (.number(let x), .number(let y)): return x == y
        case (.bool(let x), .bool(let y)): return x == y
        case (.null, .null): return true
        default: return false
        }
    }

    /// The member named `key` (the first, case-sensitive) of an object.
    package subscript(key: String) -> JSONValue? {
        guard case .object(let members) = self else { return nil }
        return members.first { $0.0 == key }?.1
    }

    package var string: String? {
        if case .string(let text, _) = self { return text }
        return nil
    }

    package var number: Double? {
        if case .number(let value) = self { return value }
        return nil
    }

    package var array: [JSONValue]? {
        if case .array(let values) = self { return values }
        return nil
    }
}

/// Where something is in a file: 1-based line and column (columns count Unicode scalars).
package struct TextPosition: Sendable, Hashable, CustomStringConvertible {
    package var line: Int
    package var column: Int

    package init(line: Int, column: Int) {
        self.line = line
        self.column = column
    }

    package var description: String { "\(line):\(column)" }
}

/// A problem with a recording, at a place in its file: `FILE:LINE:COL: error: MESSAGE`.
/// Messages never quote the recording's content (it may hold tokens).
package struct ReplayInputError: Error, Sendable, Equatable, CustomStringConvertible {
    package var file: String
    package var position: TextPosition?
    package var message: String

    package init(file: String, position: TextPosition?, message: String) {
        self.file = file
        self.position = position
        self.message = message
    }

    package var description: String {
        "\(file):\(position.map { "\($0.line):\($0.column)" } ?? "1:1"): error: \(message)"
    }
}

/// Reads JSON from a file a chunk at a time, so memory stays bounded whatever the file's size:
/// the caller walks the structure (``beginObject()``, ``nextKey()``, ``beginArray()``,
/// ``nextElement()``) and reads or skips each value. Every error names its line and column.
///
/// Bounds: nesting at most ``maxDepth`` (`64`) deep; a string longer than the limit its reader
/// passes is cut there (the rest is read and dropped); a number at most 64 characters.
///
/// Concurrency contract: one reader belongs to one task; it is not `Sendable`.
package final class JSONStreamReader {
    package static let maxDepth = 64
    let file: String
    private let descriptor: Int32
    private let ownsDescriptor: Bool
    private var buffer: [UInt8]
    private var index = 0
    private var count = 0
    private var atEnd = false
    /// The position of `buffer[index]`.
    private(set) package var line = 1
    private(set) package var column = 1
    /// Bytes consumed so far.
    private(set) package var offset = 0
    private var depth = 0

    /// Opens `path` for reading.
    /// - Throws: ``ReplayInputError`` when it cannot be opened.
    package init(path: String, chunkSize: Int = 1 << 16) throws(ReplayInputError) {
        file = path
        let descriptor = open(path, O_RDONLY)
        guard descriptor >= 0 else {
            let reason = errno == ENOENT ? "no such file or directory" : String(cString: strerror(errno))
            throw ReplayInputError(file: path, position: nil, message: "cannot read '\(path)': \(reason)")
        }
        var info = stat()
        if fstat(descriptor, &info) == 0, (info.st_mode & S_IFMT) == S_IFDIR {
            close(descriptor)
            throw ReplayInputError(file: path, position: nil, message: "cannot read '\(path)': is a directory")
        }
        self.descriptor = descriptor
        ownsDescriptor = true
        buffer = [UInt8](repeating: 0, count: chunkSize)
    }

    /// Reads `bytes` (a line of a JSON-lines file), naming positions from `line`.
    package init(bytes: [UInt8], file: String, line: Int) {
        self.file = file
        descriptor = -1
        ownsDescriptor = false
        buffer = bytes
        count = bytes.count
        atEnd = true
        self.line = line
    }

    deinit {
        if ownsDescriptor { close(descriptor) }
    }

    package var position: TextPosition { TextPosition(line: line, column: column) }

    package func error(_ message: String, at position: TextPosition? = nil) -> ReplayInputError {
        ReplayInputError(file: file, position: position ?? self.position, message: message)
    }

    // MARK: - Bytes

    /// The next byte without consuming it; `nil` at the end of the input.
    @inline(__always)
    private func peekByte() throws(ReplayInputError) -> UInt8? {
        if index < count { return buffer[index] }
        guard try refill() else { return nil }
        return buffer[index]
    }

    private func refill() throws(ReplayInputError) -> Bool {
        guard !atEnd else { return false }
        let read = buffer.withUnsafeMutableBytes { systemRead(descriptor, $0.baseAddress, $0.count) }
        guard read >= 0 else { throw error("cannot read the file: \(String(cString: strerror(errno)))") }
        index = 0
        count = read
        if read == 0 {
            atEnd = true
            return false
        }
        return true
    }

    @inline(__always)
    private func advance(_ byte: UInt8) {
        index += 1
        offset += 1
        if byte == 0x0A {
            line += 1
            column = 1
        } else if byte & 0xC0 != 0x80 {
            column += 1
        }
    }

    private func skipWhitespace() throws(ReplayInputError) -> UInt8? {
        while let byte = try peekByte() {
            guard byte == 0x20 || byte == 0x0A || byte == 0x0D || byte == 0x09 else { return byte }
            advance(byte)
        }
        return nil
    }

    private func expect(_ expected: UInt8, _ what: String) throws(ReplayInputError) {
        guard let byte = try skipWhitespace() else { throw error("the file ends where \(what) was expected") }
        guard byte == expected else { throw error("expected \(what)") }
        advance(byte)
    }

    // MARK: - Structure

    /// What the next value is, without reading it: `{`, `[`, `"`, or the first byte of a scalar.
    package func peekValue() throws(ReplayInputError) -> UInt8? { try skipWhitespace() }

    /// Whether the input has nothing left but whitespace.
    package func isAtEnd() throws(ReplayInputError) -> Bool { try skipWhitespace() == nil }

    package func beginObject() throws(ReplayInputError) {
        try expect(UInt8(ascii: "{"), "'{' (an object)")
        try enter()
        pendingFirst = true
    }

    /// The next member's key, or `nil` after the object's `}`.
    package func nextKey(limit: Int = 4096) throws(ReplayInputError) -> String? {
        guard let byte = try skipWhitespace() else { throw error("the file ends inside an object") }
        if byte == UInt8(ascii: "}") {
            advance(byte)
            depth -= 1
            pendingFirst = false
            return nil
        }
        if !pendingFirst {
            guard byte == UInt8(ascii: ",") else { throw error("expected ',' or '}' after an object member") }
            advance(byte)
        }
        pendingFirst = false
        guard try skipWhitespace() == UInt8(ascii: "\"") else { throw error("expected a member name in double quotes") }
        let key = try readString(limit: limit).text
        try expect(UInt8(ascii: ":"), "':' after a member name")
        return key
    }

    package func beginArray() throws(ReplayInputError) {
        try expect(UInt8(ascii: "["), "'[' (an array)")
        try enter()
        pendingFirst = true
    }

    /// Whether another element follows (its value is next), `false` after the array's `]`.
    package func nextElement() throws(ReplayInputError) -> Bool {
        guard let byte = try skipWhitespace() else { throw error("the file ends inside an array") }
        if byte == UInt8(ascii: "]") {
            advance(byte)
            depth -= 1
            pendingFirst = false
            return false
        }
        if !pendingFirst {
            guard byte == UInt8(ascii: ",") else { throw error("expected ',' or ']' after an array element") }
            advance(byte)
        }
        pendingFirst = false
        return true
    }

    /// Whether the container just opened has had no member yet (so no comma comes first).
    private var pendingFirst = false

    private func enter() throws(ReplayInputError) {
        depth += 1
        guard depth <= Self.maxDepth else { throw error("nesting deeper than \(Self.maxDepth) levels") }
    }

    // MARK: - Values

    /// Reads any value, each string cut at `stringLimit` bytes; at most `maxMembers` members or
    /// elements per container are kept (the rest are read and dropped).
    package func readValue(stringLimit: Int = 1 << 16, maxMembers: Int = 10_000) throws(ReplayInputError) -> JSONValue {
        guard let byte = try skipWhitespace() else { throw error("the file ends where a value was expected") }
        switch byte {
        case UInt8(ascii: "{"):
            try beginObject()
            var members: [(String, JSONValue)] = []
            while let key = try nextKey() {
                let value = try readValue(stringLimit: stringLimit, maxMembers: maxMembers)
                if members.count < maxMembers { members.append((key, value)) }
            }
            return .object(members)
        case UInt8(ascii: "["):
            try beginArray()
            var elements: [JSONValue] = []
            while try nextElement() {
                let value = try readValue(stringLimit: stringLimit, maxMembers: maxMembers)
                if elements.count < maxMembers { elements.append(value) }
            }
            return .array(elements)
        case UInt8(ascii: "\""):
            let (text, truncated) = try readString(limit: stringLimit)
            return .string(text, truncated: truncated)
        case UInt8(ascii: "t"):
            try literal("true")
            return .bool(true)
        case UInt8(ascii: "f"):
            try literal("false")
            return .bool(false)
        case UInt8(ascii: "n"):
            try literal("null")
            return .null
        case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"):
            return .number(try readNumber())
        default:
            throw error("expected a value (an object, array, string, number, true, false or null)")
        }
    }

    /// Reads and drops one value of any size (strings are not kept).
    package func skipValue() throws(ReplayInputError) {
        _ = try readValue(stringLimit: 0, maxMembers: 0)
    }

    private func literal(_ word: String) throws(ReplayInputError) {
        let start = position
        for expected in word.utf8 {
            guard let byte = try peekByte(), byte == expected else {
                throw error("expected a value (an object, array, string, number, true, false or null)", at: start)
            }
            advance(byte)
        }
    }

    private func readNumber() throws(ReplayInputError) -> Double {
        let start = position
        var text: [UInt8] = []
        while let byte = try peekByte(),
            (byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9")) || byte == UInt8(ascii: "-")
                || byte == UInt8(ascii: "+") || byte == UInt8(ascii: ".") || byte == UInt8(ascii: "e")
                || byte == UInt8(ascii: "E")
        {
            advance(byte)
            text.append(byte)
            guard text.count <= 64 else { throw error("a number longer than 64 characters", at: start) }
        }
        guard let value = Double(String(decoding: text, as: UTF8.self)), value.isFinite else {
            throw error("not a number", at: start)
        }
        return value
    }

    /// Reads a string (the reader is at its opening quote): its first `limit` bytes, and
    /// whether it was longer.
    package func readString(limit: Int) throws(ReplayInputError) -> (text: String, truncated: Bool) {
        let start = position
        guard let quote = try peekByte(), quote == UInt8(ascii: "\"") else {
            throw error("expected a string")
        }
        advance(quote)
        var bytes: [UInt8] = []
        var truncated = false
        @inline(__always) func keep(_ byte: UInt8) {
            if bytes.count < limit { bytes.append(byte) } else { truncated = true }
        }
        while true {
            // The plain run inside the buffer: no quote, backslash or control byte.
            while index < count {
                let byte = buffer[index]
                if byte == UInt8(ascii: "\"") || byte == UInt8(ascii: "\\") || byte < 0x20 { break }
                advance(byte)
                keep(byte)
            }
            guard let byte = try peekByte() else { throw error("the file ends inside a string", at: start) }
            if byte == UInt8(ascii: "\"") {
                advance(byte)
                break
            }
            if byte < 0x20 {
                throw error("a control character inside a string (escape it as \\u00XX)")
            }
            if byte == UInt8(ascii: "\\") {
                advance(byte)
                guard let escaped = try peekByte() else { throw error("the file ends inside a string", at: start) }
                advance(escaped)
                switch escaped {
                case UInt8(ascii: "\""): keep(0x22)
                case UInt8(ascii: "\\"): keep(0x5C)
                case UInt8(ascii: "/"): keep(0x2F)
                case UInt8(ascii: "b"): keep(0x08)
                case UInt8(ascii: "f"): keep(0x0C)
                case UInt8(ascii: "n"): keep(0x0A)
                case UInt8(ascii: "r"): keep(0x0D)
                case UInt8(ascii: "t"): keep(0x09)
                case UInt8(ascii: "u"):
                    var scalar = try hex4()
                    if (0xD800...0xDBFF).contains(scalar) {
                        // A surrogate pair: the low half must follow as another \u escape.
                        guard try peekByte() == UInt8(ascii: "\\") else { scalar = 0xFFFD; break }
                        advance(UInt8(ascii: "\\"))
                        guard try peekByte() == UInt8(ascii: "u") else {
                            throw error("expected '\\u' (a low surrogate)")
                        }
                        advance(UInt8(ascii: "u"))
                        let low = try hex4()
                        scalar =
                            (0xDC00...0xDFFF).contains(low)
                            ? 0x10000 + ((scalar - 0xD800) << 10) + (low - 0xDC00) : 0xFFFD
                    } else if (0xDC00...0xDFFF).contains(scalar) {
                        scalar = 0xFFFD
                    }
                    for unit in String(Character(Unicode.Scalar(scalar) ?? "\u{FFFD}")).utf8 { keep(unit) }
                default:
                    throw error("an unknown escape in a string")
                }
            }
        }
        // Cut inside a multi-byte character: drop its start, so the text stays valid UTF-8.
        if truncated {
            while let last = bytes.last, last & 0xC0 == 0x80 { bytes.removeLast() }
            if let last = bytes.last, last >= 0xC0 { bytes.removeLast() }
        }
        return (String(decoding: bytes, as: UTF8.self), truncated)
    }

    private func hex4() throws(ReplayInputError) -> UInt32 {
        var value: UInt32 = 0
        for _ in 0..<4 {
            guard let byte = try peekByte() else { throw error("the file ends inside a string") }
            let digit: UInt32
            switch byte {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): digit = UInt32(byte - UInt8(ascii: "0"))
            case UInt8(ascii: "a")...UInt8(ascii: "f"): digit = UInt32(byte - UInt8(ascii: "a") + 10)
            case UInt8(ascii: "A")...UInt8(ascii: "F"): digit = UInt32(byte - UInt8(ascii: "A") + 10)
            default: throw error("expected 4 hexadecimal digits after '\\u'")
            }
            advance(byte)
            value = value << 4 | digit
        }
        return value
    }
}

/// `read(2)`, named apart from the reader's own methods.
private func systemRead(_ descriptor: Int32, _ buffer: UnsafeMutableRawPointer?, _ count: Int) -> Int {
    read(descriptor, buffer, count)
}
