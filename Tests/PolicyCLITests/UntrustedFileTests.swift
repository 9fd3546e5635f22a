import Foundation
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// Every file the tool opens is opened without following another user's link and without
/// blocking, and checked with `fstat` before a byte is read (issue 32 item 3), through the built
/// binary. Files of another user are made by `chown` to `nobody`, which needs root (CI runs as
/// root); elsewhere those cases are skipped and say so.
struct UntrustedFileTests {
    /// `nobody`'s uid and gid, when this process may give a file to it.
    static let nobody: (uid: uid_t, gid: gid_t)? = {
        guard geteuid() == 0, let entry = getpwnam("nobody") else { return nil }
        return (entry.pointee.pw_uid, entry.pointee.pw_gid)
    }()

    static var canChown: Bool { nobody != nil }

    static func giveToNobody(_ path: String) {
        guard let nobody else { return }
        #expect(lchown(path, nobody.uid, nobody.gid) == 0)
    }

    static let fileCoordinationPolicy = """
        policy: 1
        name: fleet
        coordination: { use: file, with: { connect-timeout: 20ms } }
        rules: []
        """

    /// Issue 32: a FIFO at `<credentials>.shared`, made by another user in a sticky folder, hung
    /// `policy fetch` for ever before any owner or mode check.
    @Test func aFIFOAtTheSharedSessionFileIsRefusedNotWaitedOn() async throws {
        let folder = try TemporaryDirectory()
        let policy = try folder.write("policy.yaml", Self.fileCoordinationPolicy)
        let credentials = try folder.write("credentials.json", #"{"access_token":"access-0"}"#)
        chmod(credentials.path, 0o600)
        let shared = credentials.path + ".shared"
        #expect(mkfifo(shared, 0o600) == 0)
        Self.giveToNobody(shared)
        let run = try await runPolicy(
            ["fetch", "--policy", policy.path, "--credentials", credentials.path, "http://127.0.0.1:9/never"],
            timeout: 60)
        #expect(!run.crashed)
        #expect(run.stderr.contains("'\(shared)'"), "\(run.stderr)")
        #expect(run.stderr.contains("is not a regular file"), "\(run.stderr)")
        // Nothing was written in its place.
        var info = stat()
        #expect(lstat(shared, &info) == 0 && info.st_mode & S_IFMT == S_IFIFO)
    }

    /// Issue 32: the run-time warning about a folder others can write named it `''` when the
    /// credentials path was relative.
    @Test func theWritableFolderWarningNamesTheFolder() async throws {
        let folder = try TemporaryDirectory()
        let policy = try folder.write("policy.yaml", Self.fileCoordinationPolicy)
        let credentials = try folder.write("credentials.json", #"{"access_token":"access-0"}"#)
        chmod(credentials.path, 0o600)
        chmod(folder.url.path, 0o1777)
        defer { chmod(folder.url.path, 0o700) }
        let run = try await runPolicy(
            ["fetch", "--policy", policy.path, "--credentials", "credentials.json", "http://127.0.0.1:9/never"],
            in: folder.url, timeout: 60)
        let real = folder.url.resolvingSymlinksInPath().path
        #expect(run.stderr.contains("the folder '\(real)' of the shared session files"), "\(run.stderr)")
        #expect(!run.stderr.contains("the folder ''"))
    }

    @Test(.enabled(if: canChown, "needs root, to give a fixture to 'nobody'"))
    func aPrivateCredentialsFileOfAnotherUserIsRefusedAndLeftAlone() async throws {
        let folder = try TemporaryDirectory()
        let policy = try folder.write("policy.yaml", "policy: 1\nname: x\nrules: []\n")
        let text = #"{"access_token":"planted-token"}"#
        let credentials = try folder.write("credentials.json", text)
        chmod(credentials.path, 0o600)
        Self.giveToNobody(credentials.path)
        let run = try await runPolicy(
            ["fetch", "--policy", policy.path, "--credentials", credentials.path, "http://127.0.0.1:9/never"])
        #expect(run.status == 66)
        #expect(
            run.stderr
                == "error: cannot read the credentials file '\(credentials.path)': it belongs to another user "
                + "(uid \(Self.nobody?.uid ?? 0)); only files of this user or root are read (chown it, or run as its owner)\n"
        )
        #expect(!run.stderr.contains("planted-token") && !run.stdout.contains("planted-token"))
        #expect(try String(contentsOf: credentials, encoding: .utf8) == text)
        var info = stat()
        #expect(stat(credentials.path, &info) == 0 && info.st_uid == Self.nobody?.uid)
    }

    @Test(.enabled(if: canChown, "needs root, to give a fixture to 'nobody'"))
    func anotherUsersLinkToTheCredentialsIsNotFollowed() async throws {
        let folder = try TemporaryDirectory()
        let policy = try folder.write("policy.yaml", "policy: 1\nname: x\nrules: []\n")
        let target = try folder.write("real.json", #"{"access_token":"access-0"}"#)
        chmod(target.path, 0o600)
        let link = folder.url.appendingPathComponent("credentials.json").path
        #expect(symlink(target.path, link) == 0)
        Self.giveToNobody(link)
        let run = try await runPolicy(["fetch", "--policy", policy.path, "--credentials", link, "http://127.0.0.1:9/"])
        #expect(run.status == 66)
        #expect(run.stderr.contains("is a symbolic link that belongs to another user"), "\(run.stderr)")
    }

    @Test(.enabled(if: canChown, "needs root, to give a fixture to 'nobody'"))
    func aPolicyOfAnotherUserRunsNothingButCanBeRead() async throws {
        let folder = try TemporaryDirectory()
        let policy = try folder.write("policy.yaml", "policy: 1\nname: x\nrules: []\n")
        Self.giveToNobody(policy.path)
        let fetch = try await runPolicy(["fetch", "--policy", policy.path, "http://127.0.0.1:9/never"])
        #expect(fetch.status == 66)
        #expect(
            fetch.stderr.hasPrefix("error: cannot read '\(policy.path)': it belongs to another user"), "\(fetch.stderr)"
        )
        // Reading it runs nothing: lint and explain take a colleague's file.
        let lint = try await runPolicy(["lint", policy.path])
        #expect(lint.status == 0, "\(lint.stdout)")
        let explain = try await runPolicy(["explain", policy.path])
        #expect(explain.status == 0, "\(explain.stderr)")
    }

    @Test(.enabled(if: canChown, "needs root, to give a fixture to 'nobody'"))
    func aReloadTargetOfAnotherUserIsARefusedReload() async throws {
        let folder = try TemporaryDirectory()
        let policy = try folder.write("policy.yaml", "policy: 1\nname: small\nrules: []\n")
        let other = try folder.write("other.yaml", "policy: 1\nname: other\nrules: []\n")
        Self.giveToNobody(other.path)
        let script = try folder.write(
            "script.yaml",
            """
            requests:
              - { id: a, at: 10ms, responses: [{ status: 200 }] }
            reload:
              - { at: 1ms, policy: other.yaml }
            """)
        let run = try await runPolicy(["simulate", policy.path, "--script", script.path, "--format", "json"])
        #expect(run.status == 0, "\(run.stderr)")
        let reloads = run.stdoutLines.filter { $0.contains(#""event":"reload""#) }
        #expect(reloads.count == 1 && reloads.allSatisfy { $0.contains(#""ok":false"#) }, "\(reloads)")
    }

    /// A FIFO named as a secret file: `lint --check-env` says so at once instead of waiting for
    /// a writer.
    @Test func aFIFOAsASecretFileIsReportedNotWaitedOn() async throws {
        let folder = try TemporaryDirectory()
        let fifo = folder.url.appendingPathComponent("secret").path
        #expect(mkfifo(fifo, 0o600) == 0)
        let policy = try folder.write(
            "policy.yaml",
            """
            policy: 1
            name: x
            rules: [{ name: expired, when: { status: [401] }, then: refresh }]
            refresh:
              use: oauth2
              with: { token-url: "https://auth.example.com/token", client-id: app, client-secret-file: \(fifo) }
            """)
        let run = try await runPolicy(["lint", "--check-env", policy.path], timeout: 60)
        #expect(run.status == 1, "\(run.stdout)")
        #expect(
            run.stdout.contains(
                "the file '\(fifo)' named by 'client-secret-file' is not a regular file"),
            "\(run.stdout)")
    }
}
