import Foundation
import ResponsePolicy
import TestGate
import Testing

/// `policy fetch` against `Fixtures/test_server.py` with secrets in the places the existing
/// `EngineIntegrationTests.fetchNeverPrintsTokensOrTheClientSecret` does not cover: a token signed
/// into the query string, a secret in the URL the caller gives, the caller's own Authorization and
/// API-key headers, a secret in the request body, and answers that echo all of them back. Every
/// run prints every event (`--verbose`) and ends in a failure whose description is printed.
@Suite(.loadGate(.realTime))
struct FetchRedactionTests {
    static let accessToken = "PLANTED-ACCESS-5e21"
    static let refreshToken = "PLANTED-REFRESH-0b7c"

    /// The query authorizer puts the access token in the URL; the caller's URL has a secret of its
    /// own; the server cuts every answer short, so the run ends with the transport's error.
    @Test func aTokenInTheQueryStringIsNotPrintedWithATransportError() async throws {
        try await withTestServer { server in
            try await server.control(["drop_count": 10, "refresh_token": Self.refreshToken])
            try await withFetchFiles(authorize: "{ use: query, with: { name: access_token } }", server: server) {
                policy, credentials in
                let url = server.url("/drop?api_key=PLANTED-URL-KEY-93d0").absoluteString
                let run = try await runFetch(["--verbose", "--policy", policy, "--credentials", credentials, url])
                #expect(run.status == 1)
                let lines = run.stdout.split(separator: "\n").map(String.init)
                #expect(lines.count == 2, "\(run.stdout)")
                let failure = "failed: retries exhausted; last attempt: connection error: GET "
                #expect(lines.first?.contains(failure + server.url("/drop").absoluteString) == true, "\(run.stdout)")
                #expect(run.stderr.contains(#""event":"outcome""#), "--verbose printed the events")
                #expect(!(run.stdout + run.stderr).contains("PLANTED"), "\(run.stdout)\(run.stderr)")
                #expect(try await server.stats().counters["drop_calls"] == 2)
            }
        }
    }

    /// The caller sends its own Authorization and API-key headers and a secret body to `/echo`,
    /// which answers with all of it (and the signed token); a `fail` rule turns that answer into
    /// the printed error.
    @Test(arguments: ["{ use: header, with: { name: X-Auth-Token } }", "{ use: query, with: { name: access_token } }"])
    func theCallersHeadersAndBodyAreNotPrintedWhenTheEchoFails(_ authorize: String) async throws {
        try await withTestServer { server in
            try await withFetchFiles(authorize: authorize, server: server) { policy, credentials in
                let run = try await runFetch([
                    "--verbose", "--policy", policy, "--credentials", credentials, "-X", "POST",
                    "-H", "Authorization: Bearer PLANTED-CALLER-a4f1", "-H", "X-Api-Key: PLANTED-KEY-77e0",
                    "-d", "password=PLANTED-BODY-1c9b", server.url("/echo").absoluteString,
                ])
                #expect(run.status == 1)
                let line = run.stdout.split(separator: "\n").first.map(String.init) ?? ""
                #expect(line.hasPrefix("r1 200 code=- attempts=1 "), "\(line)")
                #expect(
                    line.range(
                        of: #"ms failed: rule 'echoed' failed the request \(HTTP 200 \([0-9]+ bytes\)\)$"#,
                        options: .regularExpression) != nil, "\(line)")
                #expect(!(run.stdout + run.stderr).contains("PLANTED"), "\(run.stdout)\(run.stderr)")
                #expect(try await server.stats().counters["echo_calls"] == 1)
            }
        }
    }
}

// MARK: - Helpers

/// Writes a policy (with `authorize`) and a credentials file holding the planted tokens, and
/// passes their paths to `body`.
private func withFetchFiles(
    authorize: String, server: TestServer, _ body: (String, String) async throws -> Void
) async throws {
    let directory = FileManager.default.temporaryDirectory.appendingPathComponent("rp-redact-\(UUID().uuidString)")
    try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(at: directory) }
    let policy = directory.appendingPathComponent("policy.yaml")
    let credentials = directory.appendingPathComponent("credentials.json")
    try Data(
        """
        policy: 1
        name: redaction
        classify: { code: body.status }
        rules:
          - { name: token-expired, when: { code: [1401] }, then: refresh }
          - { name: echoed, when: { status: [200], path: "/echo" }, then: fail }
          - { name: transient, when: { status: [503], error: [connection, timeout] }, then: retry }
        authorize: \(authorize)
        refresh:
          use: oauth2
          with: { token-url: "http://127.0.0.1:\(server.port)/oauth/token", client-id: app }
          on-exhausted: fail
          on-failure: fail
        retry: { max-retries: 1, backoff: constant, initial: 50ms, attempt-timeout: 5s }
        routes:
          - match: { path: "/oauth/*" }
            rules: []
        """.utf8
    ).write(to: policy)
    let (access, refresh) = (FetchRedactionTests.accessToken, FetchRedactionTests.refreshToken)
    let json = #"{"access_token":"\#(access)","refresh_token":"\#(refresh)"}"#
    try Data(json.utf8).write(to: credentials)
    try await body(policy.path, credentials.path)
}

/// Runs `policy fetch arguments` through the integration tests' `runPolicy`.
private func runFetch(_ arguments: [String]) async throws -> PolicyRun {
    try await runPolicy(["fetch"] + arguments)
}
