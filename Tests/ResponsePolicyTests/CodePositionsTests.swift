import TestSupport
import Testing

@testable import ResponsePolicy

/// `CodePositions` keeps a rule's code positions in three shapes (one inline, a short list, a
/// table past a few); whatever the shape, it must answer as a dictionary would.
struct CodePositionsTests {
    @Test func randomChangesAnswerAsADictionary() {
        var random = SeededGenerator(seed: 5)
        for _ in 0..<400 {
            var positions = CodePositions()
            var model: [String: SourceRange] = [:]
            let codes = (0..<Int.random(in: 1...14, using: &random)).map { "c\($0)" }
            for step in 0..<Int.random(in: 1...40, using: &random) {
                let code = codes[Int.random(in: 0..<codes.count, using: &random)]
                let range: SourceRange? =
                    Int.random(in: 0..<5, using: &random) == 0
                    ? nil
                    : SourceRange(
                        start: SourcePosition(line: step + 1, column: 1), end: SourcePosition(line: step + 1, column: 5)
                    )
                positions[code] = range
                model[code] = range
                for known in codes {
                    #expect(positions[known] == model[known], "\(known) after setting \(code)")
                }
            }
        }
    }

    @Test func theSameChangesMakeEqualValues() {
        var a = CodePositions()
        var b = CodePositions()
        for index in 0..<12 {
            let range = SourceRange(
                start: SourcePosition(line: index, column: 1), end: SourcePosition(line: index, column: 2))
            a["c\(index)"] = range
            b["c\(index)"] = range
            #expect(a == b)
            #expect(a.hashValue == b.hashValue)
        }
        b["c0"] = nil
        #expect(a != b)
    }
}
