import Foundation
import ResponsePolicy
import Testing

@testable import PolicyCLI

/// What `policy fetch` prints from servers and stores is escaped: one line, no terminal control.
struct TerminalTextTests {
    @Test(arguments: [
        ("plain", "plain"),
        ("1401\nr2 200 delivered", "1401\\nr2 200 delivered"),
        ("a\r\tb", "a\\r\\tb"),
        ("\u{1B}]0;title\u{07}", "\\u{1B}]0;title\\u{7}"),
        ("\u{9B}2J", "\\u{9B}2J"),
        ("x\u{7F}y", "x\\u{7F}y"),
        ("left\u{202E}right\u{2066}", "left\\u{202E}right\\u{2066}"),
        ("line\u{2028}sep\u{2029}", "line\\u{2028}sep\\u{2029}"),
        ("café 😀 日本", "café 😀 日本"),
        ("\u{0}", "\\u{0}"),
    ])
    func controlAndFormatCharactersAreEscaped(_ input: String, _ expected: String) {
        #expect(TerminalText.escaped(input) == expected)
        #expect(TerminalText.line(input) == expected + "\n")
    }

    /// Whatever a text holds, its escaped form has no character a terminal acts on.
    @Test func randomTextsNeverKeepAControlCharacter() {
        var generator = SystemRandomNumberGenerator()
        let pool: [Unicode.Scalar] = (0..<0x100).compactMap(Unicode.Scalar.init) + ["\u{2028}", "\u{202E}", "\u{FEFF}"]
        for _ in 0..<500 {
            var text = ""
            for _ in 0..<Int.random(in: 0..<40, using: &generator) {
                text.unicodeScalars.append(pool.randomElement(using: &generator) ?? "a")
            }
            let escaped = TerminalText.escaped(text)
            #expect(!escaped.unicodeScalars.contains(where: TerminalText.needsEscape), "\(text.debugDescription)")
            #expect(!escaped.contains("\n"))
        }
    }

    /// A logout reason another process stored (a store is shared) reaches fetch's note whole; the
    /// line fetch prints from it is one line.
    @Test func aForgedLogoutReasonFromTheStoreStaysOnOneLine() {
        let recorder = FetchRecorder()
        var event = PolicyEvent(.logout, time: .zero)
        event.reason = "another process logged out\nr9 200 code=0 attempts=1 1ms delivered\u{1B}[2J"
        recorder.observe(event)
        let note = recorder.logoutNote(until: nil) ?? ""
        let line = TerminalText.line("policy: " + note)
        #expect(line.filter { $0 == "\n" }.count == 1)
        #expect(line.hasSuffix("\\nr9 200 code=0 attempts=1 1ms delivered\\u{1B}[2J\n"))
    }
}
