import ResponsePolicy

enum SimulateCommand {
    static let spec = CommandSpec(
        name: "simulate", overview: "Run the engine against a scripted server on a virtual clock.",
        usage: "policy simulate FILE --script SCRIPT [--format text|json]",
        arguments: [("FILE", "The policy file.")],
        options: [
            .init(names: ["--script"], valueName: "script", help: "The simulation script (YAML)."),
            .init(names: ["--format"], valueName: "format", help: "text (default) or json (one event per line)."),
        ])

    static func run(_ arguments: ParsedArguments, output: CommandOutput) async throws(UsageError) -> Int32 {
        throw UsageError(message: "simulate is not available yet")
    }
}
