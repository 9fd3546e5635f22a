import Foundation
import TestGate
import Testing

@testable import ResponsePolicy

#if canImport(Glibc)
    import Glibc
#endif

/// The `exec` plugin as a process owner: a wrapper script and its children stopped at the
/// plugin's own timeout with nothing left running, only descriptors 0-2 inherited, and stderr
/// made safe (every secret redacted whatever its length, control characters escaped).
///
/// It bounds wall time (a hanging command stopped within its timeout + 1 s), so it runs in
/// `.ci/run`'s real-time step: beside the full suite on two busy cores, the run's end was once
/// reported 3 s after the start.
@Suite(.measuresRealTime(filter: "ExecProcessTests"), .loadGate(.realTime))
struct ExecProcessTests {
    @Test func aHangingWrapperScriptFailsWithinItsTimeoutAndLeavesNoProcess() async throws {
        try await withExecDirectory { directory in
            // A wrapper that runs a child, as real credential tools often are: `sleep` is not the
            // script's own process, so killing only the script would leave it running.
            let script = try writeExecScript(directory, "get-token", "echo $$ > \"\(directory)/pid\"\nsleep 60")
            let plugin = try ExecRefresh(configuration: execConfiguration([script], timeout: "1s"))
            // The run's own clock: from the start to the moment it reports the end (what the
            // engine's task then does with it depends on the load of the shared test pool).
            let ended = await withCheckedContinuation { continuation in
                let started = ContinuousClock.now
                CommandRun(plugin.command).start(input: Data()) { result in
                    continuation.resume(returning: (result.end, ContinuousClock.now - started))
                }
            }
            #expect(ended.0 == .timedOut)
            #expect(ended.1 >= .milliseconds(950), "\(ended.1)")
            #expect(ended.1 < .seconds(2), "the command must be stopped within its timeout + 1 s, took \(ended.1)")
            let group = try #require(
                Int32(
                    try String(contentsOfFile: directory + "/pid", encoding: .utf8)
                        .trimmingCharacters(in: .whitespacesAndNewlines)))
            #expect(await liveProcesses(inGroup: group) == [], "the script's children outlived the run")
            // Through the plugin: the refresh fails with the plugin's own timeout, nothing left.
            let failure = await refreshFailure(plugin)
            #expect(failure == "the credential command 'get-token' took longer than 1s and was killed")
            let again = try #require(
                Int32(
                    try String(contentsOfFile: directory + "/pid", encoding: .utf8)
                        .trimmingCharacters(in: .whitespacesAndNewlines)))
            #expect(again != group)
            #expect(await liveProcesses(inGroup: again) == [], "the script's children outlived the refresh")
        }
    }

    /// A command that cannot be started (a removed program here; a program file still being
    /// written, no process slot or no memory alike) is trouble on this machine, not the
    /// command's answer: the refresh fails transient (retried within `refresh.timeout`, never a
    /// logout). It was definitive, so a fork that held a just-written helper open for writing
    /// past the plugin's few ETXTBSY retries reached `on-failure`, a logout by default.
    @Test func aCommandThatCannotBeStartedFailsTransient() async throws {
        try await withExecDirectory { directory in
            // Removed after the plugin was made (which checks that the program exists).
            let script = try writeExecScript(directory, "get-token", "echo '{}'")
            let plugin = try ExecRefresh(configuration: execConfiguration([script], timeout: "5s"))
            try FileManager.default.removeItem(atPath: script)
            let failure = await #expect(throws: RefreshFailure.self) {
                _ = try await plugin.refresh(refreshContext())
            }
            #expect(failure?.kind == .transient)
            #expect(
                failure?.reason == "the credential command 'get-token' could not be started: No such file or directory")
        }
    }

    @Test func aCommandThatExitsTakesWhatItLeftInItsGroupWithIt() async throws {
        try await withExecDirectory { directory in
            // The child keeps no pipe open (its output goes to /dev/null), so nothing waits for it:
            // only the group kill ends it.
            let body = """
                echo $$ > "\(directory)/pid"
                sleep 60 </dev/null >/dev/null 2>&1 &
                printf '{"access_token":"fresh"}'
                """
            let script = try writeExecScript(directory, "get-token", body)
            let plugin = try ExecRefresh(configuration: execConfiguration([script], timeout: "5s"))
            let credentials = try await plugin.refresh(refreshContext())
            #expect(credentials.accessToken == "fresh")
            let group = try #require(
                Int32(
                    try String(contentsOfFile: directory + "/pid", encoding: .utf8)
                        .trimmingCharacters(in: .whitespacesAndNewlines)))
            #expect(await liveProcesses(inGroup: group) == [])
        }
    }

    @Test func theCommandInheritsOnlyStdinStdoutAndStderr() async throws {
        try await withExecDirectory { directory in
            // Descriptors this process holds without close-on-exec: a file and a socket pair.
            let file = open("/dev/null", O_RDONLY)
            var pair: [Int32] = [-1, -1]
            #expect(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &pair) == 0)
            defer {
                close(file)
                for fd in pair { close(fd) }
            }
            #expect(file > 2)
            // `ls` lists its own descriptors: what it inherited, plus 3, the folder it reads.
            let listing = directory + "/fds"
            let plugin = try ExecRefresh(
                configuration: execConfiguration(
                    ["/bin/sh", "-c", #"ls -l /proc/self/fd > "$0"; printf '{"access_token":"x"}'"#, listing],
                    timeout: "5s"))
            _ = try await plugin.refresh(refreshContext())
            let entries = try String(contentsOfFile: listing, encoding: .utf8).split(separator: "\n")
                .filter { $0.hasPrefix("l") }
                .map { line in line.components(separatedBy: " -> ") }
            let descriptors = entries.compactMap { $0.first?.split(separator: " ").last.map(String.init) }
            #expect(descriptors == ["0", "1", "2", "3"], "\(entries)")
            #expect(entries.last?.last?.hasSuffix("/fd") == true, "\(entries)")
        }
    }

    @Test func everySecretOnStderrIsRedactedWhateverItsLengthAndControlCharactersAreEscaped() async throws {
        try await withExecDirectory { directory in
            // Six short secrets: the two current tokens, two secret-named variables from `env:`,
            // the token the command printed on stdout, and a token percent-encoded.
            let body = #"""
                printf '{"access_token":"nw-7","token_type":"Bearer"}'
                printf 'denied: at=xq7 rt=rt-9z pw=pw-42! cs=s3cr3t new=nw-7 enc=rt%%2D9z \033[31mred\033[0m\n' >&2
                exit 1
                """#
            let script = try writeExecScript(directory, "get-token", body)
            let plugin = try ExecRefresh(
                configuration: execConfiguration(
                    [script], timeout: "5s", env: ["APP_PASSWORD", "CLIENT_SECRET", "HOME"],
                    environment: ["APP_PASSWORD": "pw-42!", "CLIENT_SECRET": "s3cr3t", "HOME": "/home/app"]))
            let failure = await refreshFailure(
                plugin, credentials: Credentials(accessToken: "xq7", refreshToken: "rt-9z"))
            #expect(
                failure
                    == #"the credential command 'get-token' exited with status 1: denied: at=<redacted> rt=<redacted> pw=<redacted> cs=<redacted> new=<redacted> enc=<redacted> \u{1B}[31mred\u{1B}[0m"#
            )
            for secret in ["xq7", "rt-9z", "pw-42!", "s3cr3t", "nw-7", "rt%2D9z"] {
                #expect(!failure.contains(secret), "\(secret)")
            }
        }
    }

    struct RedactionCase: Sendable, CustomTestStringConvertible {
        var name: String
        var line: String
        var secrets: [String]
        var truncated = false
        var expected: String
        var testDescription: String { name }
    }

    static let redactionCases: [RedactionCase] = [
        RedactionCase(
            name: "a one-character secret", line: "code k ok", secrets: ["k"], expected: "code <redacted> o<redacted>"),
        RedactionCase(
            name: "a secret inside another is replaced whole", line: "abc abcdef", secrets: ["abc", "abcdef"],
            expected: "<redacted> <redacted>"),
        RedactionCase(
            name: "JSON-escaped", line: #"{"t":"a\"b"}"#, secrets: [#"a"b"#], expected: #"{"t":"<redacted>"}"#),
        RedactionCase(
            name: "a long unknown token", line: "key ghp_0123456789abcdefghij0123", secrets: [],
            expected: "key <redacted>"),
        RedactionCase(
            name: "a token cut at the end of what was read", line: "error: token=eyJhbGciOi", secrets: [],
            truncated: true, expected: "error: "),
        RedactionCase(
            name: "bidirectional override and bell", line: "ok\u{202E}gnp.exe\u{7}", secrets: [],
            expected: #"ok\u{202E}gnp.exe\u{7}"#),
        RedactionCase(name: "plain text stays", line: "no such user", secrets: ["x1y"], expected: "no such user"),
    ]

    @Test(arguments: redactionCases)
    func stderrIsMadeSafe(_ test: RedactionCase) {
        #expect(ExecCommand.redact(test.line, secrets: test.secrets, truncated: test.truncated) == test.expected)
    }

    /// Issue 32: `${RT#RT-}` printed 17 of the 20 characters of the refresh token.
    @Test(arguments: [
        ("denied a1b2c3d4e5f6g7h8i end", "denied <redacted> end"),
        ("part e5f6g7h8 and e5f6g7h", "part <redacted> and e5f6g7h"),
        ("two RT-a1b2c3d4 x c3d4e5f6g7", "two <redacted> x <redacted>"),
        ("rt=%52T-a1b2c3d4", "rt=%52<redacted>"),
    ])
    func anyPartOfEightCharactersOfASecretIsRedacted(_ line: String, _ expected: String) {
        #expect(ExecCommand.redact(line, secrets: ["RT-a1b2c3d4e5f6g7h8i"], truncated: false) == expected)
    }

    /// Issue 32: a command that answered and left a `setsid` daemon holding its stdout was waited
    /// on until its timeout (then retried, three daemons left running).
    @Test func aDaemonHoldingStdoutDoesNotDelayTheAnswerAndIsKilled() async throws {
        try await withExecDirectory { directory in
            let body = """
                setsid sh -c 'echo $$ > "\(directory)/daemon.tmp"; mv "\(directory)/daemon.tmp" "\(directory)/daemon"; exec sleep 60' &
                while [ ! -s "\(directory)/daemon" ]; do sleep 0.01; done
                printf '{"access_token":"fresh"}'
                """
            let script = try writeExecScript(directory, "get-token", body)
            let plugin = try ExecRefresh(configuration: execConfiguration([script], timeout: "20s"))
            let started = ContinuousClock.now
            let credentials = try await plugin.refresh(refreshContext())
            let took = ContinuousClock.now - started
            #expect(credentials.accessToken == "fresh")
            #expect(took < .seconds(10), "answered after \(took): the daemon's open stdout was waited on")
            let daemon = try #require(
                Int32(
                    try String(contentsOfFile: directory + "/daemon", encoding: .utf8)
                        .trimmingCharacters(in: .whitespacesAndNewlines)))
            #expect(await isGone(daemon), "the setsid daemon outlived the call")
        }
    }

    /// A descendant that moved to a process group of its own (job control) but stayed in the
    /// command's session is killed with it.
    @Test func aDescendantInAnotherGroupOfTheSessionIsKilled() async throws {
        try await withExecDirectory { directory in
            let body = """
                python3 -c 'import os, time; os.setpgid(0, 0); open("\(directory)/member.tmp", "w").write(str(os.getpid())); os.rename("\(directory)/member.tmp", "\(directory)/member"); time.sleep(60)' </dev/null >/dev/null 2>&1 &
                while [ ! -s "\(directory)/member" ]; do sleep 0.01; done
                printf '{"access_token":"fresh"}'
                """
            let script = try writeExecScript(directory, "get-token", body)
            let plugin = try ExecRefresh(configuration: execConfiguration([script], timeout: "20s"))
            #expect(try await plugin.refresh(refreshContext()).accessToken == "fresh")
            let member = try #require(
                Int32(
                    try String(contentsOfFile: directory + "/member", encoding: .utf8)
                        .trimmingCharacters(in: .whitespacesAndNewlines)))
            #expect(await isGone(member), "a session member outlived the call")
        }
    }

    @Test func aLongLineIsRedactedBeforeItIsCut() {
        // The secret straddles character 200: cutting first would leave its first half.
        let secret = "s3cret-value"
        let line = String(repeating: "x ", count: 97) + secret + " tail"
        let safe = ExecCommand.redact(line, secrets: [secret], truncated: false)
        #expect(!safe.contains("s3cr"))
        #expect(safe.count == 200)
    }
}

// MARK: - Helpers

private func execConfiguration(
    _ command: [String], timeout: String, env: [String] = [], environment: [String: String] = [:]
) -> PluginConfiguration {
    var options: [String: PluginOption] = [
        "command": .list(command.map { .string($0) }), "timeout": .string(timeout),
    ]
    if !env.isEmpty { options["env"] = .list(env.map { .string($0) }) }
    return PluginConfiguration(name: "exec", options: options, transport: NoTransport(), environment: environment)
}

private func refreshContext(_ credentials: Credentials? = nil) -> RefreshContext {
    RefreshContext(credentials: credentials, transport: NoTransport(), clock: VirtualClock(), reason: "test")
}

/// The reason the refresh failed with (an empty text when it succeeded).
private func refreshFailure(_ plugin: ExecRefresh, credentials: Credentials? = nil) async -> String {
    do {
        _ = try await plugin.refresh(refreshContext(credentials))
        return ""
    } catch let failure as RefreshFailure {
        return failure.reason
    } catch {
        return "\(error)"
    }
}

/// The processes of group `group` that are not zombies. A process sent SIGKILL may take a
/// moment to leave; this waits for that (at most 2 s), not for anything the code under test does.
private func liveProcesses(inGroup group: Int32) async -> [Int32] {
    let deadline = ContinuousClock.now + .seconds(2)
    while true {
        let live = processes(inGroup: group)
        if live.isEmpty || ContinuousClock.now > deadline { return live }
        try? await Task.sleep(for: .milliseconds(10))
    }
}

private func processes(inGroup group: Int32) -> [Int32] {
    let names = (try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? []
    return names.compactMap { name -> Int32? in
        guard let pid = Int32(name),
            let stat = try? String(contentsOfFile: "/proc/\(name)/stat", encoding: .utf8),
            let close = stat.lastIndex(of: ")")
        else { return nil }
        // After "(comm)": state, ppid, pgrp.
        let fields = stat[stat.index(after: close)...].split(separator: " ")
        guard fields.count > 2, fields[0] != "Z", fields[0] != "X", Int32(fields[2]) == group else { return nil }
        return pid
    }
}

/// Whether `pid` is gone (or a zombie) within 2 s: a process sent SIGKILL may take a moment.
private func isGone(_ pid: Int32) async -> Bool {
    let deadline = ContinuousClock.now + .seconds(2)
    while ContinuousClock.now < deadline {
        guard kill(pid, 0) == 0 else { return true }
        if let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
            let close = stat.lastIndex(of: ")"),
            let state = stat[stat.index(after: close)...].split(separator: " ").first,
            state == "Z" || state == "X"
        {
            return true
        }
        try? await Task.sleep(for: .milliseconds(10))
    }
    return false
}

private func withExecDirectory(_ body: (String) async throws -> Void) async throws {
    let directory = FileManager.default.temporaryDirectory.appendingPathComponent("rp-exec-\(UUID().uuidString)").path
    try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(atPath: directory) }
    try await body(directory)
}

/// Writes an executable `/bin/sh` script and returns its path.
private func writeExecScript(_ directory: String, _ name: String, _ body: String) throws -> String {
    let path = directory + "/" + name
    try Data(("#!/bin/sh\n" + body + "\n").utf8).write(to: URL(fileURLWithPath: path))
    chmod(path, 0o755)
    return path
}
