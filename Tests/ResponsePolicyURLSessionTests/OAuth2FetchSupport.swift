import Foundation
import Testing

/// What `AuthlibTests` and `DjangoOAuthToolkitTests` run: the built `policy fetch` of an API,
/// 64 requests at once, through the `oauth2` refresh plugin against a real authorization server.
struct OAuth2Fetch {
    /// The policy's `name:`, and a prefix for the temporary folder.
    var name: String
    var tokenURL: URL
    var grant: String
    var client: String
    var auth: String
    /// Further plugin options, one `key: value` line each (`client-auth-encoding: raw`).
    var options: [String] = []
    /// The variables the plugin reads its secrets from: the client secret's, and for the
    /// password grant the user's and the password's.
    var secretVariable: String
    var userVariable: String
    var passwordVariable: String
    /// The policy's `dispatch:` line, if any (the default, `auto`, otherwise).
    var dispatch: String?

    /// `policy fetch` of `api` `count` times, 64 at once; a `refresh_token` grant starts from
    /// `refreshToken` (stored with a stale access token); `transport` is `--transport`'s value.
    func run(
        _ api: URL, count: Int, refreshToken: String?, transport: String?, environment: [String: String]
    ) async throws -> PolicyRun {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("\(name)-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        var lines = [
            "token-url: \(tokenURL.absoluteString)", "grant: \(grant)", "client-id: \(client)",
            "client-secret-env: \(secretVariable)", "client-auth: \(auth)",
        ]
        lines += options
        if grant == "password" { lines += ["username-env: \(userVariable)", "password-env: \(passwordVariable)"] }
        let policy = """
            policy: 1
            name: \(name)
            rules:
              - { name: unauthorized, when: { status: [401] }, then: refresh }
              - { name: transient, when: { status: [502, 503, 504], error: [timeout, connection] }, then: retry }
            refresh:
              use: oauth2
              with:
            \(lines.map { "    " + $0 + "\n" }.joined())retry: { initial: 50ms, max-delay: 500ms, attempt-timeout: 5s }
            \(dispatch ?? "")

            """
        let policyFile = directory.appendingPathComponent("policy.yaml")
        try Data(policy.utf8).write(to: policyFile)
        var arguments = [
            "fetch", "--policy", policyFile.path, "--concurrency", "64", "--count", "\(count)", api.absoluteString,
        ]
        if let transport { arguments.insert(contentsOf: ["--transport", transport], at: 1) }
        if grant == "refresh_token" {
            let credentials = directory.appendingPathComponent("credentials.json")
            try Data(#"{"access_token": "stale", "refresh_token": "\#(refreshToken ?? "")"}"#.utf8).write(
                to: credentials)
            try FileManager.default.setAttributes([.posixPermissions: 0o600], ofItemAtPath: credentials.path)
            arguments.insert(contentsOf: ["--credentials", credentials.path], at: 1)
        }
        return try await runPolicy(arguments, environment: environment)
    }
}

extension PolicyRun {
    /// The line `policy fetch` ends with (`N delivered, N failed, N logged out; …`).
    var summary: String { stdout.split(separator: "\n").last.map(String.init) ?? "" }

    /// Expects a run that exited 0 with all `count` requests delivered and nobody logged out.
    func expectEverythingDelivered(_ count: Int, sourceLocation: SourceLocation = #_sourceLocation) {
        #expect(status == 0, "\(summary)\n\(stderr.suffix(2000))", sourceLocation: sourceLocation)
        #expect(
            summary.contains("\(count) delivered, 0 failed, 0 logged out"), "\(summary)", sourceLocation: sourceLocation
        )
        #expect(summary.contains("0 logouts"), "\(summary)", sourceLocation: sourceLocation)
    }
}
