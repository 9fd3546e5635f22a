/// An ordered list of HTTP header fields with case-insensitive lookup.
///
/// Order is kept because some servers care and because tests compare it; names compare without
/// regard to ASCII case, as RFC 9110 §5.1 requires. ``set(_:_:)`` replaces every field of that
/// name, which is how the engine re-signs a request without ever duplicating the auth header.
///
/// ```swift
/// var headers: HTTPHeaders = ["Accept": "application/json"]
/// headers.set("Authorization", "Bearer abc")
/// headers["authorization"]  // "Bearer abc"
/// ```
public struct HTTPHeaders: Sendable, Hashable, ExpressibleByDictionaryLiteral, Sequence {
    /// One header field: a name and its value.
    public struct Field: Sendable, Hashable {
        /// The field name, as written.
        public var name: String
        /// The field value.
        public var value: String
        package init(name: String, value: String) {
            self.name = name
            self.value = value
        }
    }

    /// The fields in order.
    public private(set) var fields: [Field]

    /// No fields.
    public init() { fields = [] }

    /// The fields `(name, value)` in order.
    public init(_ pairs: [(String, String)]) {
        fields = pairs.map { Field(name: $0.0, value: $0.1) }
    }

    /// The fields of a literal, `["Accept": "application/json"]`, in order.
    public init(dictionaryLiteral elements: (String, String)...) {
        self.init(elements)
    }

    /// The first value of the field `name`, compared without regard to ASCII case.
    public subscript(name: String) -> String? {
        for field in fields where field.name.equalsIgnoringASCIICase(name) {
            return field.value
        }
        return nil
    }

    /// Replaces every field called `name` by one field with `value`, in the position of the first.
    public mutating func set(_ name: String, _ value: String) {
        if let first = fields.firstIndex(where: { $0.name.equalsIgnoringASCIICase(name) }) {
            fields[first].value = value
            var index = fields.count - 1
            while index > first {
                if fields[index].name.equalsIgnoringASCIICase(name) { fields.remove(at: index) }
                index -= 1
            }
        } else {
            fields.append(Field(name: name, value: value))
        }
    }

    /// Appends a field, keeping any others of the same name.
    public mutating func add(_ name: String, _ value: String) {
        fields.append(Field(name: name, value: value))
    }

    /// Removes every field called `name`.
    public mutating func remove(_ name: String) {
        fields.removeAll { $0.name.equalsIgnoringASCIICase(name) }
    }

    /// The fields in order.
    public func makeIterator() -> IndexingIterator<[Field]> { fields.makeIterator() }

    /// How many fields there are.
    public var count: Int { fields.count }
}

extension String {
    /// ASCII case-insensitive equality without allocating.
    package func equalsIgnoringASCIICase(_ other: String) -> Bool {
        var left = utf8.makeIterator()
        var right = other.utf8.makeIterator()
        while true {
            switch (left.next(), right.next()) {
            case (nil, nil): return true
            case let (a?, b?):
                if a == b { continue }
                if lowerASCII(a) != lowerASCII(b) { return false }
            default: return false
            }
        }
    }

    /// Whether `self` sorts before `other` by name regardless of ASCII case, then as written
    /// (`Content-Type` before `content-type`), without making lowercased copies: the order both
    /// transports hand response headers back in.
    package func precedesIgnoringASCIICase(_ other: String) -> Bool {
        var exact = 0  // the first difference as written: the tie-break
        var left = utf8.makeIterator()
        var right = other.utf8.makeIterator()
        while true {
            switch (left.next(), right.next()) {
            case (nil, nil): return exact < 0
            case (nil, _): return true
            case (_, nil): return false
            case let (a?, b?):
                let (lowerA, lowerB) = (lowerASCII(a), lowerASCII(b))
                if lowerA != lowerB { return lowerA < lowerB }
                if exact == 0, a != b { exact = a < b ? -1 : 1 }
            }
        }
    }
}

@inline(__always)
package func lowerASCII(_ byte: UInt8) -> UInt8 {
    byte >= 0x41 && byte <= 0x5A ? byte | 0x20 : byte
}
