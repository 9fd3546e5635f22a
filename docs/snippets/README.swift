// snippet: readme
import ResponsePolicy
import ResponsePolicyURLSession
// snippet end

import Foundation

/// README.md, "A policy".
func readmeSnippet(policyURL: URL, profileURL: URL) async throws {
    // snippet: readme
    let policy = try Policy.load(contentsOf: policyURL)
    let engine = PolicyEngine(
        policy: policy, transport: URLSessionTransport(),
        credentials: FileCredentialStore(path: "/var/lib/myservice/credentials.json"))   // tokens, rotated in place
    let response = try await engine.send(HTTPRequest(url: profileURL))   // refreshed, retried, or a typed error
    // snippet end
    _ = response
}
