import Foundation
import TestSupport
import Testing

/// docs/guarantees.md ties each promise to the tests that hold it: every suite and test it names
/// exists, so a renamed or deleted test cannot leave a promise pointing at nothing.
struct GuaranteesDocTests {
    /// The names the "shown by" column gives in backticks: `Suite`, `Suite.test`, `…test` (a
    /// test of the suite named before it).
    static func namedTests() throws -> [(suite: String?, test: String?)] {
        let text = try String(
            contentsOf: repositoryRoot.appendingPathComponent("docs/guarantees.md"), encoding: .utf8)
        var names: [(String?, String?)] = []
        for line in text.split(separator: "\n") where line.hasPrefix("| ") {
            let cells = line.split(separator: "|", omittingEmptySubsequences: false)
            guard cells.count >= 3 else { continue }
            var suite: String?
            for piece in cells[2].split(separator: "`").enumerated() where piece.offset % 2 == 1 {
                let name = String(piece.element)
                if name.wholeMatch(of: /[A-Z][A-Za-z0-9]*Tests/) != nil {
                    suite = name
                    names.append((name, nil))
                } else if let match = name.wholeMatch(of: /([A-Z][A-Za-z0-9]*Tests)\.([a-z][A-Za-z0-9]*)/) {
                    suite = String(match.1)
                    names.append((suite, String(match.2)))
                } else if let match = name.wholeMatch(of: /…([a-z][A-Za-z0-9]*)/) {
                    names.append((suite, String(match.1)))
                }
            }
        }
        return names
    }

    @Test func everyTestItNamesExists() throws {
        var sources = ""
        let tests = repositoryRoot.appendingPathComponent("Tests")
        let files = FileManager.default.enumerator(at: tests, includingPropertiesForKeys: nil)
        while let file = files?.nextObject() as? URL {
            guard file.pathExtension == "swift" else { continue }
            sources += (try? String(contentsOf: file, encoding: .utf8)) ?? ""
        }
        let names = try Self.namedTests()
        #expect(names.count > 100, "the table names fewer tests than it did: \(names.count)")
        for (suite, test) in names {
            if let suite {
                #expect(
                    sources.contains("struct \(suite)") || sources.contains("class \(suite)")
                        || sources.contains("enum \(suite)") || sources.contains("extension \(suite)"),
                    "docs/guarantees.md names a suite '\(suite)' that does not exist")
            }
            if let test {
                #expect(
                    sources.contains("func \(test)(") || sources.contains("func \(test)<"),
                    "docs/guarantees.md names a test '\(suite ?? "")…\(test)' that does not exist")
            }
        }
    }
}
