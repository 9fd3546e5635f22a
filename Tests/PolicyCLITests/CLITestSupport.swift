import Foundation
import ResponsePolicy
import TestSupport
import Testing

@testable import PolicyCLI

/// Why running the `policy` binary did not produce a result.
enum CLITestError: Error, CustomStringConvertible {
    case binaryNotFound(searched: [String])
    case timedOut(arguments: [String], seconds: Int)

    var description: String {
        switch self {
        case .binaryNotFound(let searched):
            return "the 'policy' binary was not found (looked in: \(searched.joined(separator: ", "))); "
                + "run 'swift build' first, or set POLICY_BINARY to its path"
        case .timedOut(let arguments, let seconds):
            return "'policy \(arguments.joined(separator: " "))' did not finish within \(seconds)s and was killed"
        }
    }
}

/// What one run of the binary produced.
struct CLIResult: Sendable, Equatable {
    var stdout: String
    var stderr: String
    /// The exit code, or the signal number when ``crashed``.
    var status: Int32
    /// Whether the process died from a signal (a crash or a trap) instead of exiting.
    var crashed = false

    var stdoutLines: [String] {
        stdout.split(separator: "\n", omittingEmptySubsequences: false).dropLast().map(String.init)
    }
}

/// The built `policy` executable.
///
/// `swift test` builds it next to the test product: on Linux the tests run from
/// `.build/<triple>/debug/ResponsePolicyPackageTests.xctest`, on macOS from inside the `.xctest`
/// bundle, so the binary is in the bundle's folder (or that folder's parent); `<root>/.build/debug/policy`
/// is the last resort. `POLICY_BINARY`, when set, replaces the search.
let policyBinary: Result<URL, CLITestError> = {
    var candidates: [URL] = []
    if let override = ProcessInfo.processInfo.environment["POLICY_BINARY"], !override.isEmpty {
        candidates.append(URL(fileURLWithPath: override))
    } else {
        let bundle = Bundle.main.bundleURL
        candidates.append(bundle.appendingPathComponent("policy"))
        candidates.append(bundle.deletingLastPathComponent().appendingPathComponent("policy"))
        if let executable = Bundle.main.executableURL {
            candidates.append(executable.deletingLastPathComponent().appendingPathComponent("policy"))
        }
        candidates.append(repositoryRoot.appendingPathComponent(".build/debug/policy"))
    }
    for candidate in candidates {
        var isDirectory: ObjCBool = false
        if FileManager.default.fileExists(atPath: candidate.path, isDirectory: &isDirectory), !isDirectory.boolValue,
            FileManager.default.isExecutableFile(atPath: candidate.path)
        {
            return .success(candidate)
        }
    }
    return .failure(.binaryNotFound(searched: candidates.map(\.path)))
}()

/// Collects a pipe's bytes on a thread of its own, so neither pipe can fill up and block the child.
///
/// The bytes sit in the library's pthread-backed `Locked`, not `Synchronization.Mutex`, so the
/// suite stays clean under ThreadSanitizer (which does not see Mutex's futex on Linux).
///
/// A dedicated `Thread`, not a Dispatch queue: the read blocks until end of file, and blocking
/// reads from many parallel tests must not starve a shared thread pool.
private final class PipeDrain: Sendable {
    private let data = Locked(Data())
    private let done = DispatchSemaphore(value: 0)

    init(_ handle: FileHandle) {
        Thread.detachNewThread { [self] in
            let bytes = handle.readDataToEndOfFile()
            data.withLock { $0 = bytes }
            done.signal()
        }
    }

    /// Waits until end of file or `deadline`; `false` when the deadline came first.
    func wait(until deadline: DispatchTime) -> Bool {
        guard done.wait(timeout: deadline) == .success else { return false }
        done.signal()
        return true
    }

    /// Waits for end of file and returns what was read, as UTF-8 (invalid bytes replaced).
    func text() -> String {
        done.wait()
        done.signal()
        return data.withLock { String(decoding: $0, as: UTF8.self) }
    }
}

/// Runs the built binary with `arguments` in `directory` (the repository root by default).
///
/// Both pipes are drained concurrently before waiting for the exit, so a chatty child never
/// deadlocks on a full pipe. A child still running after `timeout` seconds (60 by default: a
/// bound for a hang, not for speed; 20 was met by a tiny lint at the busy end of a full run on 2
/// cores) is killed and the call throws ``CLITestError/timedOut(arguments:seconds:)``: a hang
/// fails the test, it never stalls the suite.
///
/// The child runs on a thread of its own, never on one of the concurrency pool's few threads
/// (2 on a 2-core CI machine): many tests blocked there starved the suites that need the pool to
/// make progress, and the simulation scheduler's tests counted a pool that did not answer as a
/// deadlock.
func runPolicy(_ arguments: [String], in directory: URL? = nil, timeout: Int = 60) async throws -> CLIResult {
    try await runExecutable(try policyBinary.get(), arguments, in: directory, timeout: timeout)
}

/// Runs `body`, which blocks, on a thread of its own and waits for it without holding a pool thread.
func offPool<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { continuation in
        Thread.detachNewThread { continuation.resume(with: Result { try body() }) }
    }
}

/// ``runPolicy(_:in:timeout:)`` for any built executable of the package (`policy-bench`).
/// `environment`, when given, replaces the child's whole environment (`[:]` for an empty one).
func runExecutable(
    _ executable: URL, _ arguments: [String], in directory: URL? = nil, timeout: Int = 60,
    environment: [String: String]? = nil
) async throws -> CLIResult {
    try await offPool {
        try runExecutableBlocking(executable, arguments, in: directory, timeout: timeout, environment: environment)
    }
}

private func runExecutableBlocking(
    _ executable: URL, _ arguments: [String], in directory: URL?, timeout: Int, environment: [String: String]?
) throws -> CLIResult {
    let process = Process()
    process.executableURL = executable
    process.arguments = arguments
    if let environment { process.environment = environment }
    process.currentDirectoryURL = directory ?? repositoryRoot
    let stdoutPipe = Pipe()
    let stderrPipe = Pipe()
    process.standardOutput = stdoutPipe
    process.standardError = stderrPipe
    process.standardInput = FileHandle.nullDevice
    // `run()` closes the parent's copies of the write ends, so end of file arrives at exit.
    try process.run()
    let stdoutDrain = PipeDrain(stdoutPipe.fileHandleForReading)
    let stderrDrain = PipeDrain(stderrPipe.fileHandleForReading)

    let deadline = DispatchTime.now() + .seconds(timeout)
    var finished = stdoutDrain.wait(until: deadline) && stderrDrain.wait(until: deadline)
    if !finished, !process.isRunning {
        // The child ended, and this thread woke at the deadline before the drains saw end of
        // file: a starved test process, not a hang (CI saw tiny lints "time out" at the end of a
        // full run, with every test of the moment finishing at the same instant). Its pipes close
        // with it: the drains end at once.
        let grace = DispatchTime.now() + .seconds(10)
        finished = stdoutDrain.wait(until: grace) && stderrDrain.wait(until: grace)
    }
    if !finished {
        // `Process` starts the child in a process group of its own: kill the group, so nothing
        // the child started keeps the pipes open.
        kill(-process.processIdentifier, SIGKILL)
        kill(process.processIdentifier, SIGKILL)
    }
    let stdout = stdoutDrain.text()
    let stderr = stderrDrain.text()
    process.waitUntilExit()
    guard finished else { throw CLITestError.timedOut(arguments: arguments, seconds: timeout) }
    return CLIResult(
        stdout: stdout, stderr: stderr, status: process.terminationStatus,
        crashed: process.terminationReason == .uncaughtSignal)
}

/// Runs the command in-process, through `PolicyCommand.run`, capturing what it writes.
func runInProcess(_ arguments: [String], isTerminal: Bool = false, noColor: Bool = false) async -> CLIResult {
    let stdout = Locked("")
    let stderr = Locked("")
    let output = CommandOutput(
        stdout: { text in stdout.withLock { $0 += text } },
        stderr: { text in stderr.withLock { $0 += text } },
        isTerminal: isTerminal, noColor: noColor)
    let status = await PolicyCommand.run(arguments, output: output)
    return CLIResult(stdout: stdout.withLock { $0 }, stderr: stderr.withLock { $0 }, status: status)
}

/// A fresh folder under the system's temporary directory, removed when the last reference goes.
final class TemporaryDirectory: Sendable {
    let url: URL

    init() throws {
        url = FileManager.default.temporaryDirectory
            .appendingPathComponent("policy-cli-tests-\(UUID().uuidString)", isDirectory: true)
        try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    }

    deinit {
        try? FileManager.default.removeItem(at: url)
    }

    /// Writes `text` to `name` (a relative path; folders are created) and returns the file's URL.
    @discardableResult
    func write(_ name: String, _ text: String) throws -> URL {
        try write(name, bytes: Data(text.utf8))
    }

    /// Writes raw bytes to `name` (a relative path; folders are created) and returns the file's URL.
    @discardableResult
    func write(_ name: String, bytes: Data) throws -> URL {
        let file = url.appendingPathComponent(name)
        try FileManager.default.createDirectory(
            at: file.deletingLastPathComponent(), withIntermediateDirectories: true)
        try bytes.write(to: file)
        return file
    }

    /// Creates an empty folder at `name`.
    func makeFolder(_ name: String) throws {
        try FileManager.default.createDirectory(
            at: url.appendingPathComponent(name), withIntermediateDirectories: true)
    }
}

/// Expects a run to match exactly, reporting at the caller's line.
func expectResult(
    _ result: CLIResult, stdout: String, stderr: String = "", status: Int32,
    sourceLocation: SourceLocation = #_sourceLocation
) {
    #expect(result.stdout == stdout, sourceLocation: sourceLocation)
    #expect(result.stderr == stderr, sourceLocation: sourceLocation)
    #expect(result.status == status, sourceLocation: sourceLocation)
    #expect(!result.crashed, "the process died from signal \(result.status)", sourceLocation: sourceLocation)
}

/// Every `*.yaml` and `*.yml` file under `folder` (relative to the repository root), recursively,
/// as paths relative to the root, sorted. An absent folder has none.
func yamlFiles(under folder: String) -> [String] {
    let base = repositoryRoot.appendingPathComponent(folder)
    guard let enumerator = FileManager.default.enumerator(atPath: base.path) else { return [] }
    var files: [String] = []
    while let entry = enumerator.nextObject() as? String {
        // As `policy lint` does: hidden folders (an example package's .build) hold no policies.
        if entry.split(separator: "/").contains(where: { $0.hasPrefix(".") }) { continue }
        guard entry.hasSuffix(".yaml") || entry.hasSuffix(".yml") else { continue }
        var isDirectory: ObjCBool = false
        let full = base.appendingPathComponent(entry).path
        if FileManager.default.fileExists(atPath: full, isDirectory: &isDirectory), !isDirectory.boolValue {
            files.append(folder + "/" + entry)
        }
    }
    return files.sorted()
}

/// Where the `doc` link of a finding points when the binary runs from this checkout's build
/// folder: this checkout's docs/lint-rules.md, as a `file://` URL (see `DocumentationLinks`).
func lintRuleDoc(_ rule: String) -> String {
    let docs = repositoryRoot.resolvingSymlinksInPath().appendingPathComponent("docs").absoluteString
    return (docs.hasSuffix("/") ? docs : docs + "/") + "lint-rules.md#" + rule
}

/// The usage-error text every command prints: message, usage line, pointer to help.
func usageError(_ message: String, usage: String, help: String) -> String {
    "Error: \(message)\nUsage: \(usage)\n  See '\(help)' for more information.\n"
}

/// Usage lines are built from each command's declared options and arguments.
let lintUsage =
    "policy lint [--format text|json|sarif|github] [--strict] [--disable RULE]... [--exclude GLOB]... [--list-rules] "
    + "[--plugin KIND:NAME]... [--plugins FILE] [--check-env] [--color auto|always|never] PATH..."
let topUsage = "policy <subcommand> [options]"

/// What `policy explain` says of a policy, as the library writes it before wrapping: where a test
/// reads its sentences. The binary prints the same text wrapped at the terminal's width, 80 when
/// not a terminal (`GraphExplainCommandTests` checks the two agree).
func explanation(of yaml: String, file: String? = nil) throws -> String {
    PolicyExplainer.explain(try Policy.load(yaml: yaml, file: file), width: nil)
}

/// ``explanation(of:file:)`` of a policy file.
func explanation(ofFile path: String) throws -> String {
    PolicyExplainer.explain(try Policy.load(path: path, owner: .anyone), width: nil)
}
