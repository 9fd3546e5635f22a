import ResponsePolicy

enum FetchCommand {
    static let spec = CommandSpec(
        name: "fetch", overview: "Send real HTTP requests through the engine and the URLSession transport.",
        usage: "policy fetch --policy FILE [--credentials FILE] [--concurrency N] [--count M] [-X METHOD] [-H 'K: V']... [-d BODY] URL",
        arguments: [("URL", "The URL to request.")],
        options: [])

    static func run(_ arguments: ParsedArguments, output: CommandOutput) async throws(UsageError) -> Int32 {
        throw UsageError(message: "fetch is not available yet")
    }
}
