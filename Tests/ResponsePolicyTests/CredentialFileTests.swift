import Foundation
import Testing

@testable import ResponsePolicy

#if canImport(Glibc)
    import Glibc
#endif

/// The `file` store after a crash and against careless hands; FIFOs never hang a load.
struct CredentialFileTests {
    /// Issue 30: the file keeps what the fleet numbered its pair (generation, epoch), whether the
    /// fleet has it yet, and when its access token was issued; a plain `load()` still reads the
    /// tokens, a file without them (or with values of the wrong type) loads as before.
    @Test func theFleetsNumberingAndTheIssueTimeRoundTrip() throws {
        try withScratchDirectory { directory in
            let path = directory + "/credentials.json"
            let store = FileCredentialStore(path: path)
            let credentials = Credentials(
                accessToken: "a7", refreshToken: "r7", expiresAt: Date(timeIntervalSince1970: 1_800_000_060),
                issuedAt: Date(timeIntervalSince1970: 1_800_000_000))
            let saved = SavedCredentials(credentials: credentials, generation: 7, epoch: 3, published: false)
            try store.save(saved)
            #expect(try store.loadSaved() == saved)
            #expect(try store.load()?.sameTokens(as: credentials) == true)
            #expect(try store.load()?.lifetimeAsIssued == 60)
            let text = try String(contentsOfFile: path, encoding: .utf8)
            #expect(
                text.contains("\"generation\": 7") && text.contains("\"epoch\": 3")
                    && text.contains("\"published\": false") && text.contains("\"issued_at\": \"2027-01-15T08:00:00Z\"")
            )
            // Published, and a file that says nothing of the fleet: generation 0, published.
            try store.save(SavedCredentials(credentials: credentials, generation: 8, epoch: 3))
            #expect(!(try String(contentsOfFile: path, encoding: .utf8)).contains("published"))
            try #"{"access_token":"a","generation":"seven","epoch":-1,"published":"no"}"#
                .write(toFile: path, atomically: true, encoding: .utf8)
            #expect(try store.loadSaved() == SavedCredentials(credentials: Credentials(accessToken: "a")))
        }
    }

    @Test func aKilledWritersTemporaryFileIsRemovedAtLoad() throws {
        try withScratchDirectory { directory in
            let path = directory + "/credentials.json"
            try FileCredentialStore(path: path).save(Credentials(accessToken: "a1"))
            let dead = try deadProcessID()
            let stale = directory + "/.credentials.json.tmp-\(dead)-1f2e"
            let mine = directory + "/.credentials.json.tmp-\(getpid())-3c4d"
            let oldButAlive = directory + "/.credentials.json.tmp-1-5a6b"
            let otherFile = directory + "/.other.json.tmp-\(dead)-7e8f"
            for file in [stale, mine, oldButAlive, otherFile] {
                try Data(#"{"access_token":"TOKEN-left-behind"}"#.utf8).write(to: URL(fileURLWithPath: file))
            }
            let twoHoursAgo = Date().addingTimeInterval(-7_200)
            try FileManager.default.setAttributes([.modificationDate: twoHoursAgo], ofItemAtPath: oldButAlive)

            #expect(try FileCredentialStore(path: path).load() == Credentials(accessToken: "a1"))
            let left = try FileManager.default.contentsOfDirectory(atPath: directory).sorted()
            #expect(
                left == [".credentials.json.tmp-\(getpid())-3c4d", ".other.json.tmp-\(dead)-7e8f", "credentials.json"])
        }
    }

    @Test(arguments: [0o644, 0o640, 0o604, 0o666])
    func aCredentialsFileOpenToOthersIsMade0600WithAWarning(_ mode: Int) throws {
        try withScratchDirectory { directory in
            let path = directory + "/credentials.json"
            try Data(#"{"access_token":"TOKEN-abc"}"#.utf8).write(to: URL(fileURLWithPath: path))
            chmod(path, mode_t(mode))
            let warnings = Locked<[String]>([])
            let store = FileCredentialStore(path: path, warn: { message in warnings.withLock { $0.append(message) } })
            #expect(try store.load() == Credentials(accessToken: "TOKEN-abc"))
            #expect(try fileMode(path) == 0o600)
            #expect(
                warnings.withLock { $0 } == [
                    "the credentials file '\(path)' was open to others (mode \(String(mode, radix: 8))); its mode is now 0600"
                ])
            _ = try store.load()
            #expect(warnings.withLock { $0.count } == 1, "a 0600 file loads silently")
        }
    }

    @Test func aFIFOIsRefusedAsCredentialsAndAsAPolicyWithoutHanging() throws {
        try withScratchDirectory { directory in
            let fifo = directory + "/pipe"
            #expect(mkfifo(fifo, 0o600) == 0)
            let error = #expect(throws: CredentialStoreError.self) { try FileCredentialStore(path: fifo).load() }
            #expect(error == .unreadable(path: fifo, reason: "it is not a regular file"))
            let policyError = #expect(throws: PolicyError.self) { try Policy.load(path: fifo) }
            #expect(policyError == .unreadable(path: fifo, reason: "it is not a regular file"))
        }
    }

    @Test func aSimulationRefusesToReloadFromAFIFO() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("rp-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let fifo = directory + "/next.yaml"
        #expect(mkfifo(fifo, 0o600) == 0)
        let result = try await simulate(
            basePolicy,
            """
            requests:
              - { id: a, at: 0s, responses: [{ status: 200 }] }
            reload:
              - { at: 10ms, policy: \(fifo) }
            """)
        let reload = try #require(result.events.first { $0.kind == .reload })
        #expect(reload.ok == false)
    }
}

/// A process ID that no longer runs: that of a child that has exited.
func deadProcessID() throws -> pid_t {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: "/bin/true")
    try process.run()
    process.waitUntilExit()
    return process.processIdentifier
}

func fileMode(_ path: String) throws -> Int {
    let attributes = try FileManager.default.attributesOfItem(atPath: path)
    return (attributes[.posixPermissions] as? NSNumber)?.intValue ?? -1
}

func withScratchDirectory(_ body: (String) throws -> Void) throws {
    let directory = FileManager.default.temporaryDirectory.appendingPathComponent("rp-\(UUID().uuidString)").path
    try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(atPath: directory) }
    try body(directory)
}
