import Foundation
import ResponsePolicy

/// `policy fetch --metrics FILE` and `--metrics-listen HOST:PORT`: the engine's metrics
/// (``PolicyMetrics``) written when the run ends, and served while it runs.
///
/// Both are checked before anything is sent (a file that cannot be written, an address that
/// cannot be bound: exit 73, nothing sent), as the credentials file is.
struct FetchMetrics {
    static let file = Option.value(
        ["--metrics"], "file",
        help: "Write the engine's metrics (Prometheus text format) to this file when the run ends (atomically).")
    static let listen: Option<String?> = {
        var option = Option.value(
            ["--metrics-listen"], "address",
            help: "Serve the metrics on http://ADDRESS/metrics while the run lasts; ADDRESS is HOST:PORT with an "
                + "IPv4 host, like 127.0.0.1:9464 (port 0: a free one, printed on stderr).")
        option.declaration.check = { text in
            MetricsServer.parse(text) == nil
                ? "Invalid value '\(text)' for '--metrics-listen <address>'; expected HOST:PORT with an IPv4 host, "
                    + "like 127.0.0.1:9464" : nil
        }
        return option
    }()

    let metrics: PolicyMetrics
    let server: MetricsServer?
    let path: String?

    /// The metrics the command line asks for, their file checked and their server listening;
    /// `nil` when it asks for none, or the exit status when one cannot be had.
    static func start(_ arguments: ParsedArguments, policy: Policy, output: CommandOutput) -> Result<Self?, ExitStatus>
    {
        let path = arguments[file]
        let address = arguments[listen].flatMap(MetricsServer.parse)
        guard path != nil || address != nil else { return .success(nil) }
        if let path {
            // Created now, so a path that cannot be written stops the run before anything is sent.
            var isFolder: ObjCBool = false
            let folder = FileManager.default.fileExists(atPath: path, isDirectory: &isFolder) && isFolder.boolValue
            guard !folder, FileManager.default.createFile(atPath: path, contents: nil) || isWritable(path) else {
                output.stderr("error: cannot write the metrics file '\(path)'; nothing was sent\n")
                return .failure(ExitStatus(code: ExitCode.cannotCreate))
            }
        }
        let metrics = PolicyMetrics(policy: policy)
        var server: MetricsServer?
        if let address {
            do {
                server = try MetricsServer.start(address, metrics: metrics)
            } catch {
                output.stderr("error: \(error); nothing was sent\n")
                return .failure(ExitStatus(code: ExitCode.cannotCreate))
            }
            output.stderr("policy: serving metrics at \(server?.url ?? "")\n")
        }
        return .success(FetchMetrics(metrics: metrics, server: server, path: path))
    }

    struct ExitStatus: Error {
        var code: Int32
    }

    /// Stops the server and writes the file (a temporary file renamed over it, so a reader such
    /// as node_exporter's textfile collector never sees half of it). `false` when it could not
    /// be written, said on stderr.
    func finish(output: CommandOutput) -> Bool {
        server?.stop()
        guard let path else { return true }
        let url = URL(fileURLWithPath: path)
        let temporary = url.deletingLastPathComponent().appendingPathComponent(
            ".\(url.lastPathComponent).\(ProcessInfo.processInfo.processIdentifier).tmp")
        do {
            try Data(metrics.exposition(.prometheus).utf8).write(to: temporary)
            guard rename(temporary.path, path) == 0 else {
                throw CocoaError(
                    .fileWriteUnknown, userInfo: [NSLocalizedDescriptionKey: String(cString: strerror(errno))])
            }
            return true
        } catch {
            try? FileManager.default.removeItem(at: temporary)
            output.stderr("error: cannot write the metrics file '\(path)': \(error.localizedDescription)\n")
            return false
        }
    }

    private static func isWritable(_ path: String) -> Bool {
        FileManager.default.isWritableFile(atPath: path)
    }
}
