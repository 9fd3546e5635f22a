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
/// - **Process**: the command leads a session and process group of its own and inherits only
///   stdin, stdout and stderr (no other descriptor of the host). At the timeout (`timeout:`,
///   `10s` by default), on cancellation and once the command exits, its group is killed, then
///   every process still in its session and every process holding its output pipes (a daemon
///   that called `setsid` and kept stdout): a wrapper script and what it started never outlive
///   the call. Once the command has exited, what it wrote is read and an end of file is waited
///   for at most 250 ms, so a descendant holding the pipes cannot make an answered call wait for
///   the timeout. Only a descendant that left the session *and* closed the pipes is detached
///   for good. The command has no controlling terminal, so it cannot prompt.
/// - **Errors**: a non-zero exit status, a timeout, or output that is not such an object fails the
///   refresh. The reason quotes the first line of stderr (at most 200 characters) made safe:
///   every value of the credential set replaced by `<redacted>` whatever its length (the current
///   tokens, the secret-named `env:` values, the secret-named fields of the command's output; as
///   written, percent-encoded or JSON-escaped), and any part of 8 or more characters of one of
///   them (`${RT#RT-}` printed most of a refresh token), any run of 20 or more token characters
///   too, and control characters such as ANSI escape sequences written as `\u{1B}`.
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
/// Concurrency contract: immutable and `Sendable`. Each call starts one process group; cancelling
/// the calling task (the engine's `refresh.timeout`) kills it. The timeout is wall-clock time,
/// since the command is a real process.
package struct ExecRefresh: RefreshPlugin, CustomStringConvertible {
    let command: ExecCommand

    /// Makes the plugin from a policy's `with:` options.
    ///
    /// - Throws: ``PluginError`` when `command` is missing or cannot be found, or `timeout` is
    ///   not a duration.
    init(configuration: PluginConfiguration) throws(PluginError) {
        command = try ExecCommand(configuration, kind: .refresh, defaultTimeout: .seconds(10))
    }

    /// A credential command gets credentials with nothing stored.
    package var canSignIn: Bool { true }

    package var description: String { "ExecRefresh(\(command.arguments.first ?? ""))" }

    /// Runs the command and reads the new credentials from its output.
    ///
    /// - Throws: ``RefreshFailure`` as described on the type; `CancellationError` when cancelled.
    package func refresh(_ context: RefreshContext) async throws -> Credentials {
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
package struct ExecLogout: LogoutPlugin {
    let command: ExecCommand

    init(configuration: PluginConfiguration) throws(PluginError) {
        command = try ExecCommand(configuration, kind: .logout, defaultTimeout: .seconds(5))
    }

    package func logout(_ context: LogoutContext) async {
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
    /// stderr made safe to show, when it exits with status 0.
    ///
    /// - Throws: ``RefreshFailure`` (start failure, timeout, non-zero status, too much output),
    ///   `CancellationError` when the task is cancelled (the process group is killed).
    func run(input: Data, credentials: Credentials?) async throws -> (stdout: Data, stderrLine: String) {
        var result: CommandRun.Result
        var busy = 0
        while true {
            let run = CommandRun(self)
            result = await withTaskCancellationHandler {
                await withCheckedContinuation { (continuation: CheckedContinuation<CommandRun.Result, Never>) in
                    run.start(input: input) { continuation.resume(returning: $0) }
                }
            } onCancel: {
                run.cancel()
            }
            // ETXTBSY: the program file was just written and another process forked while it was
            // still open for writing (a deploy that installs a credential helper and runs it at
            // once). It passes when that fork execs or exits: started again a few times.
            guard case .failedToStart(let code) = result.end, code == ETXTBSY, busy < 5, !Task.isCancelled else {
                break
            }
            busy += 1
            try? await Task.sleep(for: .milliseconds(10 * busy))
        }
        let program = (arguments.first ?? "").split(separator: "/").last.map(String.init) ?? ""
        let line = Self.redact(
            result.stderrFirstLine, secrets: secrets(credentials, output: result.stdout),
            truncated: result.stderrTruncated)
        func reason(_ text: String) -> String {
            "the credential command '\(program)' \(text)" + (line.isEmpty ? "" : ": \(line)")
        }
        switch result.end {
        case .cancelled: throw CancellationError()
        // A command that could not be started (a file still being written, no process slot, no
        // memory, a missing program) is trouble on this machine, not the command's answer:
        // transient, retried within refresh.timeout, never a logout.
        case .failedToStart(let code):
            throw RefreshFailure(
                "the credential command '\(program)' could not be started: \(String(cString: strerror(code)))",
                kind: .transient)
        // A hung or killed command is trouble that may pass (transient: retried within
        // refresh.timeout, never a logout); a command that exits non-zero has said no (definitive).
        case .timedOut:
            throw RefreshFailure(reason("took longer than \(timeout.policyText) and was killed"), kind: .transient)
        case .outputTooLarge: throw RefreshFailure(reason("wrote more than 1 MiB"))
        case .exited(let status) where status != 0: throw RefreshFailure(reason("exited with status \(status)"))
        case .signalled(let signal):
            throw RefreshFailure(reason("was killed by signal \(signal)"), kind: .transient)
        case .exited: return (result.stdout, line)
        }
    }

    /// Every value of the credential set the command knows or told: the current tokens, the
    /// values of the variables passed in `env:` whose names say they are secret, and the
    /// secret-looking fields of what it wrote on stdout (a command that failed may say on stderr
    /// the token it just printed).
    func secrets(_ credentials: Credentials?, output: Data) -> [String] {
        var values = [credentials?.accessToken, credentials?.refreshToken].compactMap { $0 }
        for (name, value) in environment where Self.looksSecret(name) { values.append(value) }
        if let object = TokenEndpoint.jsonObject(output) {
            for (key, value) in object where Self.looksSecret(key) {
                if let text = value as? String { values.append(text) }
            }
        }
        return values.filter { !$0.isEmpty }
    }

    /// A variable or field name that holds a secret: `TOKEN`, `access_token`, `CLIENT_SECRET`,
    /// `password`, `API_KEY`, `credential`… (`token_type`, `expires_in` are not).
    static func looksSecret(_ name: String) -> Bool {
        let lower = name.lowercased()
        if lower == "token_type" { return false }
        return ["token", "secret", "passw", "key", "credential", "auth", "assertion", "cookie", "session"]
            .contains { lower.contains($0) }
    }

    /// `line` with the current tokens and any run of 20 or more token characters replaced.
    func redact(_ line: String, _ credentials: Credentials?) -> String {
        Self.redact(line, secrets: secrets(credentials, output: Data()), truncated: false)
    }

    /// The shortest part of a secret that is redacted when it appears alone.
    static let secretPartLength = 8

    /// `text` with every run of it made of parts of ``secretPartLength`` characters or more of one
    /// of `secrets` replaced by one NUL (a marker the caller writes as `<redacted>`): a command
    /// printing most of a token (`${RT#RT-}`) shows none of it. Each window of 8 characters of the
    /// line is looked up among the secrets' windows, so the work is linear in the line and the
    /// secrets (a secret over 64 KiB is only matched whole).
    static func redactParts(_ text: String, of secrets: Set<String>) -> String {
        let length = secretPartLength
        let scalars = Array(text.unicodeScalars)
        guard scalars.count >= length else { return text }
        var windows = Set<ArraySlice<Unicode.Scalar>>()
        for secret in secrets {
            let secretScalars = Array(secret.unicodeScalars)
            guard secretScalars.count >= length, secretScalars.count <= 65_536 else { continue }
            for start in 0...(secretScalars.count - length) {
                windows.insert(secretScalars[start..<(start + length)])
            }
        }
        guard !windows.isEmpty else { return text }
        var covered = [Bool](repeating: false, count: scalars.count)
        for start in 0...(scalars.count - length) where windows.contains(scalars[start..<(start + length)]) {
            for index in start..<(start + length) { covered[index] = true }
        }
        guard covered.contains(true) else { return text }
        var out = ""
        for (index, scalar) in scalars.enumerated() {
            if covered[index] {
                if index == 0 || !covered[index - 1] { out.unicodeScalars.append("\u{0}") }
            } else {
                out.unicodeScalars.append(scalar)
            }
        }
        return out
    }

    /// `line` made safe to show on a terminal and in a log:
    ///
    /// - every secret, whatever its length, is replaced by `<redacted>`, also written
    ///   percent-encoded or JSON-escaped, and so is any part of 8 or more characters of one;
    /// - any run of 20 or more token characters (`A-Za-z0-9-_.~+/=`) is replaced as well, for
    ///   secrets nobody told us about;
    /// - when the line was cut (`truncated`), a run of token characters at its end is dropped:
    ///   it may be the first part of a secret;
    /// - control and format characters (ANSI escape sequences, carriage returns, bidirectional
    ///   overrides) are written as `\u{1B}`, so the command cannot drive the terminal;
    /// - the result is cut at 200 characters.
    static func redact(_ line: String, secrets: [String], truncated: Bool) -> String {
        var text = line
        var variants: Set<String> = []
        for secret in secrets where !secret.isEmpty {
            variants.insert(secret)
            if let encoded = secret.addingPercentEncoding(withAllowedCharacters: .alphanumerics) {
                variants.insert(encoded)
            }
            variants.insert(String(PolicyEvent.quote(secret).dropFirst().dropLast()))
        }
        // The longest first, so a secret that contains another is replaced whole.
        for variant in variants.sorted(by: { ($0.count, $0) > ($1.count, $1) }) {
            text = text.replacingOccurrences(of: variant, with: "\u{0}")
        }
        text = redactParts(text, of: variants)
        func isTokenCharacter(_ character: Character) -> Bool {
            character.isASCII && (character.isLetter || character.isNumber || "-_.~+/=".contains(character))
        }
        if truncated {
            while let last = text.last, isTokenCharacter(last) { text.removeLast() }
        }
        var out = ""
        var run = ""
        func flush() {
            out += run.count >= 20 ? "<redacted>" : run
            run = ""
        }
        for character in text {
            if isTokenCharacter(character) {
                run.append(character)
                continue
            }
            flush()
            if character == "\u{0}" {
                out += "<redacted>"
                continue
            }
            for scalar in character.unicodeScalars {
                switch scalar.properties.generalCategory {
                case .control, .format, .lineSeparator, .paragraphSeparator, .privateUse, .unassigned,
                    .surrogate:
                    out += "\\u{" + String(scalar.value, radix: 16, uppercase: true) + "}"
                default:
                    out.unicodeScalars.append(scalar)
                }
            }
        }
        flush()
        return out.count > ExecCommand.maxStderrLine ? String(out.prefix(ExecCommand.maxStderrLine)) : out
    }
}

/// One process: its pipes, its readers and how it ended.
///
/// The command runs in a process group of its own (`posix_spawn` with `POSIX_SPAWN_SETPGROUP`),
/// so a wrapper script and every child it started are one unit: at the timeout, on
/// cancellation, and after the command itself exited, the whole group is killed. The leader is
/// reaped only after that kill (it is waited for with `WNOWAIT` first), so its process and group
/// id cannot have been reused by then. Only stdin, stdout and stderr reach the command: every
/// other descriptor of this process is closed in the child (`closefrom(3)` as a spawn action),
/// and the pipes are created close-on-exec so other spawns cannot inherit them.
///
/// Concurrency contract: `start` once; `cancel` from any thread, any number of times. The
/// completion is called exactly once, on a thread of the run's own, never on the cooperative pool
/// or dispatch's, since waiting for a process blocks.
final class CommandRun: Sendable {
    enum End: Sendable, Equatable {
        case exited(Int32)
        case signalled(Int32)
        case timedOut
        case cancelled
        case failedToStart(Int32)
        case outputTooLarge
    }

    struct Result: Sendable {
        var end: End
        var stdout = Data()
        var stderrFirstLine = ""
        /// The first line was cut (stderr said more than is kept before its first newline).
        var stderrTruncated = false
    }

    private struct State {
        /// The leader's pid, which is also the group's id.
        var pid: pid_t?
        /// Set once the leader was reaped: from then on its ids may belong to someone else.
        var reaped = false
        var cancelled = false
    }

    private let command: ExecCommand
    private let state = Locked(State())

    /// The most stderr kept (its first line is all that is shown).
    static let stderrLimit = 4096

    init(_ command: ExecCommand) { self.command = command }

    func cancel() {
        state.withLock { state in
            state.cancelled = true
            if let pid = state.pid, !state.reaped { kill(-pid, SIGKILL) }
        }
    }

    /// How long the output may stay open once the command itself has exited: what it wrote is
    /// in the pipe by then; a descendant that keeps the pipe open (a daemon started with
    /// `setsid`) is not waited for beyond this, whatever the timeout.
    static let exitGrace: DispatchTimeInterval = .milliseconds(250)

    func start(input: Data, completion: @escaping @Sendable (Result) -> Void) {
        if state.withLock({ $0.cancelled }) { return completion(Result(end: .cancelled)) }
        let spawned: Spawned
        switch Spawned.spawn(command.arguments, environment: command.environment) {
        case .failure(let error): return completion(Result(end: .failedToStart(error.code)))
        case .success(let made): spawned = made
        }
        let pid = spawned.pid
        state.withLock { state in
            state.pid = pid
            // A cancel that came while the process was being started found nothing to kill.
            if state.cancelled { kill(-pid, SIGKILL) }
        }
        let collector = OutputCollector(
            stdout: spawned.stdout, stderr: spawned.stderr, stdoutLimit: ExecCommand.maxOutputBytes,
            stderrLimit: Self.stderrLimit)
        collector.start()
        Self.write(input, to: spawned.stdin)
        let exited = DispatchSemaphore(value: 0)
        Self.onThread {
            // Waits for the leader to exit without reaping it (WNOWAIT), so its ids stay its own
            // while the group and session are killed below.
            var info = siginfo_t()
            while waitid(P_PID, id_t(pid), &info, WEXITED | WNOWAIT) != 0 && errno == EINTR {}
            exited.signal()
        }
        let deadline = DispatchTime.now() + .nanoseconds(Int(command.timeout.wholeNanoseconds))
        let state = self.state
        Self.onThread {
            let timedOut = exited.wait(timeout: deadline) == .timedOut
            if timedOut {
                kill(-pid, SIGKILL)
                exited.wait()
            }
            // Whatever the command left running in its group goes with it: nothing outlives a run.
            kill(-pid, SIGKILL)
            // What it wrote before it exited is in the pipes: read it, and do not wait for an end
            // of file past a short grace (a descendant holding the pipes open is killed below).
            let drained = collector.finished.wait(timeout: .now() + Self.exitGrace) == .success
            // Descendants that left the group: those still in the command's session (it is a
            // session leader), and any process holding its output pipes (a daemon that called
            // setsid itself). Killed before the leader is reaped, so its ids are still its own.
            Descendants.kill(session: pid, holding: collector.pipeInodes)
            if !drained {
                collector.stop()
                collector.finished.wait()
            }
            var status: Int32 = 0
            let cancelled = state.withLock { state -> Bool in
                while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
                state.reaped = true
                return state.cancelled
            }
            var end: End
            if cancelled {
                end = .cancelled
            } else if timedOut {
                end = .timedOut
            } else if status & 0x7F == 0 {
                end = .exited((status >> 8) & 0xFF)
            } else {
                end = .signalled(status & 0x7F)
            }
            let output = collector.result()
            if output.stdoutOverflow, case .exited = end { end = .outputTooLarge }
            let text = String(decoding: output.stderr, as: UTF8.self)
            // The first line that says something; cut when it runs to the end of what was kept.
            let first = text.split(whereSeparator: \.isNewline).first ?? ""
            let cut = output.stderrOverflow && first.endIndex == text.endIndex
            completion(
                Result(end: end, stdout: output.stdout, stderrFirstLine: String(first), stderrTruncated: cut))
        }
    }

    /// Runs `work` on a thread of its own. Every wait here blocks (a read, `waitid`, the timeout):
    /// on dispatch's global queue, which runs as many blocked items at once as there are cores,
    /// the timeout's wait could sit behind two readers and fire seconds late.
    static func onThread(_ work: @escaping @Sendable () -> Void) {
        let thread = Thread(block: work)
        thread.stackSize = 256 << 10
        thread.start()
    }

    /// Writes `data` and closes the pipe, on a thread with SIGPIPE blocked: a command that exits
    /// without reading its input must not kill the host with SIGPIPE.
    private static func write(_ data: Data, to descriptor: Int32) {
        let thread = Thread {
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
            close(descriptor)
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

/// A started command: its pid (and process group id) and this side of its three pipes.
struct Spawned {
    var pid: pid_t
    var stdin: Int32
    var stdout: Int32
    var stderr: Int32

    /// Starts `arguments` (`arguments[0]` the executable's path) with exactly `environment`, in a
    /// new process group, with default signal dispositions and an empty signal mask, and with
    /// only descriptors 0, 1 and 2 open. Returns the `errno` of a failure.
    static func spawn(_ arguments: [String], environment: [String: String]) -> Swift.Result<Spawned, SpawnError> {
        var pipes: [[Int32]] = []
        defer { for pair in pipes { for fd in pair where fd >= 0 { close(fd) } } }
        for _ in 0..<3 {
            guard let pair = closeOnExecPipe() else { return .failure(SpawnError(code: errno)) }
            pipes.append(pair)
        }
        // The child's ends: stdin reads pipes[0][0]; stdout and stderr write pipes[1][1], pipes[2][1].
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_adddup2(&actions, pipes[0][0], 0)
        posix_spawn_file_actions_adddup2(&actions, pipes[1][1], 1)
        posix_spawn_file_actions_adddup2(&actions, pipes[2][1], 2)
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var flags = Int32(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF)
        #if os(Linux)
            // A session of its own (glibc's POSIX_SPAWN_SETSID, 2.26+): the command leads a new
            // session and process group, has no controlling terminal, and its descendants that
            // change group stay findable by the session (see ``Descendants``).
            flags |= Self.setSessionFlag
        #else
            flags |= Int32(POSIX_SPAWN_SETPGROUP)
        #endif
        #if canImport(Darwin)
            // Darwin: every descriptor not named in the actions is closed.
            flags |= Int32(POSIX_SPAWN_CLOEXEC_DEFAULT)
            for fd: Int32 in 0...2 { posix_spawn_file_actions_addinherit_np(&actions, fd) }
        #else
            if !closeFrom(&actions, 3) {
                // No closefrom action in this C library: close what is open now (descriptors
                // opened later by other threads are close-on-exec in Foundation and here).
                for fd in openDescriptors() where fd > 2 { posix_spawn_file_actions_addclose(&actions, fd) }
            }
        #endif
        let result = spawn(arguments, environment, &actions, &attributes, flags, pipes: &pipes)
        #if os(Linux)
            if case .failure(let error) = result, error.code == EINVAL, flags & Self.setSessionFlag != 0 {
                // A C library without POSIX_SPAWN_SETSID: a process group of its own, as before.
                flags = (flags & ~Self.setSessionFlag) | Int32(POSIX_SPAWN_SETPGROUP)
                return spawn(arguments, environment, &actions, &attributes, flags, pipes: &pipes)
            }
        #endif
        return result
    }

    /// glibc's `POSIX_SPAWN_SETSID` (a GNU extension Swift's view of `spawn.h` leaves out).
    static let setSessionFlag: Int32 = 0x80

    struct SpawnError: Error {
        var code: Int32
    }

    private static func spawn(
        _ arguments: [String], _ environment: [String: String], _ actions: inout posix_spawn_file_actions_t,
        _ attributes: inout posix_spawnattr_t, _ flags: Int32, pipes: inout [[Int32]]
    ) -> Swift.Result<Spawned, SpawnError> {
        posix_spawnattr_setflags(&attributes, Int16(flags))
        posix_spawnattr_setpgroup(&attributes, 0)
        var empty = sigset_t()
        sigemptyset(&empty)
        posix_spawnattr_setsigmask(&attributes, &empty)
        var defaults = sigset_t()
        sigemptyset(&defaults)
        for signal in [SIGPIPE, SIGINT, SIGQUIT, SIGTERM, SIGHUP, SIGCHLD, SIGUSR1, SIGUSR2, SIGALRM, SIGXFSZ] {
            sigaddset(&defaults, signal)
        }
        posix_spawnattr_setsigdefault(&attributes, &defaults)
        let argv = arguments.map { strdup($0) } + [nil]
        let envp = environment.sorted { $0.key < $1.key }.map { strdup("\($0.key)=\($0.value)") } + [nil]
        defer {
            for pointer in argv { free(pointer) }
            for pointer in envp { free(pointer) }
        }
        var pid: pid_t = 0
        let code = posix_spawn(&pid, arguments[0], &actions, &attributes, argv, envp)
        guard code == 0 else { return .failure(SpawnError(code: code)) }
        let spawned = Spawned(pid: pid, stdin: pipes[0][1], stdout: pipes[1][0], stderr: pipes[2][0])
        // Ours now: not closed by the caller's cleanup.
        pipes[0][1] = -1
        pipes[1][0] = -1
        pipes[2][0] = -1
        return .success(spawned)
    }

    /// A pipe whose two ends are close-on-exec from their creation (`pipe2`), so a process that
    /// another thread spawns meanwhile cannot inherit them.
    private static func closeOnExecPipe() -> [Int32]? {
        var fds: [Int32] = [-1, -1]
        #if canImport(Darwin)
            guard pipe(&fds) == 0 else { return nil }
            for fd in fds { _ = fcntl(fd, F_SETFD, FD_CLOEXEC) }
        #else
            if let pipe2 = SpawnSymbols.pipe2 {
                guard pipe2(&fds, O_CLOEXEC) == 0 else { return nil }
            } else {
                guard pipe(&fds) == 0 else { return nil }
                for fd in fds { _ = fcntl(fd, F_SETFD, FD_CLOEXEC) }
            }
        #endif
        return fds
    }

    #if !canImport(Darwin)
        /// Adds glibc's `posix_spawn_file_actions_addclosefrom_np` (2.34+; not in Swift's view of
        /// `spawn.h`, which leaves out GNU extensions); `false` when this C library has none.
        private static func closeFrom(_ actions: inout posix_spawn_file_actions_t, _ lowest: Int32) -> Bool {
            guard let addClosefrom = SpawnSymbols.addClosefrom else { return false }
            return addClosefrom(&actions, lowest) == 0
        }

        /// The descriptors open in this process now.
        private static func openDescriptors() -> [Int32] {
            let names = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd")) ?? []
            return names.compactMap { Int32($0) }
        }
    #endif
}

#if !canImport(Darwin)
    /// GNU extensions looked up at run time (Swift's Glibc module is built without `_GNU_SOURCE`).
    private enum SpawnSymbols {
        typealias AddClosefrom = @convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>?, Int32) -> Int32
        typealias Pipe2 = @convention(c) (UnsafeMutablePointer<Int32>?, Int32) -> Int32

        static var addClosefrom: AddClosefrom? { symbol("posix_spawn_file_actions_addclosefrom_np") }
        static var pipe2: Pipe2? { symbol("pipe2") }

        private static func symbol<T>(_ name: String) -> T? {
            guard let address = dlsym(UnsafeMutableRawPointer(bitPattern: 0), name) else { return nil }
            return unsafeBitCast(address, to: T.self)
        }
    }
#endif

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

/// `read(2)`, named so it does not clash with the methods called `read` around it.
private func systemRead(_ descriptor: Int32, _ buffer: UnsafeMutableRawPointer?, _ count: Int) -> Int {
    read(descriptor, buffer, count)
}
