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
