/// One subcommand of `policy`: its declaration (name, summary, arguments, typed options, exit
/// codes) and what runs it.
struct Command: Sendable {
    var spec: CommandSpec
    var run: @Sendable (ParsedArguments, CommandOutput) async throws(UsageError) -> Int32

    var name: String { spec.name }
}

/// The subcommands, in the order help lists them. The top-level help, `policy help CMD`, usage
/// errors, dispatch, docs/commands.md and the man page all read this table and nothing else.
enum CommandTable {
    static let commands: [Command] = [
        Command(spec: LintCommand.spec) { arguments, output throws(UsageError) in
            try LintCommand.run(arguments, output: output)
        },
        Command(spec: GraphCommand.spec) { arguments, output throws(UsageError) in
            try GraphCommand.run(arguments, output: output)
        },
        Command(spec: ExplainCommand.spec) { arguments, output throws(UsageError) in
            try ExplainCommand.run(arguments, output: output)
        },
        Command(spec: SimulateCommand.spec) { arguments, output throws(UsageError) in
            try await SimulateCommand.run(arguments, output: output)
        },
        Command(spec: TestCommand.spec) { arguments, output throws(UsageError) in
            try await TestCommand.run(arguments, output: output)
        },
        Command(spec: ReplayCommand.spec) { arguments, output throws(UsageError) in
            try await ReplayCommand.run(arguments, output: output)
        },
        Command(spec: DiffCommand.spec) { arguments, output throws(UsageError) in
            try DiffCommand.run(arguments, output: output)
        },
        Command(spec: SchemaCommand.spec) { arguments, output throws(UsageError) in
            try SchemaCommand.run(arguments, output: output)
        },
        Command(spec: FetchCommand.spec) { arguments, output throws(UsageError) in
            try await FetchCommand.run(arguments, output: output)
        },
    ]

    static func named(_ name: String) -> Command? { commands.first { $0.name == name } }
}
