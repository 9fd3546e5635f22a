import Foundation

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// Text from outside the tool (a server's business code, a token endpoint's or a store's reason)
/// made safe to print on one line of a terminal or a log.
///
/// Why: `policy fetch` prints one line per request. A server that chooses its business code, or a
/// store that holds a logout's reason, could otherwise write a newline and forge more lines (a
/// "delivered" request that never was, a summary), or an escape sequence that sets the
/// terminal's title or hides text. Every control character (C0, DEL, C1: the escape sequences'
/// introducers), every format character (bidirectional overrides, zero-width joiners) and the
/// Unicode line and paragraph separators are written as `\n`, `\r`, `\t` or `\u{1B}`; everything
/// else is printed as it is.
package enum TerminalText {
    /// `text` with every character that could move the cursor, end the line or drive the
    /// terminal escaped.
    ///
    /// ```swift
    /// TerminalText.escaped("1401\n\u{1B}]0;owned\u{7}")  // 1401\n\u{1B}]0;owned\u{7}, printed literally
    /// ```
    package static func escaped(_ text: String) -> String {
        guard text.unicodeScalars.contains(where: needsEscape) else { return text }
        var out = ""
        out.unicodeScalars.reserveCapacity(text.unicodeScalars.count + 8)
        for scalar in text.unicodeScalars {
            guard needsEscape(scalar) else {
                out.unicodeScalars.append(scalar)
                continue
            }
            switch scalar {
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            default: out += "\\u{" + String(scalar.value, radix: 16, uppercase: true) + "}"
            }
        }
        return out
    }

    /// Whether `scalar` is printed escaped: a control, format or separator character, or one
    /// with no meaning (unassigned, private use, a lone surrogate's replacement is not one).
    package static func needsEscape(_ scalar: Unicode.Scalar) -> Bool {
        if scalar.value >= 0x20 && scalar.value < 0x7F { return false }
        switch scalar.properties.generalCategory {
        case .control, .format, .lineSeparator, .paragraphSeparator, .privateUse, .unassigned, .surrogate:
            return true
        default:
            return false
        }
    }

    /// One line of output: `line` escaped, then a newline. For lines whose every part may come
    /// from outside; the tool's own words have no control characters, so escaping the whole line
    /// changes only what a server or a store wrote.
    package static func line(_ line: String) -> String {
        escaped(line) + "\n"
    }

    /// The terminal's width in columns when `descriptor` is a terminal, else `nil`.
    package static func terminalWidth(_ descriptor: Int32 = STDOUT_FILENO) -> Int? {
        guard isatty(descriptor) == 1 else { return nil }
        var size = winsize()
        guard ioctl(descriptor, UInt(TIOCGWINSZ), &size) == 0, size.ws_col > 0 else { return nil }
        return Int(size.ws_col)
    }
}
