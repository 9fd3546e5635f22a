/// Renders diagnostics as text: the `path:line:col: severity: message [rule]` line, then the
/// source line and a caret under the column, then any notes.
///
/// Colour only when asked (the CLI asks when stderr/stdout is a terminal).
package struct DiagnosticRenderer: Sendable {
    package var colour: Bool
    package var showSource: Bool

    package init(colour: Bool = false, showSource: Bool = true) {
        self.colour = colour
        self.showSource = showSource
    }

    package func render(_ diagnostic: Diagnostic, source: String?) -> String {
        var out = headline(diagnostic)
        // The line of a secret-in-policy finding holds the secret: never echo it.
        if showSource, diagnostic.rule != "secret-in-policy", let source,
            let snippet = Self.snippet(source, at: diagnostic.range.start)
        {
            out += "\n" + snippet
        }
        for note in diagnostic.notes {
            out +=
                "\n\(diagnostic.file ?? "<input>"):\(note.range.start.line):\(note.range.start.column): note: \(note.message)"
        }
        return out
    }

    package func headline(_ d: Diagnostic) -> String {
        let file = d.file ?? "<input>"
        let severity: String
        if colour {
            severity = d.severity == .error ? "\u{1B}[1;31merror\u{1B}[0m" : "\u{1B}[1;33mwarning\u{1B}[0m"
        } else {
            severity = d.severity.rawValue
        }
        return "\(file):\(d.range.start.line):\(d.range.start.column): \(severity): \(d.message) [\(d.rule)]"
    }

    /// The source line at `position` and a caret under its column; `nil` when the line does not
    /// exist. Tabs are kept so the caret lines up in a terminal. Control characters and invalid
    /// bytes are shown as `?` so a snippet of a binary file cannot corrupt the terminal.
    package static func snippet(_ source: String, at position: SourcePosition) -> String? {
        guard position.line >= 1 else { return nil }
        var lineNumber = 1
        var current = Substring()
        var found = false
        for line in source.split(separator: "\n", omittingEmptySubsequences: false) {
            if lineNumber == position.line {
                current = line
                found = true
                break
            }
            lineNumber += 1
        }
        guard found else { return nil }
        var shown = ""
        var caret = ""
        var column = 1
        for scalar in current.unicodeScalars.prefix(200) {
            let visible: String
            if scalar == "\t" {
                visible = "\t"
            } else if scalar == "\r" {
                continue
            } else if scalar.value < 0x20 || scalar.value == 0x7F || scalar == "\u{FFFD}" {
                visible = "?"
            } else {
                visible = String(scalar)
            }
            shown += visible
            if column < position.column { caret += scalar == "\t" ? "\t" : " " }
            column += 1
        }
        return "  " + shown + "\n  " + caret + "^"
    }
}
