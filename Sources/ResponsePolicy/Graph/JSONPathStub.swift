// Temporary until JSONCodeScanner.swift lands.
package struct JSONPath: Sendable, Hashable {
    package enum Segment: Sendable, Hashable { case key([UInt8]), index(Int) }
    package let segments: [Segment]
    package init?(_ text: String) {
        let parts = text.split(separator: ".", omittingEmptySubsequences: false)
        guard !parts.isEmpty, !parts.contains(where: \.isEmpty) else { return nil }
        segments = parts.map { part in
            if part.allSatisfy({ $0.isASCII && $0.isNumber }), let i = Int(part) { return .index(i) }
            return .key(Array(part.utf8))
        }
    }
}

import Foundation

// Temporary until JSONCodeScanner.swift lands.
package enum JSONCodeScanner {
    package static func code(in body: UnsafeRawBufferPointer, at path: JSONPath, maxBytes: Int = 65_536) -> String? {
        guard let object = try? JSONSerialization.jsonObject(with: Data(body.prefix(maxBytes)), options: [.fragmentsAllowed]) else { return nil }
        var current: Any = object
        for segment in path.segments {
            switch segment {
            case .key(let bytes):
                guard let dict = current as? [String: Any], let next = dict[String(decoding: bytes, as: UTF8.self)] else { return nil }
                current = next
            case .index(let i):
                if let array = current as? [Any], i < array.count { current = array[i] }
                else if let dict = current as? [String: Any], let next = dict[String(i)] { current = next }
                else { return nil }
            }
        }
        if let s = current as? String { return s }
        if let n = current as? NSNumber { return n.stringValue }
        return nil
    }
}

extension JSONCodeScanner {
    package static func withCode<R>(
        in body: UnsafeRawBufferPointer, at path: JSONPath, maxBytes: Int = 65_536, _ use: (UnsafeRawBufferPointer?) -> R
    ) -> R {
        guard let code = code(in: body, at: path, maxBytes: maxBytes) else { return use(nil) }
        var copy = code
        return copy.withUTF8 { use(UnsafeRawBufferPointer($0)) }
    }
}
