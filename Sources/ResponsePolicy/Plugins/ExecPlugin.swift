import Dispatch
import Foundation

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// The `exec` refresh and logout plugins: run a credential command (argv, no shell) that speaks
/// JSON, so ops can plug in any credential mechanism (a company SSO tool, a vault agent, a cloud
/// CLI) without recompiling the service.
///
/// The contract follows AWS `credential_process`, kubectl's exec credential plugins and git's
/// credential helpers:
///
/// - **Invocation**: `command:` is the argv, run directly (never through a shell, so nothing is
///   expanded or split). `command[0]` is an absolute path, or a name looked up in `PATH`; a
///   command that cannot be found fails when the plugin is made, i.e. at start.
/// - **Environment**: only the variables listed in `env:` are passed, with their values from the
///   engine's environment; nothing else leaks into the command.
/// - **Input**: one JSON object on stdin, then EOF:
///   `{"version":1,"kind":"refresh","reason":"token-expired","credentials":{"expires_at":"…","has_refresh_token":true}}`.
///   `reason` is the rule that triggered the refresh, `ahead`, or `sign-in` (no credentials yet).
///   `credentials` is absent when there are none. The refresh token is added
///   (`"refresh_token":"…"`) only with `pass-refresh-token: true`; the access token never is.
///   A logout gets `{"version":1,"kind":"logout","reason":"forced-logout",…}`.
/// - **Output** (refresh): one JSON object on stdout, at most 1 MiB:
///   `{"access_token":"…","refresh_token":"…","expires_in":3600}` (or `"expires_at":"RFC 3339"`);
///   only `access_token` is required. Without a new `refresh_token` the old one is kept.
///   A logout's output is ignored.
/// - **Errors**: a non-zero exit status, a timeout (`timeout:`, `10s` by default; the command is
///   killed), or output that is not such an object fails the refresh. The reason quotes the first
///   line of stderr (at most 200 characters) with anything token-like replaced by `<redacted>`:
///   the current tokens and any run of 20 or more token characters.
/// - **Caching**: the engine calls the command only when it needs a token (a refresh trigger, a
///   token expiring within `refresh.ahead`, no credentials at all) and keeps the answer in its
///   credential store, so the command does not need a cache of its own.
///
/// ```yaml
/// refresh:
///   use: exec
///   with:
///     command: [/usr/local/bin/get-token, --audience, api]
///     timeout: 10s
///     env: [HOME, PATH]
///     pass-refresh-token: false
/// ```
///
/// Concurrency contract: immutable and `Sendable`. Each call starts one process; cancelling the
/// calling task (the engine's `refresh.timeout`) kills it. The timeout is wall-clock time, since
/// the command is a real process.
public struct ExecRefresh: RefreshPlugin, CustomStringConvertible {
    let command: ExecCommand

    /// Makes the plugin from a policy's `with:` options.
    ///
    /// - Throws: ``PluginError`` when `command` is missing or cannot be found, or `timeout` is
    ///   not a duration.
    init(configuration: PluginConfiguration) throws(PluginError) {
        command = try ExecCommand(configuration, kind: .refresh, defaultTimeout: .seconds(10))
    }

    /// A credential command gets credentials with nothing stored.
    public var canSignIn: Bool { true }

    public var description: String { "ExecRefresh(\(command.arguments.first ?? ""))" }

    /// Runs the command and reads the new credentials from its output.
    ///
    /// - Throws: ``RefreshFailure`` as described on the type; `CancellationError` when cancelled.
    public func refresh(_ context: RefreshContext) async throws -> Credentials {
        let input = command.input(kind: "refresh", reason: context.reason, credentials: context.credentials)
        let (output, stderrLine) = try await command.run(input: input, credentials: context.credentials)
        // Bad output is reported with what the command said on stderr, as a failed exit is.
        func failure(_ text: String) -> RefreshFailure {
            RefreshFailure("the credential command's " + text + (stderrLine.isEmpty ? "" : ": \(stderrLine)"))
        }
        guard let object = TokenEndpoint.jsonObject(output) else { throw failure("output is not a JSON object") }
        guard let accessToken = object["access_token"] as? String, !accessToken.isEmpty else {
            throw failure("output has no 'access_token'")
        }
        var refreshToken = context.credentials?.refreshToken
        if let value = object["refresh_token"], !(value is NSNull) {
            guard let text = value as? String else { throw failure("'refresh_token' is not a text") }
            if !text.isEmpty { refreshToken = text }
        }
        var expiresAt: Date?
        if let value = object["expires_in"], !(value is NSNull) {
            guard let seconds = TokenEndpoint.seconds(value) else {
                throw failure("'expires_in' is not a number of seconds")
            }
            expiresAt = context.clock.date.addingTimeInterval(seconds)
        } else if let value = object["expires_at"], !(value is NSNull) {
            guard let text = value as? String, let date = ExecCommand.date(text) else {
                throw failure("'expires_at' is not an RFC 3339 time")
            }
            expiresAt = date
        }
        return Credentials(accessToken: accessToken, refreshToken: refreshToken, expiresAt: expiresAt)
    }
}

/// The `exec` logout plugin: runs a command when the session ends (revoke a token, clear a
/// keychain entry). Its input is described on ``ExecRefresh``; its output and exit status are
/// ignored, and it is killed at `timeout` (`5s` by default).
public struct ExecLogout: LogoutPlugin {
    let command: ExecCommand

    init(configuration: PluginConfiguration) throws(PluginError) {
        command = try ExecCommand(configuration, kind: .logout, defaultTimeout: .seconds(5))
    }

    public func logout(_ context: LogoutContext) async {
        let input = command.input(kind: "logout", reason: context.reason, credentials: context.credentials)
        _ = try? await command.run(input: input, credentials: context.credentials)
    }
}

/// One configured command: what both `exec` plugins run.
struct ExecCommand: Sendable {
    /// The argv; `arguments[0]` is the resolved executable path.
    let arguments: [String]
    let environment: [String: String]
    let timeout: Duration
    let passRefreshToken: Bool

    static let maxOutputBytes = 1 << 20
    static let maxStderrLine = 200

    init(_ configuration: PluginConfiguration, kind: PluginKind, defaultTimeout: Duration) throws(PluginError) {
        func failure(_ reason: String) -> PluginError {
            PluginError(kind: kind, name: configuration.name, reason: reason)
        }
        guard case .list(let items)? = configuration.options["command"] else {
            throw failure("the option 'command' must be a list: the program, then its arguments")
        }
        var argv: [String] = []
        for item in items {
            guard let text = item.string else { throw failure("the option 'command' must be a list of texts") }
            argv.append(text)
        }
        guard let program = argv.first, !program.isEmpty else { throw failure("the option 'command' is empty") }
        var environment: [String: String] = [:]
        switch configuration.options["env"] {
        case nil: break
        case .list(let names)?:
            for name in names {
                guard let name = name.string else { throw failure("the option 'env' must be a list of names") }
                if let value = configuration.environment[name] { environment[name] = value }
            }
        case .some: throw failure("the option 'env' must be a list of environment variable names")
        }
        var timeout = defaultTimeout
        if let text = configuration.string("timeout") {
            guard let parsed = Duration.parsePolicy(text), parsed > .zero else {
                throw failure("the option 'timeout' is not a duration like 10s")
            }
            timeout = parsed
        }
        var passRefreshToken = false
        switch configuration.options["pass-refresh-token"] {
        case nil: break
        case .bool(let flag)?: passRefreshToken = flag
        case .some: throw failure("the option 'pass-refresh-token' must be true or false")
        }
        guard let path = Self.resolve(program, path: environment["PATH"] ?? configuration.environment["PATH"]) else {
            throw failure(
                program.contains("/")
                    ? "the command '\(program)' does not exist or is not executable"
                    : "the command '\(program)' is not found in PATH")
        }
        argv[0] = path
        arguments = argv
        self.environment = environment
        self.timeout = timeout
        self.passRefreshToken = passRefreshToken
    }

    /// `program` as an executable path: itself when it has a slash, else the first match in `path`.
    static func resolve(_ program: String, path: String?) -> String? {
        let files = FileManager.default
        func executable(_ candidate: String) -> Bool {
            var isDirectory: ObjCBool = false
            return files.fileExists(atPath: candidate, isDirectory: &isDirectory) && !isDirectory.boolValue
                && files.isExecutableFile(atPath: candidate)
        }
        if program.contains("/") { return executable(program) ? program : nil }
        for directory in (path ?? "").split(separator: ":") where !directory.isEmpty {
            let candidate = directory + "/" + program
            if executable(candidate) { return candidate }
        }
        return nil
    }

    /// The JSON the command reads on stdin.
    func input(kind: String, reason: String, credentials: Credentials?) -> Data {
        var json = "{\"version\":1,\"kind\":" + PolicyEvent.quote(kind) + ",\"reason\":" + PolicyEvent.quote(reason)
        if let credentials {
            var fields: [String] = []
            if let expiresAt = credentials.expiresAt {
                fields.append("\"expires_at\":" + PolicyEvent.quote(ISO8601DateFormatter().string(from: expiresAt)))
            }
            fields.append("\"has_refresh_token\":\(credentials.refreshToken != nil)")
            if passRefreshToken, let token = credentials.refreshToken {
                fields.append("\"refresh_token\":" + PolicyEvent.quote(token))
            }
            json += ",\"credentials\":{" + fields.joined(separator: ",") + "}"
        }
        return Data((json + "}\n").utf8)
    }

    /// An RFC 3339 time, with or without fractional seconds.
    static func date(_ text: String) -> Date? {
        let formatter = ISO8601DateFormatter()
        if let date = formatter.date(from: text) { return date }
        formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        return formatter.date(from: text)
    }

    /// Runs the command with `input` on stdin; returns its stdout, and the first line of its
    /// stderr redacted, when it exits with status 0.
    ///
    /// - Throws: ``RefreshFailure`` (start failure, timeout, non-zero status, too much output),
    ///   `CancellationError` when the task is cancelled (the process is killed).
    func run(input: Data, credentials: Credentials?) async throws -> (stdout: Data, stderrLine: String) {
        let run = CommandRun(self)
        let result = await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<CommandRun.Result, Never>) in
                run.start(input: input) { continuation.resume(returning: $0) }
            }
        } onCancel: {
            run.cancel()
        }
        let program = (arguments.first ?? "").split(separator: "/").last.map(String.init) ?? ""
        func reason(_ text: String) -> String {
            let line = redact(result.stderrFirstLine, credentials)
            return "the credential command '\(program)' \(text)" + (line.isEmpty ? "" : ": \(line)")
        }
        switch result.end {
        case .cancelled: throw CancellationError()
        case .failedToStart: throw RefreshFailure("the credential command '\(program)' could not be started")
        // A hung or killed command is trouble that may pass (transient: retried within
        // refresh.timeout, never a logout); a command that exits non-zero has said no (definitive).
        case .timedOut:
            throw RefreshFailure(reason("took longer than \(timeout.policyText) and was killed"), kind: .transient)
        case .outputTooLarge: throw RefreshFailure(reason("wrote more than 1 MiB"))
        case .exited(let status) where status != 0: throw RefreshFailure(reason("exited with status \(status)"))
        case .signalled(let signal):
            throw RefreshFailure(reason("was killed by signal \(signal)"), kind: .transient)
        case .exited: return (result.stdout, redact(result.stderrFirstLine, credentials))
        }
    }

    /// `line` with the current tokens and any run of 20 or more token characters replaced.
    func redact(_ line: String, _ credentials: Credentials?) -> String {
        var text = line
        for token in [credentials?.accessToken, credentials?.refreshToken].compactMap({ $0 }) where token.count >= 4 {
            text = text.replacingOccurrences(of: token, with: "<redacted>")
        }
        var out = ""
        var run = ""
        func flush() {
            out += run.count >= 20 ? "<redacted>" : run
            run = ""
        }
        for character in text {
            if character.isASCII, character.isLetter || character.isNumber || "-_.~+/=".contains(character) {
                run.append(character)
            } else {
                flush()
                out.append(character)
            }
        }
        flush()
        return out
    }
}

/// One process: its pipes, its readers and how it ended.
///
/// Concurrency contract: `start` once; `cancel` from any thread, any number of times. The
/// completion is called exactly once, on a dispatch thread, never on the cooperative pool, since
/// waiting for a process blocks.
final class CommandRun: Sendable {
    enum End: Sendable {
        case exited(Int32)
        case signalled(Int32)
        case timedOut
        case cancelled
        case failedToStart
        case outputTooLarge
    }

    struct Result: Sendable {
        var end: End
        var stdout = Data()
        var stderrFirstLine = ""
    }

    private struct State {
        var process: Process?
        var cancelled = false
    }

    private let command: ExecCommand
    private let state = Locked(State())

    init(_ command: ExecCommand) { self.command = command }

    func cancel() {
        let process = state.withLock { state -> Process? in
            state.cancelled = true
            return state.process
        }
        if let process, process.isRunning { kill(process.processIdentifier, SIGKILL) }
    }

    func start(input: Data, completion: @escaping @Sendable (Result) -> Void) {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: command.arguments[0])
        process.arguments = Array(command.arguments.dropFirst())
        process.environment = command.environment
        let stdin = Pipe()
        let stdout = Pipe()
        let stderr = Pipe()
        process.standardInput = stdin
        process.standardOutput = stdout
        process.standardError = stderr
        let exited = DispatchSemaphore(value: 0)
        process.terminationHandler = { _ in exited.signal() }
        let cancelledBefore = state.withLock { state -> Bool in
            if !state.cancelled { state.process = process }
            return state.cancelled
        }
        if cancelledBefore { return completion(Result(end: .cancelled)) }
        do {
            try process.run()
        } catch {
            return completion(Result(end: .failedToStart))
        }
        // A cancel between taking the process and starting it found nothing running to kill.
        if state.withLock({ $0.cancelled }) { kill(process.processIdentifier, SIGKILL) }
        // Our copies of the child's ends, so EOF arrives when the child (and its children) close theirs.
        try? stdout.fileHandleForWriting.close()
        try? stderr.fileHandleForWriting.close()
        try? stdin.fileHandleForReading.close()
        let readers = DispatchGroup()
        let output = Locked(Data())
        let errors = Locked(Data())
        let overflow = Locked(false)
        Self.read(stdout.fileHandleForReading, into: output, limit: ExecCommand.maxOutputBytes, overflow, readers)
        Self.read(stderr.fileHandleForReading, into: errors, limit: 4096, nil, readers)
        Self.write(input, to: stdin.fileHandleForWriting)
        let deadline = DispatchTime.now() + .nanoseconds(Int(command.timeout.wholeNanoseconds))
        let state = self.state
        DispatchQueue.global().async {
            var end: End
            if exited.wait(timeout: deadline) == .timedOut {
                kill(process.processIdentifier, SIGKILL)
                exited.wait()
                end = state.withLock { $0.cancelled } ? .cancelled : .timedOut
            } else if state.withLock({ $0.cancelled }) {
                end = .cancelled
            } else if process.terminationReason == .uncaughtSignal {
                end = .signalled(process.terminationStatus)
            } else {
                end = .exited(process.terminationStatus)
            }
            // The output ends when every holder of the pipes closed them; a grandchild that keeps
            // them open cannot hold the refresh past the timeout.
            if readers.wait(timeout: max(deadline, .now() + .milliseconds(100))) == .timedOut, case .exited = end {
                end = .timedOut
            }
            if overflow.withLock({ $0 }), case .exited = end { end = .outputTooLarge }
            let line =
                String(decoding: errors.withLock { $0 }, as: UTF8.self)
                .split(whereSeparator: \.isNewline).first.map { String($0.prefix(ExecCommand.maxStderrLine)) } ?? ""
            completion(Result(end: end, stdout: output.withLock { $0 }, stderrFirstLine: line))
        }
    }

    /// Reads `handle` to EOF on a dispatch thread, keeping at most `limit` bytes.
    private static func read(
        _ handle: FileHandle, into buffer: Locked<Data>, limit: Int, _ overflow: Locked<Bool>?, _ group: DispatchGroup
    ) {
        group.enter()
        DispatchQueue.global().async {
            defer {
                try? handle.close()
                group.leave()
            }
            while true {
                let chunk = handle.availableData
                if chunk.isEmpty { return }
                let full = buffer.withLock { data -> Bool in
                    let room = limit - data.count
                    if room > 0 { data.append(chunk.prefix(room)) }
                    return chunk.count > room
                }
                if full { overflow?.withLock { $0 = true } }
            }
        }
    }

    /// Writes `data` and closes the pipe, on a thread with SIGPIPE blocked: a command that exits
    /// without reading its input must not kill the host with SIGPIPE.
    private static func write(_ data: Data, to handle: FileHandle) {
        let thread = Thread {
            let descriptor = handle.fileDescriptor
            #if canImport(Darwin)
                // Darwin has a per-descriptor switch (and no sigtimedwait).
                _ = fcntl(descriptor, F_SETNOSIGPIPE, 1)
            #else
                var blocked = sigset_t()
                sigemptyset(&blocked)
                sigaddset(&blocked, SIGPIPE)
                pthread_sigmask(SIG_BLOCK, &blocked, nil)
            #endif
            data.withUnsafeBytes { bytes in
                guard let base = bytes.baseAddress else { return }
                var offset = 0
                while offset < bytes.count {
                    let written = systemWrite(descriptor, base + offset, bytes.count - offset)
                    if written <= 0 {
                        if written < 0 && errno == EINTR { continue }
                        break
                    }
                    offset += written
                }
            }
            try? handle.close()
            #if !canImport(Darwin)
                // Take a SIGPIPE this write raised, so it is not delivered to the process later.
                var pending = sigset_t()
                sigpending(&pending)
                if sigismember(&pending, SIGPIPE) == 1 {
                    var zero = timespec(tv_sec: 0, tv_nsec: 0)
                    _ = sigtimedwait(&blocked, nil, &zero)
                }
            #endif
        }
        thread.start()
    }
}

extension Duration {
    /// Whole nanoseconds, for `DispatchTime`.
    var wholeNanoseconds: Int64 {
        let (seconds, attoseconds) = components
        return seconds * 1_000_000_000 + attoseconds / 1_000_000_000
    }
}

/// `write(2)`, named so it does not clash with the methods called `write` around it.
private func systemWrite(_ descriptor: Int32, _ buffer: UnsafeRawPointer, _ count: Int) -> Int {
    write(descriptor, buffer, count)
}
