import Foundation
import TestSupport
import Testing

/// The binary `scripts/install.sh PREFIX` installs, run as an ops machine runs it: from a clean
/// folder, with an empty environment, no toolchain on PATH.
///
/// The static release build takes minutes, so this suite runs only when `POLICY_INSTALLED_BINARY`
/// names an installed binary; `.ci/run` builds one with `scripts/install.sh` and sets it.
@Suite(.enabled(if: installedBinary != nil, "set POLICY_INSTALLED_BINARY to a binary from scripts/install.sh"))
struct InstalledBinaryTests {
    func run(_ arguments: [String], in directory: URL) async throws -> CLIResult {
        try await runExecutable(try #require(installedBinary), arguments, in: directory, timeout: 60, environment: [:])
    }

    @Test func runsWithAnEmptyEnvironmentFromACleanFolder() async throws {
        let dir = try TemporaryDirectory()
        let policy = try String(
            contentsOf: repositoryRoot.appendingPathComponent("policies/default.yaml"), encoding: .utf8)
        try dir.write("policy.yaml", policy)
        let script = try String(
            contentsOf: repositoryRoot.appendingPathComponent("examples/simulations/01-refresh-storm.yaml"),
            encoding: .utf8)
        try dir.write(
            "script.yaml", script.replacingOccurrences(of: "../../policies/default.yaml", with: "policy.yaml"))

        let version = try await run(["--version"], in: dir.url)
        #expect(version.status == 0)
        #expect(version.stdout.hasPrefix("policy "))

        let lint = try await run(["lint", "policy.yaml"], in: dir.url)
        #expect(lint.status == 0, "\(lint.stdout)\(lint.stderr)")
        #expect(lint.stdout == "1 file checked: 0 errors, 0 warnings\n")

        let test = try await run(["test", "script.yaml"], in: dir.url)
        #expect(test.status == 0, "\(test.stdout)\(test.stderr)")

        let schema = try await run(["schema"], in: dir.url)
        #expect(schema.status == 0)
        #expect(try JSONSerialization.jsonObject(with: Data(schema.stdout.utf8)) is [String: Any])

        let explain = try await run(["explain", "policy.yaml"], in: dir.url)
        #expect(explain.status == 0)
    }

    /// A finding's `doc` link opens the documentation `scripts/install.sh` put beside the binary
    /// (PREFIX/share/doc/policy), not a repository path the machine has no copy of; the man page
    /// is installed too.
    @Test func findingsLinkToTheDocumentationInstalledBesideTheBinary() async throws {
        let binary = try #require(installedBinary)
        let prefix = binary.resolvingSymlinksInPath().deletingLastPathComponent().deletingLastPathComponent()
        let dir = try TemporaryDirectory()
        try dir.write("p.yaml", "policy: 1\nname: t\nretyr: {}\n")
        let lint = try await run(["lint", "--format", "json", "p.yaml"], in: dir.url)
        let docs = prefix.appendingPathComponent("share/doc/policy/docs").standardizedFileURL.absoluteString
        let expected = (docs.hasSuffix("/") ? docs : docs + "/") + "lint-rules.md#unknown-key"
        #expect(lint.stdout.contains(#""doc":"\#(expected)""#), "\(lint.stdout)")
        let reference = try String(
            contentsOf: prefix.appendingPathComponent("share/doc/policy/docs/lint-rules.md"), encoding: .utf8)
        #expect(reference.contains("\n## unknown-key\n"))
        #expect(FileManager.default.fileExists(atPath: prefix.appendingPathComponent("share/man/man1/policy.1").path))
    }

    /// Only libyaml, libcurl and the C/C++ runtime: no Swift runtime library is loaded.
    @Test func linksNoSwiftRuntimeDynamically() async throws {
        let binary = try #require(installedBinary)
        guard FileManager.default.isExecutableFile(atPath: "/usr/bin/ldd") else { return }
        let result = try await runExecutable(URL(fileURLWithPath: "/usr/bin/ldd"), [binary.path])
        #expect(result.status == 0)
        #expect(!result.stdout.contains("libswift"), "\(result.stdout)")
        #expect(!result.stdout.contains("libFoundation"), "\(result.stdout)")
        #expect(result.stdout.contains("libyaml"))
    }
}

let installedBinary: URL? = ProcessInfo.processInfo.environment["POLICY_INSTALLED_BINARY"].flatMap {
    $0.isEmpty ? nil : URL(fileURLWithPath: $0)
}
