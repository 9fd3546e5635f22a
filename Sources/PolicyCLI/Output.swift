import Foundation
import ResponsePolicy

/// Where a command writes. The binary uses the process's stdout and stderr; tests capture both.
package struct CommandOutput: Sendable {
    package var stdout: @Sendable (String) -> Void
    package var stderr: @Sendable (String) -> Void
    /// Whether stdout is a terminal: source snippets only then, and colour unless told otherwise.
    package var isTerminal: Bool
    /// `NO_COLOR` is set to something (https://no-color.org): no colour unless `--color always`.
    package var noColor: Bool

    package init(
        stdout: @escaping @Sendable (String) -> Void, stderr: @escaping @Sendable (String) -> Void,
        isTerminal: Bool = false, noColor: Bool = false
    ) {
        self.stdout = stdout
        self.stderr = stderr
        self.isTerminal = isTerminal
        self.noColor = noColor
    }

    /// The process's own streams, unbuffered line by line.
    package static var standard: CommandOutput {
        CommandOutput(
            stdout: { text in FileHandle.standardOutput.write(Data(text.utf8)) },
            stderr: { text in FileHandle.standardError.write(Data(text.utf8)) },
            isTerminal: isatty(STDOUT_FILENO) == 1,
            noColor: !(ProcessInfo.processInfo.environment["NO_COLOR"] ?? "").isEmpty)
    }

    /// Whether to colour what goes to stdout: `--color always` or `never` as told; `auto`, on a
    /// terminal when `NO_COLOR` is not set.
    package func colours(_ choice: ColorChoice) -> Bool {
        switch choice {
        case .always: true
        case .never: false
        case .auto: isTerminal && !noColor
        }
    }
}

/// `--color auto|always|never`, as git, ls and grep spell it.
package enum ColorChoice: String, CaseIterable, Sendable {
    case auto, always, never
}

/// Exit codes, from sysexits(3) where one fits.
enum ExitCode {
    static let success: Int32 = 0
    static let failure: Int32 = 1
    static let usage: Int32 = 64
    static let dataError: Int32 = 65
    static let noInput: Int32 = 66
    /// EX_CANTCREAT: an output file (the credentials file's replacement) cannot be created.
    static let cannotCreate: Int32 = 73
}

extension Option where Value == ColorChoice {
    /// `--color auto|always|never` for a command that colours its output.
    static var color: Self {
        .choice(
            ["--color"], "color", default: ColorChoice.auto,
            help: "Colour the output: auto (default: on a terminal, unless NO_COLOR is set), always or never.")
    }
}

/// A tiny JSON writer with a stable key order, for machine-readable output.
enum JSONText {
    static func string(_ text: String) -> String { PolicyEvent.quote(text) }

    /// An object from ordered pairs whose values are already JSON text.
    static func object(_ pairs: [(String, String)]) -> String {
        "{" + pairs.map { string($0.0) + ":" + $0.1 }.joined(separator: ",") + "}"
    }

    static func number(_ value: Double) -> String {
        formatNumber(value)
    }
}
