import Foundation
import TestSupport
import Testing

/// scripts/install.sh checks every build dependency before it builds (a clean machine once failed
/// minutes into the build on hiredis's missing header, which the script never checked).
@Suite(.serialized)
struct InstallScriptTests {
    static let script = repositoryRoot.appendingPathComponent("scripts/install.sh")

    /// Every Debian package a system library target of Package.swift names is in the script's list.
    @Test func theScriptChecksEverySystemLibraryOfThePackage() throws {
        let manifest = try String(contentsOf: repositoryRoot.appendingPathComponent("Package.swift"), encoding: .utf8)
        let script = try String(contentsOf: Self.script, encoding: .utf8)
        let listed = try #require(script.firstMatch(of: /build_packages=\(([^)]*)\)/)).1.split(separator: " ")
        let providers = manifest.matches(of: /\.apt\(\[([^\]]*)\]\)/).flatMap { match in
            match.1.split(separator: ",").map { $0.trimmingCharacters(in: CharacterSet(charactersIn: "\" ")) }
        }
        #expect(providers.contains("libyaml-dev"))
        #expect(providers.contains("libhiredis-dev"))
        for package in providers {
            #expect(listed.contains(Substring(package)), "install.sh does not check \(package)")
        }
        #expect(script.contains("a cold release build takes about"))
    }

    /// With a package missing and no root, the script names it and stops before building.
    @Test(arguments: ["libyaml-dev", "libhiredis-dev", "libcurl4-openssl-dev"])
    func aMissingPackageStopsTheScriptBeforeItBuilds(_ missing: String) async throws {
        let bin = try TemporaryDirectory()
        let log = bin.url.appendingPathComponent("swift.log").path
        // Stand-ins: dpkg knows every package but `missing`; swift records that it was called.
        try bin.write("dpkg", "#!/bin/sh\n[ \"$2\" = \"\(missing)\" ] && exit 1\nexit 0\n")
        try bin.write("swift", "#!/bin/sh\necho \"$@\" >> \(log)\n")
        try bin.write("pkg-config", "#!/bin/sh\nexit 0\n")
        try bin.write("id", "#!/bin/sh\necho 1000\n")
        for tool in ["dpkg", "swift", "pkg-config", "id"] {
            try FileManager.default.setAttributes(
                [.posixPermissions: 0o755], ofItemAtPath: bin.url.appendingPathComponent(tool).path)
        }
        let result = try await runExecutable(
            URL(fileURLWithPath: "/bin/bash"), [Self.script.path, "/nonexistent-prefix"],
            environment: ["PATH": bin.url.path + ":/usr/bin:/bin"])
        #expect(result.status == 2)
        #expect(result.stderr == "error: building needs: \(missing) (sudo apt-get install \(missing))\n")
        #expect(!FileManager.default.fileExists(atPath: log), "the script ran swift before checking")
    }
}
