import Foundation
import TestGate
import TestSupport
import Testing

/// README's set-up command, `swift test`, passes on a loaded machine, and CI still runs every
/// test: a test that measures real time is skipped by a plain run with the command that runs it,
/// and `.ci/run` runs it in a step of its own. (A plain `swift test` beside another build once
/// failed five wall-time bounds; only `.ci/run`'s environment variable kept CI green.)
struct TestRunContractTests {
    /// Every Swift file under Tests/, with its text.
    static let sources: [(path: String, text: String)] = {
        let root = repositoryRoot.appendingPathComponent("Tests")
        guard let enumerator = FileManager.default.enumerator(atPath: root.path) else { return [] }
        var files: [(String, String)] = []
        while let entry = enumerator.nextObject() as? String {
            guard entry.hasSuffix(".swift"),
                let text = try? String(contentsOf: root.appendingPathComponent(entry), encoding: .utf8)
            else { continue }
            files.append(("Tests/" + entry, text))
        }
        return files.sorted { $0.0 < $1.0 }
    }()

    /// The `filter:` of every `.measuresRealTime(filter:)` in the tests, with its file.
    static let realTimeFilters: [(file: String, filter: String)] = sources.flatMap { file in
        file.text.matches(of: /\.measuresRealTime\(filter: "([^"]+)"\)/).map { (file.path, String($0.1)) }
    }

    /// The `--filter` regular expressions of `.ci/run`'s steps that set `POLICY_TESTS_REALTIME=1`.
    static let ciRealTimeFilters: [String] = {
        guard let text = try? String(contentsOf: repositoryRoot.appendingPathComponent(".ci/run"), encoding: .utf8)
        else { return [] }
        let joined = text.replacingOccurrences(of: "\\\n", with: " ")
        return joined.split(separator: "\n").filter { $0.hasPrefix("POLICY_TESTS_REALTIME=1 swift test") }
            .compactMap { line in line.firstMatch(of: /--filter '([^']+)'/).map { String($0.1) } }
    }()

    @Test func thereAreRealTimeTestsAndCISteps() {
        #expect(Self.realTimeFilters.count >= 10)
        #expect(Self.ciRealTimeFilters.count >= 2)
    }

    /// Each one runs in CI: some real-time step's `--filter` selects it.
    @Test func everyTestThatMeasuresRealTimeRunsInARealTimeStepOfCI() throws {
        for (file, filter) in Self.realTimeFilters {
            let selected = try Self.ciRealTimeFilters.contains { pattern in
                try Regex(pattern).firstMatch(in: filter) != nil
            }
            #expect(selected, "\(file): '\(filter)' is skipped by `swift test` and run by no step of .ci/run")
        }
    }

    /// The filter a skip names selects the suite it is written on (its first part is a struct of
    /// that file), so the command it prints runs that test.
    @Test func everySkipNamesItsOwnSuite() {
        for (file, filter) in Self.realTimeFilters {
            let suite = filter.split(separator: "/").first.map(String.init) ?? filter
            let text = Self.sources.first { $0.path == file }?.text ?? ""
            #expect(text.contains("struct \(suite)"), "\(file): '\(filter)' names no suite of the file")
        }
    }

    /// The reason a skipped real-time test gives is the command that runs it.
    @Test func aSkippedRealTimeTestSaysHowToRunIt() {
        #expect(
            RealTimeSuites.skipReason(filter: "FleetLogoutTests")
                == "measures real time, so it runs only when asked, alone: "
                + "POLICY_TESTS_REALTIME=1 swift test --filter 'FleetLogoutTests'")
    }

    /// `.ci/run` runs README's command as written, before the real-time steps.
    @Test func ciRunsTheReadmesTestCommandAsWritten() throws {
        let ci = try String(contentsOf: repositoryRoot.appendingPathComponent(".ci/run"), encoding: .utf8)
        let readme = try String(contentsOf: repositoryRoot.appendingPathComponent("README.md"), encoding: .utf8)
        #expect(readme.contains("\nswift test                             # the test suite\n"))
        #expect(ci.split(separator: "\n").contains("swift test"))
        #expect(!ci.contains("POLICY_TESTS_DEFER_REALTIME"))
    }

    /// No skipped test without its reason: every `enabled(if:)` and `disabled` trait in the tests
    /// gives a comment (the AuthlibTests skips once said nothing, though their suite promised the
    /// command that makes what they need).
    @Test func everyConditionalTestGivesItsReason() {
        for file in Self.sources where !file.path.hasPrefix("Tests/TestGate/") {
            for match in file.text.matches(of: /\.(enabled\(if:|disabled\()/) {
                let call = Self.balancedCall(in: file.text, from: match.range.lowerBound)
                let givesReason = call.contains("\"") || call.contains("Self.needs") || call.contains("Comment(")
                #expect(givesReason, "\(file.path): \(call) gives no reason for the skip")
            }
        }
    }

    /// The text of a call from `start` to its closing parenthesis.
    static func balancedCall(in text: String, from start: String.Index) -> String {
        var depth = 0
        var index = start
        while index < text.endIndex {
            let character = text[index]
            if character == "(" { depth += 1 }
            if character == ")" {
                depth -= 1
                if depth == 0 { return String(text[start...index]) }
            }
            index = text.index(after: index)
        }
        return String(text[start...])
    }
}
