import Foundation
import ResponsePolicy

/// `policy schema [--plugin KIND:NAME]...`: the JSON Schema of the policy file, for editors
/// (`# yaml-language-server: $schema=…`) and for checking files where `policy` is not installed.
enum SchemaCommand {
    static let plugin = Option.plugin(help: "Declare a host plugin so the schema offers its name. Repeatable.")
    static let listPlugins = Option.flag(
        ["--list-plugins"], help: "Print the reference of every built-in plugin's options (Markdown) and exit.")

    static let spec = CommandSpec(
        name: "schema",
        summary: "Print the JSON Schema (draft 2020-12) of the policy file, for editor completion.",
        options: [plugin.declaration, listPlugins.declaration],
        exitCodes: [(0, "the schema was printed"), (64, "usage error")])

    static func run(_ arguments: ParsedArguments, output: CommandOutput) throws(UsageError) -> Int32 {
        if let extra = arguments.positional.first {
            throw UsageError(message: "Unexpected argument '\(extra)'")
        }
        if arguments[listPlugins] {
            output.stdout(PluginOptionsReference.markdown())
            return ExitCode.success
        }
        let catalog = try catalog(from: arguments[plugin])
        output.stdout(PolicySchema.json(catalog: catalog))
        return ExitCode.success
    }
}
