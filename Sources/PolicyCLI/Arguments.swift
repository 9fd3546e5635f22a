/// A command's declared options and arguments, parsed by hand (no dependencies).
struct CommandSpec {
    struct Option {
        var names: [String]
        var valueName: String?
        var help: String
        var repeatable = false
    }

    var name: String
    var overview: String
    var usage: String
    var arguments: [(String, String)]
    var options: [Option]
    var subcommands: [(String, String)] = []
    /// What each exit status means, shown in `--help` so scripts can rely on them.
    var exitCodes: [(Int32, String)] = []

    var helpText: String {
        var out = "OVERVIEW: \(overview)\n\nUSAGE: \(usage)\n"
        if !arguments.isEmpty {
            out += "\nARGUMENTS:\n"
            for (name, help) in arguments { out += Self.column(name, help) }
        }
        out += "\nOPTIONS:\n"
        for option in options {
            let names = option.names.joined(separator: ", ") + (option.valueName.map { " <\($0)>" } ?? "")
            out += Self.column(names, option.help)
        }
        out += Self.column("-h, --help", "Show help information.")
        if !exitCodes.isEmpty {
            out += "\nEXIT CODES:\n"
            for (code, meaning) in exitCodes { out += Self.column(String(code), meaning) }
        }
        if !subcommands.isEmpty {
            out += "\nSUBCOMMANDS:\n"
            for (name, help) in subcommands { out += Self.column(name, help) }
            out += "\n  See 'policy help <subcommand>' for detailed help.\n"
        }
        return out
    }

    static func column(_ left: String, _ right: String) -> String {
        let padded =
            left.count < 24
            ? left + String(repeating: " ", count: 24 - left.count) : left + "\n" + String(repeating: " ", count: 26)
        return "  " + padded + right + "\n"
    }
}

/// What parsing produced: option values by primary name, positional arguments, or a usage error.
struct ParsedArguments {
    var values: [String: [String]] = [:]
    var flags: Set<String> = []
    var positional: [String] = []
    var wantsHelp = false

    func value(_ name: String) -> String? { values[name]?.last }
    func all(_ name: String) -> [String] { values[name] ?? [] }
}

struct UsageError: Error {
    var message: String
}

extension CommandSpec {
    /// Parses `arguments`; `--` ends options. `--name=value` and `--name value` both work.
    func parse(_ arguments: [String]) throws(UsageError) -> ParsedArguments {
        var parsed = ParsedArguments()
        var index = 0
        var optionsEnded = false
        while index < arguments.count {
            let argument = arguments[index]
            index += 1
            if optionsEnded || !argument.hasPrefix("-") || argument == "-" {
                parsed.positional.append(argument)
                continue
            }
            if argument == "--" {
                optionsEnded = true
                continue
            }
            if argument == "-h" || argument == "--help" {
                parsed.wantsHelp = true
                continue
            }
            var name = argument
            var inline: String?
            if argument.hasPrefix("--"), let equals = argument.firstIndex(of: "=") {
                name = String(argument[..<equals])
                inline = String(argument[argument.index(after: equals)...])
            }
            guard let option = options.first(where: { $0.names.contains(name) }) else {
                throw UsageError(message: "Unknown option '\(name)'")
            }
            let key = option.names.last ?? name
            guard option.valueName != nil else {
                if inline != nil { throw UsageError(message: "The option '\(name)' does not take a value") }
                parsed.flags.insert(key)
                continue
            }
            let value: String
            if let inline {
                value = inline
            } else {
                guard index < arguments.count else {
                    throw UsageError(message: "Missing value for '\(name) <\(option.valueName ?? "value")>'")
                }
                value = arguments[index]
                index += 1
            }
            if !option.repeatable, parsed.values[key] != nil {
                throw UsageError(message: "The option '\(name)' was given more than once")
            }
            parsed.values[key, default: []].append(value)
        }
        return parsed
    }
}
