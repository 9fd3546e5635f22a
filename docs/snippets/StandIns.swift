// What the documentation's snippets take from the service around them: its own SSO client,
// its session, a logger. Stand-ins so the snippets compile (DocsTests compares each snippet in
// docs/ with its region in these files; `swift build` compiles them).
import Foundation
import ResponsePolicy

/// A service's own SSO client (service-guide.md, "Register your plugins").
struct SSOClient: Sendable {
    func newAccessToken(realm: String) async throws -> (String, TimeInterval) { ("token", 3600) }
}

/// A service's session (service-guide.md, "The host's logout").
struct AppSession: Sendable {
    func signOut(reason: String) async {}
}

/// The part of a logger the snippets call (swift-log's `Logger` in a real service).
struct SnippetLogger: Sendable {
    func warning(_ message: String) {}
    func error(_ message: String) {}
    func critical(_ message: String) {}
}
