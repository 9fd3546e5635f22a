import ResponsePolicy

/// A command's declared arguments, options and exit codes, parsed by hand (no dependencies).
///
/// Help, the usage line, parsing, docs/commands.md and the man page all read this one value, so
/// they cannot drift apart (the top-level help once said `graph` printed "DOT or Mermaid" while
/// it also printed JSON). A command reads its options through the typed ``Option`` values it
/// declared, never by looking a name up as a string.
struct CommandSpec: Sendable {
    /// An option as the parser and the help see it; commands declare it through ``Option``.
    struct OptionDeclaration: Sendable {
        var names: [String]
        /// `nil` for a flag.
        var valueName: String?
        var help: String
        var repeatable = false
        var required = false
        /// The values the option accepts; empty for any.
        var choices: [String] = []
        /// Checks a value at parse time: `nil` when it is fine, else the usage error's message.
        var check: (@Sendable (String) -> String?)?

        /// The name values are stored under: the long name.
        var key: String { names.last ?? "" }

        /// `--format <format>` in help, `-H, --header <header>` for two names.
        var helpNames: String { names.joined(separator: ", ") + (valueName.map { " <\($0)>" } ?? "") }

        /// The option in the usage line: `[--format text|json]`, `[--plugin KIND:NAME]...`, `--policy FILE`.
        var usage: String {
            var text = names.first ?? ""
            if !choices.isEmpty {
                text += " " + choices.joined(separator: "|")
            } else if let valueName {
                text += " " + valueName.uppercased()
            }
            if !required { text = "[\(text)]" }
            return repeatable ? text + "..." : text
        }
    }

    /// A positional argument.
    struct Argument: Sendable {
        var name: String
        var help: String
        /// Takes one or more values (`PATH...`).
        var variadic = false
        /// May be left out (`[FILE]`).
        var optional = false

        var usage: String {
            let text = variadic ? name + "..." : name
            return optional ? "[\(text)]" : text
        }
    }

    var name: String
    /// One line, the only description of the command: the first line of its `--help`, its row in
    /// `policy --help` and in docs/commands.md's table, its paragraph in the man page. (Two texts,
    /// a summary and an overview, once said different things about five commands.)
    var summary: String
    var arguments: [Argument]
    var options: [OptionDeclaration]
    /// What each exit status means, shown in `--help` so scripts can rely on them.
    var exitCodes: [(Int32, String)]
    var subcommands: [(String, String)] = []
    /// A usage line written by hand, for the top level; subcommands' lines are built from their
    /// options and arguments.
    var usageOverride: String?

    init(
        name: String, summary: String, arguments: [Argument] = [],
        options: [OptionDeclaration], exitCodes: [(Int32, String)], subcommands: [(String, String)] = [],
        usage: String? = nil
    ) {
        self.name = name
        self.summary = summary
        self.arguments = arguments
        self.options = options
        self.exitCodes = exitCodes
        self.subcommands = subcommands
        self.usageOverride = usage
    }

    /// `policy lint [--format text|json|sarif|github] [--strict] ... PATH...`
    var usage: String {
        if let usageOverride { return usageOverride }
        return (["policy", name] + options.map(\.usage) + arguments.map(\.usage)).joined(separator: " ")
    }

    var helpText: String {
        var out = "OVERVIEW: \(summary)\n\nUSAGE: \(usage)\n"
        if !arguments.isEmpty {
            out += "\nARGUMENTS:\n"
            for argument in arguments { out += Self.column(argument.name, argument.help) }
        }
        out += "\nOPTIONS:\n"
        for option in options { out += Self.column(option.helpNames, option.help) }
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

/// An option a command declares and reads with the type it declared: `arguments[Self.format]`
/// is a `Format`, `arguments[Self.strict]` a `Bool`. Values are checked while parsing, so a bad
/// one is a usage error before the command starts.
struct Option<Value>: Sendable {
    var declaration: CommandSpec.OptionDeclaration
    var read: @Sendable (ParsedArguments) -> Value
}

extension Option where Value == Bool {
    /// A flag: `true` when given.
    static func flag(_ names: [String], help: String) -> Self {
        let declaration = CommandSpec.OptionDeclaration(names: names, valueName: nil, help: help)
        return Option(declaration: declaration) { $0.flags.contains(declaration.key) }
    }
}

extension Option where Value == String? {
    /// An optional value; the last one given wins (giving it twice is a usage error).
    static func value(_ names: [String], _ valueName: String, help: String) -> Self {
        let declaration = CommandSpec.OptionDeclaration(names: names, valueName: valueName, help: help)
        return Option(declaration: declaration) { $0.values[declaration.key]?.last }
    }
}

extension Option where Value == Int? {
    /// A positive whole number, checked at parse time; `nil` when not given.
    static func positiveInteger(_ names: [String], _ valueName: String, help: String) -> Self {
        var declaration = CommandSpec.OptionDeclaration(names: names, valueName: valueName, help: help)
        let shown = "\(names.last ?? "") <\(valueName)>"
        declaration.check = { text in
            guard let value = Int(text), value > 0 else {
                return "Invalid value '\(text)' for '\(shown)'; expected a positive whole number"
            }
            return nil
        }
        let key = declaration.key
        return Option(declaration: declaration) { arguments in
            arguments.values[key]?.last.flatMap { Int($0) }
        }
    }
}

extension Option where Value == String {
    /// A value the command cannot run without: leaving it out is a usage error.
    static func required(_ names: [String], _ valueName: String, help: String) -> Self {
        var declaration = CommandSpec.OptionDeclaration(names: names, valueName: valueName, help: help)
        declaration.required = true
        let key = declaration.key
        return Option(declaration: declaration) { $0.values[key]?.last ?? "" }
    }
}

extension Option where Value == [String] {
    /// A value that may be given any number of times, in order.
    static func repeated(_ names: [String], _ valueName: String, help: String) -> Self {
        var declaration = CommandSpec.OptionDeclaration(names: names, valueName: valueName, help: help)
        declaration.repeatable = true
        let key = declaration.key
        return Option(declaration: declaration) { $0.values[key] ?? [] }
    }

    /// `--plugin KIND:NAME`, repeatable: a host plugin declared by name.
    static func plugin(help: String = "Declare a host plugin, like refresh:my-sso, so 'use:' may name it. Repeatable.")
        -> Self
    {
        repeated(["--plugin"], "kind:name", help: help)
    }
}

extension Option where Value: RawRepresentable & CaseIterable & Sendable, Value.RawValue == String {
    /// One of `Value`'s cases by its raw value, `defaultValue` when not given. The usage line
    /// lists the cases; any other value is refused with them.
    static func choice(_ names: [String], _ valueName: String, default defaultValue: Value, help: String) -> Self {
        var declaration = CommandSpec.OptionDeclaration(names: names, valueName: valueName, help: help)
        let choices = Value.allCases.map(\.rawValue)
        declaration.choices = choices
        declaration.check = { text in
            guard !choices.contains(text) else { return nil }
            let listed =
                choices.count > 1
                ? choices.dropLast().joined(separator: ", ") + " or " + (choices.last ?? "") : choices.joined()
            return "Unknown \(valueName) '\(text)'; use \(listed)"
        }
        let key = declaration.key
        return Option(declaration: declaration) { arguments in
            arguments.values[key]?.last.flatMap { Value(rawValue: $0) } ?? defaultValue
        }
    }
}

/// What parsing produced: option values by their long name, positional arguments, or help.
/// Commands read options through their ``Option`` declarations (`arguments[Self.format]`).
struct ParsedArguments: Sendable {
    fileprivate(set) var values: [String: [String]] = [:]
    fileprivate(set) var flags: Set<String> = []
    var positional: [String] = []
    var wantsHelp = false

    subscript<Value>(option: Option<Value>) -> Value { option.read(self) }
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
                throw UsageError(message: "Unknown option '\(name)'" + optionHint(name))
            }
            guard option.valueName != nil else {
                if inline != nil { throw UsageError(message: "The option '\(name)' does not take a value") }
                parsed.flags.insert(option.key)
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
            if !option.repeatable, parsed.values[option.key] != nil {
                throw UsageError(message: "The option '\(name)' was given more than once")
            }
            if let message = option.check?(value) { throw UsageError(message: message) }
            parsed.values[option.key, default: []].append(value)
        }
        if !parsed.wantsHelp {
            for option in options where option.required && parsed.values[option.key] == nil {
                throw UsageError(message: "Missing expected option '\(option.key) <\(option.valueName ?? "value")>'")
            }
        }
        return parsed
    }

    /// `; did you mean '--format'?` for a near miss of one of the command's options, or nothing.
    func optionHint(_ name: String) -> String {
        let names = options.flatMap(\.names).filter { $0.hasPrefix("--") } + ["--help"]
        return Suggestion.hint(for: name, in: names)
    }
}
