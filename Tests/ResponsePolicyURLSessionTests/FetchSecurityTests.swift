import Foundation
import ResponsePolicy
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// `policy fetch` against `test_server.py`: body limits, refresh failures said plainly, no
/// secret echoed by a usage error, no FIFO opened as credentials.
struct FetchSecurityTests {
    @Test func maxBodyFailsARequestWhoseBodyIsTooLarge() async throws {
        try await withTestServer { server in
            try await withScratch { directory in
                let policy = directory + "/policy.yaml"
                try Data("policy: 1\nname: big\nrules: []\n".utf8).write(to: URL(fileURLWithPath: policy))
                let url = server.url("/big?bytes=5000").absoluteString
                let small = try await runPolicy(["fetch", "--policy", policy, "--max-body", "4KiB", url])
                #expect(small.status == 1)
                #expect(
                    small.stdout.contains(
                        "failed: transport failed: too-large error: GET http://127.0.0.1:\(server.port)/big: the response body is larger than 4 KiB (max-body)"
                    ), "\(small.stdout)")
                let large = try await runPolicy(["fetch", "--policy", policy, "--max-body", "5000", url])
                #expect(large.status == 0, "\(large.stdout)")
                let bad = try await runPolicy(["fetch", "--policy", policy, "--max-body", "lots", url])
                #expect(bad.status == 64)
                #expect(bad.stderr.hasPrefix("Error: Invalid value 'lots' for '--max-body <size>'"))
            }
        }
    }

    @Test func aLogoutAfterAFailedRefreshNamesTheFailureAndItsReason() async throws {
        try await withTestServer { server in
            try await server.control(["token_mode": "invalid_grant"])
            try await withScratch { directory in
                let policy = directory + "/policy.yaml"
                try Data(
                    """
                    policy: 1
                    name: refresh-fails
                    classify: { code: body.status }
                    rules:
                      - { name: token-expired, when: { code: [1401] }, then: refresh }
                    refresh:
                      use: oauth2
                      with: { token-url: "http://127.0.0.1:\(server.port)/oauth/token", client-id: app }
                    """.utf8
                ).write(to: URL(fileURLWithPath: policy))
                let credentials = directory + "/credentials.json"
                try Data(#"{"access_token":"stale","refresh_token":"refresh-0"}"#.utf8)
                    .write(to: URL(fileURLWithPath: credentials))
                chmod(credentials, 0o600)
                let run = try await runPolicy([
                    "fetch", "--policy", policy, "--credentials", credentials,
                    server.url("/api/items").absoluteString,
                ])
                #expect(run.status == 1)
                let note =
                    "logged out because the token refresh failed: the token endpoint answered 400 (invalid_grant)"
                #expect(run.stdout.contains("logged-out: \(note); new requests fail until "), "\(run.stdout)")
                #expect(run.stderr.contains("policy: \(note)"), "\(run.stderr)")
                #expect(!run.stdout.contains("'refresh failed'"))
            }
        }
    }

    @Test func aFIFOAsCredentialsIsRefusedNotWaitedOn() async throws {
        try await withScratch { directory in
            let policy = directory + "/policy.yaml"
            try Data("policy: 1\nname: x\nrules: []\n".utf8).write(to: URL(fileURLWithPath: policy))
            let fifo = directory + "/credentials.json"
            #expect(mkfifo(fifo, 0o600) == 0)
            let run = try await runPolicy(["fetch", "--policy", policy, "--credentials", fifo, "http://127.0.0.1:1/"])
            #expect(run.status == 66)
            #expect(run.stderr == "error: cannot read the credentials file '\(fifo)': it is not a regular file\n")
        }
    }

    @Test func aCredentialsFileOpenToOthersIsWarnedAboutAndMade0600() async throws {
        try await withTestServer { server in
            try await withScratch { directory in
                let policy = directory + "/policy.yaml"
                try Data("policy: 1\nname: x\nrules: []\n".utf8).write(to: URL(fileURLWithPath: policy))
                let credentials = directory + "/credentials.json"
                try Data(#"{"access_token":"access-0"}"#.utf8).write(to: URL(fileURLWithPath: credentials))
                chmod(credentials, 0o644)
                let run = try await runPolicy([
                    "fetch", "--policy", policy, "--credentials", credentials, server.url("/api/x").absoluteString,
                ])
                #expect(run.status == 0)
                #expect(
                    run.stderr
                        == "warning: the credentials file '\(credentials)' was open to others (mode 644); its mode is now 0600\n"
                )
                let mode = try FileManager.default.attributesOfItem(atPath: credentials)[.posixPermissions] as? NSNumber
                #expect(mode?.intValue == 0o600)
            }
        }
    }

    @Test(arguments: ["Authorization Bearer SECRET-hdr-1", "Authorization=SECRET-hdr-1", "X Token SECRET-hdr-1: v"])
    func aMalformedHeaderIsNamedNotEchoed(_ header: String) async throws {
        let run = try await runPolicy([
            "fetch", "--policy", "/nonexistent.yaml", "-H", header, "http://127.0.0.1:1/",
        ])
        #expect(run.status == 64)
        #expect(!run.stderr.contains("SECRET"), "\(run.stderr)")
        #expect(run.stderr.hasPrefix("Error: Invalid header"), "\(run.stderr)")
    }
}

/// Runs `body` in a fresh scratch directory, removed afterwards.
func withScratch(_ body: (String) async throws -> Void) async throws {
    let directory = FileManager.default.temporaryDirectory.appendingPathComponent("rp-sec-\(UUID().uuidString)").path
    try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(atPath: directory) }
    try await body(directory)
}
