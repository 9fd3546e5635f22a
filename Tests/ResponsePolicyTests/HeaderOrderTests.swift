import Foundation
import TestSupport
import Testing

@testable import ResponsePolicy

/// The order both transports hand response headers back in: by name regardless of ASCII case,
/// then as written. Checked against the plain definition (lowercased copies compared as tuples)
/// on seeded random names that differ in case, length and prefix.
struct HeaderOrderTests {
    @Test func namesSortRegardlessOfCaseThenAsWritten() {
        var random = SeededGenerator(seed: 33)
        let letters = Array("aAbBzZ-0")
        for _ in 0..<2_000 {
            let names = (0..<2).map { _ in String((0..<random.int(0...4)).map { _ in letters[random.int(0...7)] }) }
            let (left, right) = (names[0], names[1])
            let expected = (left.lowercased(), left) < (right.lowercased(), right)
            #expect(left.precedesIgnoringASCIICase(right) == expected, "\(left) \(right)")
        }
        #expect("Content-Type".precedesIgnoringASCIICase("content-type"))
        #expect(!"content-type".precedesIgnoringASCIICase("Content-Type"))
        #expect(!"Accept".precedesIgnoringASCIICase("Accept"))
    }
}
