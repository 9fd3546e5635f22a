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
        render(diagnostic, lines: source.map(Self.yamlLines))
    }

    /// `render` with the file's lines split once (``yamlLines(_:)``): a file with many findings
    /// is split once, not once per finding.
    package func render(_ diagnostic: Diagnostic, lines: [Substring.UnicodeScalarView]?) -> String {
        var out = headline(diagnostic)
        // The line of a secret-in-policy finding holds the secret: never echo it.
        if showSource, diagnostic.rule != "secret-in-policy", let lines,
            let snippet = Self.snippet(lines: lines, at: diagnostic.range.start)
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
        snippet(lines: yamlLines(source), at: position)
    }

    package static func snippet(lines: [Substring.UnicodeScalarView], at position: SourcePosition) -> String? {
        guard position.line >= 1, !lines.isEmpty else { return nil }
        let current: Substring.UnicodeScalarView
        if position.line <= lines.count {
            current = lines[position.line - 1]
        } else if position.line == lines.count + 1 {
            // libyaml puts "end of input" on the line after a last line without a newline.
            current = lines[lines.count - 1]
        } else {
            return nil
        }
        var shown = ""
        var caret = ""
        var column = 1
        for scalar in current.prefix(200) {
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
        if position.line > lines.count { caret = String(repeating: " ", count: min(current.count, 200)) }
        return "  " + shown + "\n  " + caret + "^"
    }

    /// The source's lines as libyaml counts them: LF, CR, CRLF, NEL, U+2028 and U+2029 each end
    /// a line (YAML 1.1 §5.4), so a finding's line number finds its line.
    package static func yamlLines(_ source: String) -> [Substring.UnicodeScalarView] {
        let scalars = Substring(source).unicodeScalars
        var lines: [Substring.UnicodeScalarView] = []
        var start = scalars.startIndex
        var index = start
        while index < scalars.endIndex {
            let scalar = scalars[index]
            if scalar == "\r" || scalar == "\n" || scalar == "\u{85}" || scalar == "\u{2028}" || scalar == "\u{2029}" {
                lines.append(scalars[start..<index])
                var next = scalars.index(after: index)
                if scalar == "\r", next < scalars.endIndex, scalars[next] == "\n" { next = scalars.index(after: next) }
                start = next
                index = next
            } else {
                index = scalars.index(after: index)
            }
        }
        if start < scalars.endIndex || lines.isEmpty { lines.append(scalars[start..<scalars.endIndex]) }
        return lines
    }

    /// The character at a 1-based line and column, counted as libyaml counts them (a leading
    /// byte-order mark is not a column).
    package static func character(in source: String, at position: SourcePosition) -> Unicode.Scalar? {
        let lines = yamlLines(source)
        guard position.line >= 1, position.line <= lines.count, position.column >= 1 else { return nil }
        var line = lines[position.line - 1]
        if position.line == 1, line.first == "\u{FEFF}" { line = line.dropFirst() }
        guard let index = line.index(line.startIndex, offsetBy: position.column - 1, limitedBy: line.endIndex),
            index < line.endIndex
        else { return nil }
        return line[index]
    }
}
