import Foundation
import ResponsePolicy
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// `policy fetch` never loses a rotated refresh token: it waits for a refresh a logout
/// overtook, refuses to start when the new tokens could not be saved, fails loudly when a save
/// fails anyway, and a crash report carries no token.
struct FetchCredentialSafetyTests {
    static func policy(_ server: TestServer) -> String {
        """
        policy: 1
        name: rotating
        classify: { code: body.status }
        rules:
          - { name: token-expired, when: { code: [1401] }, then: refresh }
          - { name: forced-logout, when: { code: [202] }, then: logout }
        refresh:
          use: oauth2
          with: { token-url: "http://127.0.0.1:\(server.port)/oauth/token", client-id: app }
          timeout: 10s
        """
    }

    /// Writes the policy and a private credentials file holding the server's first refresh token.
    static func files(_ server: TestServer, in directory: String) throws -> (policy: String, credentials: String) {
        let policy = directory + "/policy.yaml"
        try Data(Self.policy(server).utf8).write(to: URL(fileURLWithPath: policy))
        let credentials = directory + "/credentials.json"
        try Data(#"{"access_token":"stale","refresh_token":"refresh-0"}"#.utf8)
            .write(to: URL(fileURLWithPath: credentials))
        chmod(credentials, 0o600)
        return (policy, credentials)
    }

    static func storedRefreshToken(_ path: String) throws -> String? {
        let object = try JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: path)))
        return (object as? [String: Any])?["refresh_token"] as? String
    }

    @Test func aLogoutDuringARefreshStillSavesTheRotatedToken() async throws {
        try await withTestServer { server in
            // r1 gets 1401 and starts a refresh that takes 1.5 s; r2 is answered "logged out" as
            // soon as the token call is in flight, which ends both requests mid-refresh. (r2 is
            // not held for the refresh: on a loaded machine it may leave after r1's refresh began,
            // and the server answers it only while a token call is out.)
            try await server.control(["api_mode": "logout_during_refresh", "token_delay": 1.5])
            try await withScratch { directory in
                let (policy, credentials) = try Self.files(server, in: directory)
                try Data((Self.policy(server) + "\n  hold-new-requests: false\n").utf8)
                    .write(to: URL(fileURLWithPath: policy))
                let run = try await runPolicy([
                    "fetch", "--policy", policy, "--credentials", credentials, "--concurrency", "2", "--count", "2",
                    server.url("/api/items").absoluteString,
                ])
                #expect(run.status == 1, "\(run.stdout)\(run.stderr)")
                #expect(run.stdout.contains("logged-out: logged out by rule 'forced-logout'"), "\(run.stdout)")
                let stats = try await server.stats()
                #expect(stats.counters["token_ok"] == 1)
                // The server rotated: refresh-0 is spent, refresh-1 is the session's only token.
                #expect(stats.refreshToken == "refresh-1")
                #expect(try Self.storedRefreshToken(credentials) == "refresh-1")
                #expect(!run.stdout.contains("refresh-1") && !run.stderr.contains("refresh-1"))
            }
        }
    }

    @Test func aTokenThatCannotBeSavedIsALoudFailure() async throws {
        try await withTestServer { server in
            // The token call is held at the server until the folder is gone.
            try await server.control(["expired_mode": "status1401", "token_gate": "closed"])
            try await withScratch { directory in
                let folder = directory + "/private"
                try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: false)
                let (policy, credentials) = try Self.files(server, in: folder)
                async let running = runPolicy([
                    "fetch", "--verbose", "--policy", policy, "--credentials", credentials,
                    server.url("/api/items").absoluteString,
                ])
                // The folder goes away while the token call is in flight (as root too, unlike a chmod).
                try await waitFor(server, "token_calls")
                try FileManager.default.moveItem(atPath: folder, toPath: directory + "/moved")
                try await server.control(["token_gate": "open"])
                let run = try await running
                #expect(run.status == 1, "\(run.stdout)")
                #expect(run.stdout.contains("r1 200 code=0 attempts=2"), "\(run.stdout)")
                #expect(
                    run.stderr.contains(
                        "error: cannot write the credentials file '\(credentials)': cannot create a temporary file in '\(folder)': No such file or directory; the tokens the last refresh returned were not saved"
                    ), "\(run.stderr)")
                #expect(run.stderr.contains(#""event":"problem""#), "\(run.stderr)")
                #expect(!run.stderr.contains("refresh-1") && !run.stdout.contains("refresh-1"))
            }
        }
    }

    @Test func anUnwritableCredentialsFolderStopsFetchBeforeAnythingIsSent() async throws {
        try await withTestServer { server in
            try await withScratch { directory in
                let folder = directory + "/locked"
                try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: false)
                let (policy, credentials) = try Self.files(server, in: folder)
                let undo = try makeUnwritable(folder)
                defer { undo() }
                let run = try await runPolicy([
                    "fetch", "--verbose", "--policy", policy, "--credentials", credentials,
                    server.url("/api/items").absoluteString,
                ])
                #expect(run.status == 73, "\(run.stdout)\(run.stderr)")
                // A status scripts can rely on: `policy fetch --help` lists it (it once did not).
                let help = try await runPolicy(["fetch", "--help"])
                #expect(
                    help.stdout.contains("\n  73                      the credentials file's folder cannot be written"))
                #expect(
                    run.stderr.hasPrefix(
                        #"{"t":0,"event":"problem","reason":"the credential store could not be written (cannot write the credentials file "#
                    ), "\(run.stderr)")
                #expect(
                    run.stderr.contains(
                        "error: cannot write the credentials file '\(credentials)': cannot create a temporary file in '\(folder)': "
                    ), "\(run.stderr)")
                #expect(run.stderr.contains("so nothing was sent"), "\(run.stderr)")
                let stats = try await server.stats()
                #expect(stats.counters["api_calls"] == 0)
                #expect(stats.counters["token_calls"] == 0)
            }
        }
    }

    @Test func aFileThatIsNotCredentialsIsRefusedBeforeItsModeIsTouched() async throws {
        try await withScratch { directory in
            let policy = directory + "/policy.yaml"
            try Data("policy: 1\nname: x\nrules: []\n".utf8).write(to: URL(fileURLWithPath: policy))
            let notes = directory + "/notes.txt"
            try Data("shopping: milk\n".utf8).write(to: URL(fileURLWithPath: notes))
            chmod(notes, 0o644)
            let run = try await runPolicy(["fetch", "--policy", policy, "--credentials", notes, "http://127.0.0.1:1/"])
            #expect(run.status == 65)
            #expect(run.stderr == "error: the credentials file '\(notes)' is malformed: it is not valid JSON\n")
            let mode = try FileManager.default.attributesOfItem(atPath: notes)[.posixPermissions] as? Int
            #expect(mode == 0o644)
        }
    }

    /// With an entry to lend (`SHLVL`), the settings are in place before the runtime reads them
    /// and the process is not restarted; with none, it restarts itself with them.
    @Test(arguments: [true, false])
    func aCrashReportCarriesNoToken(_ lender: Bool) async throws {
        try await withTestServer { server in
            try await withScratch { directory in
                let policy = directory + "/policy.yaml"
                // The attempt outlives any wait for it here, however loaded the machine.
                try Data("policy: 1\nname: x\nrules: []\nretry: { attempt-timeout: 600s, deadline: 600s }\n".utf8)
                    .write(to: URL(fileURLWithPath: policy))
                let access = "access-CRASHTEST-0123456789abcdefghijklmnop"
                let refresh = "refresh-CRASHTEST-0123456789abcdefghijklmnop"
                let credentials = directory + "/credentials.json"
                try Data(#"{"access_token":"\#(access)","refresh_token":"\#(refresh)"}"#.utf8)
                    .write(to: URL(fileURLWithPath: credentials))
                chmod(credentials, 0o600)
                let process = Process()
                process.executableURL = try policyBinary()
                process.arguments = [
                    "fetch", "--policy", policy, "--credentials", credentials,
                    server.url("/stall?seconds=300").absoluteString,
                ]
                var environment = ["PATH": ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin"]
                if lender { environment["SHLVL"] = "1" }
                process.environment = environment
                let stdout = Pipe()
                let stderr = Pipe()
                process.standardOutput = stdout
                process.standardError = stderr
                process.standardInput = FileHandle.nullDevice
                try process.run()
                // Blocking reads on threads of their own, never on the cooperative pool.
                let errors = Locked(Data())
                let output = readToEnd(stderr.fileHandleForReading, into: errors)
                let ignored = readToEnd(stdout.fileHandleForReading, into: Locked(Data()))
                // The request, signed with the access token, is on the wire (it stalls 300 s): crash now.
                try await waitFor(server, "stall_calls")
                // The environment the process was started with (a restart replaces it).
                let initial = try String(
                    decoding: Data(contentsOf: URL(fileURLWithPath: "/proc/\(process.processIdentifier)/environ")),
                    as: UTF8.self)
                #expect(initial.contains("SWIFT_BACKTRACE=") == !lender, "\(initial)")
                kill(process.processIdentifier, SIGSEGV)
                // Issue 32: a SIGSEGV sent with kill(2) was reported like a fault, then the process
                // went on (no faulting instruction to repeat) with its request on the wire. Now it
                // ends by the signal once the report is written: its pipes close by themselves
                // (the request stalls for 300 s, so an exit of its own is the crash's).
                let ended = Locked(false)
                await offThePool {
                    let deadline = Date().addingTimeInterval(60)
                    while process.isRunning, Date() < deadline { usleep(20_000) }
                    ended.withLock { $0 = !process.isRunning }
                }
                let exited = ended.withLock { $0 }
                if !exited { kill(process.processIdentifier, SIGKILL) }
                await output.value
                await ignored.value
                await offThePool { process.waitUntilExit() }
                #expect(exited, "the crashed process did not exit by itself")
                #expect(process.terminationReason == .uncaughtSignal && process.terminationStatus == SIGSEGV)
                let report = String(decoding: errors.withLock { $0 }, as: UTF8.self)
                #expect(report.contains("Program crashed"), "the backtracer did not run:\n\(report)")
                #expect(!report.contains("Registers:"), "\(report)")
                #expect(!report.contains("CRASHTEST"), "\(report)")
                for piece in [access, refresh] {
                    // Any 8 bytes of a token, as a register dump would show them.
                    for start in stride(from: 0, to: piece.count - 8, by: 4) {
                        let slice = String(piece.dropFirst(start).prefix(8))
                        #expect(!report.contains(slice), "'\(slice)' in the crash report")
                    }
                }
            }
        }
    }
}

/// Reads `handle` to its end on a thread of its own, into `buffer` as the bytes arrive.
private func readToEnd(_ handle: FileHandle, into buffer: Locked<Data>) -> Task<Void, Never> {
    Task {
        await withCheckedContinuation { continuation in
            Thread {
                while true {
                    let chunk = handle.availableData
                    if chunk.isEmpty { break }
                    buffer.withLock { $0.append(chunk) }
                }
                continuation.resume()
            }.start()
        }
    }
}

/// Waits until the server's `counter` is at least 1: the binary, started on a loaded machine,
/// may take seconds to get there (at most 60 s).
private func waitFor(_ server: TestServer, _ counter: String) async throws {
    let deadline = ContinuousClock.now + .seconds(60)
    while try await server.stats().counters[counter, default: 0] < 1 {
        guard ContinuousClock.now < deadline else { throw TestServer.Failure(description: "\(counter) stayed 0") }
        try await Task.sleep(for: .milliseconds(20))
    }
}

/// Runs blocking `work` on a thread of its own and waits for it without holding a pool thread.
private func offThePool(_ work: @escaping @Sendable () -> Void) async {
    await withCheckedContinuation { continuation in
        Thread {
            work()
            continuation.resume()
        }.start()
    }
}

/// Makes `folder` refuse new files, also for root (whose permission checks a chmod does not
/// stop): `chmod 0500`, and `chattr +i` as root. Returns what undoes it.
private func makeUnwritable(_ folder: String) throws -> () -> Void {
    chmod(folder, 0o500)
    if geteuid() == 0 {
        let chattr = Process()
        chattr.executableURL = URL(fileURLWithPath: "/usr/bin/chattr")
        chattr.arguments = ["+i", folder]
        try chattr.run()
        chattr.waitUntilExit()
    }
    let probe = folder + "/.probe"
    let fd = open(probe, O_WRONLY | O_CREAT | O_EXCL, 0o600)
    if fd >= 0 {
        close(fd)
        unlink(probe)
    }
    #expect(fd < 0, "the folder could not be made unwritable here")
    return {
        if geteuid() == 0 {
            let chattr = Process()
            chattr.executableURL = URL(fileURLWithPath: "/usr/bin/chattr")
            chattr.arguments = ["-i", folder]
            try? chattr.run()
            chattr.waitUntilExit()
        }
        chmod(folder, 0o700)
    }
}
