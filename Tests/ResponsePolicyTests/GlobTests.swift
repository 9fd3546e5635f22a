import Foundation
import Testing

@testable import ResponsePolicy

struct GlobTests {
    @Test(arguments: [
        ("/oauth/*", "/oauth/token", true), ("/oauth/*", "/oauth/v2/token", true), ("/oauth/*", "/oauth", false),
        ("*", "", true), ("a?c", "abc", true), ("a?c", "ac", false), ("*b*b", "abab", true), ("*b*b", "abba", false),
        ("/caf?/*", "/café/menu", true), ("/x", "/x", true), ("/x", "/y", false), ("**a", "bba", true),
    ])
    func matches(_ pattern: String, _ text: String, _ expected: Bool) {
        #expect(Glob(pattern).matches(text) == expected, "\(pattern) ~ \(text)")
    }
}

/// Globs stay linear (or bounded) on hostile input, and covering is sound.
struct HostileGlobTests {
    /// The textbook matcher, as the oracle: backs up to the last `*` on a mismatch.
    static func reference(_ pattern: [Unicode.Scalar], _ text: [Unicode.Scalar]) -> Bool {
        var p = 0
        var t = 0
        var starP = -1
        var starT = 0
        while t < text.count {
            if p < pattern.count, pattern[p] == "?" || pattern[p] == text[t] {
                p += 1
                t += 1
            } else if p < pattern.count, pattern[p] == "*" {
                starP = p
                starT = t
                p += 1
            } else if starP >= 0 {
                p = starP + 1
                starT += 1
                t = starT
            } else {
                return false
            }
        }
        while p < pattern.count, pattern[p] == "*" { p += 1 }
        return p == pattern.count
    }

    @Test func matchingAgreesWithTheTextbookMatcherOnRandomInput() async {
        // On a thread of its own: seconds of work must not hold a thread of the cooperative pool.
        let disagreements = await onOwnThread { () -> [String] in
            var random = SplitMix64(seed: 12)
            let patternAlphabet: [Unicode.Scalar] = ["a", "b", "/", "*", "?"]
            let textAlphabet: [Unicode.Scalar] = ["a", "b", "/", "é"]
            var disagreements: [String] = []
            for _ in 0..<20_000 {
                let pattern = (0..<Int.random(in: 0..<9, using: &random)).map { _ in
                    patternAlphabet[Int.random(in: 0..<5, using: &random)]
                }
                let text = (0..<Int.random(in: 0..<12, using: &random)).map { _ in
                    textAlphabet[Int.random(in: 0..<4, using: &random)]
                }
                let patternText = String(String.UnicodeScalarView(pattern))
                let textText = String(String.UnicodeScalarView(text))
                if Glob(patternText).matches(textText) != Self.reference(pattern, text) {
                    disagreements.append("\(patternText) ~ \(textText)")
                }
            }
            return disagreements
        }
        #expect(disagreements == [])
    }

    /// Whenever covering is claimed, every text the covered glob matches is matched by the
    /// covering one (tried on the texts of a small alphabet up to length 6).
    @Test func coveringIsSound() async {
        let (claimed, unsound) = await onOwnThread { () -> (Int, [String]) in
            var random = SplitMix64(seed: 7)
            let alphabet: [Unicode.Scalar] = ["a", "b", "*", "?"]
            var texts: [String] = [""]
            var layer: [String] = [""]
            for _ in 0..<6 {
                layer = layer.flatMap { prefix in ["a", "b"].map { prefix + $0 } }
                texts += layer
            }
            var claimed = 0
            var unsound: [String] = []
            for _ in 0..<3_000 {
                let a = Glob(randomText(alphabet, upTo: 5, &random))
                let b = Glob(randomText(alphabet, upTo: 5, &random))
                guard b.isCovered(by: a) else { continue }
                claimed += 1
                for text in texts where b.matches(text) && !a.matches(text) {
                    unsound.append("'\(a)' covers '\(b)' but not '\(text)'")
                }
            }
            return (claimed, unsound)
        }
        #expect(unsound == [])
        #expect(claimed > 300)
    }

    @Test(arguments: [
        ("/api/v?/*", "/api/*", true), ("/api/v1/x", "/api/*", true), ("/api/*", "/api/v?/*", false),
        ("/a?c", "/a*c", true), ("/a*c", "/a?c", false), ("*", "*", true), ("/x", "*", true), ("*", "/x*", false),
        ("/oauth/token", "/oauth/token", true), ("/oauth/token", "/oauth/tokens", false),
    ])
    func covering(_ covered: String, _ covering: String, _ expected: Bool) {
        #expect(Glob(covered).isCovered(by: Glob(covering)) == expected)
    }

    /// The work of `*aaa…ab` against `/aaa…a` (twice as long) grows linearly: the textbook matcher
    /// takes n² steps.
    @Test(arguments: [1_000, 4_000, 16_000])
    func hostileCoveringIsLinear(_ n: Int) {
        let glob = Glob("*" + String(repeating: "a", count: n) + "b")
        let literal = Glob("/" + String(repeating: "a", count: 2 * n))
        var budget = Int.max
        #expect(!literal.isCovered(by: glob, budget: &budget))
        let steps = Int.max - budget
        #expect(steps <= 4 * (3 * n + 2), "\(steps) steps for n = \(n)")
        #expect(!glob.matches("/" + String(repeating: "a", count: 2 * n)))
    }

    @Test func theCoveringBudgetStopsAHostileSearchAndProvesNothing() {
        let glob = Glob("*" + String(repeating: "a?", count: 200) + "b*")
        let literal = Glob("/" + String(repeating: "a", count: 1_000))
        var budget = 10_000
        #expect(!literal.isCovered(by: glob, budget: &budget))
        #expect(budget <= 0)
    }

    @Test func aGlobLongerThanTheLimitIsAPositionedError() {
        let long = String(repeating: "a", count: Glob.maxLength)
        let yaml = "policy: 1\nname: x\nrules:\n  - { name: r, when: { path: \"/\(long)\" }, then: fail }\n"
        #expect(
            renderedErrors(yaml)
                == "test.yaml:4:30: error: 'path' is a pattern of 1025 characters; at most 1024 are allowed [invalid-value]"
        )
        // 1,024 characters, the slash included, are allowed.
        #expect(renderedErrors(yaml.replacingOccurrences(of: "/" + long, with: "/" + long.dropFirst())).isEmpty)
    }

    /// The issue's own file: two rules whose globs fill 12 MiB. Both are errors; the rules are not
    /// read as matching everything (no shadowed-rule warning), and no time goes into them.
    @Test func twoHugeHostileGlobsAreErrorsAndNothingElse() async {
        let yaml =
            "policy: 1\nname: x\nrules:\n  - { name: x, when: { path: \"*\(String(repeating: "a", count: 4 << 20))b\" }, then: fail }\n"
            + "  - { name: y, when: { path: \"/\(String(repeating: "a", count: 8 << 20))\" }, then: fail }\n"
        let (diagnostics, seconds) = await onOwnThread { () -> ([Diagnostic], Double) in
            let started = threadCPUTime()
            return (findings(yaml), threadCPUTime() - started)
        }
        #expect(diagnostics.map(\.rule) == ["invalid-value", "invalid-value"])
        #expect(seconds < 2)
        #expect(!Glob(rejected: "x").matches("x"))
    }

    /// A 16 MiB policy of hostile globs (each literal path pits its candidates' `*aaa…ab` against
    /// its `/aaa…a`) lints, and its glob work stays within the covering budget. Time is measured
    /// as this thread's CPU time, so a loaded machine does not fail it: at most 2 s in a release
    /// build, five times that in a debug one (measured: 0.5 s release, 2.8 s debug).
    @Test func aSixteenMiBFileOfHostileGlobsLintsInBoundedTime() async {
        var text = "policy: 1\nname: hostile\nrules:\n"
        let glob = "*" + String(repeating: "a", count: 500) + "b"
        let literal = "/" + String(repeating: "a", count: 1_000)
        var index = 0
        while text.utf8.count < (16 << 20) - 2_000 {
            let path = index % 2 == 0 ? glob : literal
            text += "  - { name: r\(index), when: { path: \"\(path)\" }, then: fail }\n"
            index += 1
        }
        let policy = text
        let (diagnostics, seconds) = await onOwnThread { () -> ([Diagnostic], Double) in
            let started = threadCPUTime()
            return (findings(policy), threadCPUTime() - started)
        }
        #expect(diagnostics.allSatisfy { $0.severity == .warning })
        #if DEBUG
            let limit = 10.0
        #else
            let limit = 2.0
        #endif
        #expect(seconds < limit, "\(seconds) s of CPU time for \(text.utf8.count) bytes")
    }
}

private func randomText(_ alphabet: [Unicode.Scalar], upTo length: Int, _ random: inout SplitMix64) -> String {
    let count = Int.random(in: 0..<length, using: &random)
    return String(String.UnicodeScalarView((0..<count).map { _ in alphabet.randomElement(using: &random) ?? "a" }))
}

/// Runs `body` on a thread of its own: seconds of synchronous work must not hold one of the
/// cooperative pool's few threads, which other tests running in parallel wait for.
func onOwnThread<T: Sendable>(_ body: @escaping @Sendable () -> T) async -> T {
    await withCheckedContinuation { continuation in
        let thread = Thread { continuation.resume(returning: body()) }
        thread.stackSize = 8 << 20
        thread.start()
    }
}

/// CPU seconds this thread has run: unlike wall time, not inflated by other processes.
func threadCPUTime() -> Double {
    var spec = timespec()
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &spec)
    return Double(spec.tv_sec) + Double(spec.tv_nsec) / 1e9
}
