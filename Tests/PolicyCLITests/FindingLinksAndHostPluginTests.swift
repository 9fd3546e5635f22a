import Foundation
import ResponsePolicy
import TestSupport
import Testing

@testable import PolicyCLI

/// Two things lint finds on its own where it runs: the documentation a finding's `doc` link
/// points at (once `docs/lint-rules.md#RULE`, a repository path nobody with the installed binary
/// or the .deb could open), and the host plugins a schema file beside the policies declares (once
/// only `--plugins`, so `policy lint examples/` failed on the service example's plugin).
@Suite(.serialized)
struct FindingLinksAndHostPluginTests {
    // MARK: - Where `doc` links point

    @Test func theInstalledDocsBesideTheBinaryAreLinkedAsAFileURL() throws {
        let prefix = try TemporaryDirectory()
        try prefix.write("share/doc/policy/docs/lint-rules.md", "# Lint rules\n")
        try prefix.makeFolder("bin")
        let links = DocumentationLinks.find(environment: [:], executable: prefix.url.path + "/bin/policy")
        let docs = prefix.url.appendingPathComponent("share/doc/policy/docs").standardizedFileURL.absoluteString
        #expect(links.lintRule("shadowed-rule") == docs.trimmingSuffix("/") + "/lint-rules.md#shadowed-rule")
        #expect(links.lintRule("x").hasPrefix("file:///"))
        #expect(!links.isWebURL)
    }

    @Test func aCheckoutsBuildFolderLinksToItsDocs() throws {
        let links = DocumentationLinks.find(
            environment: [:],
            executable: repositoryRoot.path + "/.build/x86_64-unknown-linux-gnu/debug/policy")
        #expect(links.lintRule("unknown-key") == lintRuleDoc("unknown-key"))
    }

    @Test func policyDocsURLWinsAndIsAWebLink() {
        let links = DocumentationLinks.find(
            environment: ["POLICY_DOCS_URL": "https://git.example.com/acme/rp/blob/v1/docs/"],
            executable: repositoryRoot.path + "/.build/debug/policy")
        #expect(
            links.lintRule("unknown-key") == "https://git.example.com/acme/rp/blob/v1/docs/lint-rules.md#unknown-key")
        #expect(links.isWebURL)
    }

    @Test func aBinaryWithNoDocsNearbyFallsBackToTheRepositoryPath() throws {
        let elsewhere = try TemporaryDirectory()
        let links = DocumentationLinks.find(environment: [:], executable: elsewhere.url.path + "/policy")
        #expect(links.lintRule("unknown-key") == "docs/lint-rules.md#unknown-key")
    }

    /// Through the binary: the link opens a file that has the rule's section, and a served copy
    /// also gives SARIF its `helpUri`.
    @Test func theBinarysLinksOpenTheRulesSection() async throws {
        let dir = try TemporaryDirectory()
        try dir.write("p.yaml", "policy: 1\nname: t\nretyr: {}\n")
        let result = try await runPolicy(["lint", "--format", "json", "p.yaml"], in: dir.url)
        let object = try #require(try JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [String: Any])
        let doc = try #require((object["diagnostics"] as? [[String: Any]])?.first?["doc"] as? String)
        let parts = doc.split(separator: "#").map(String.init)
        let file = try #require(URL(string: parts[0]))
        #expect(file.isFileURL)
        let reference = try String(contentsOf: file, encoding: .utf8)
        #expect(parts.count == 2 && reference.contains("\n## \(parts[1])\n"), "\(doc)")
    }

    // MARK: - Host plugins declared beside the policies

    static let schemas = """
        plugins: 1
        refresh:
          "my-sso":
            options:
              "realm": { type: string, required: true, summary: "the SSO realm" }

        """
    static let policy = """
        policy: 1
        name: sso
        rules: [{ name: missing-scope, when: { status: [401], header: { WWW-Authenticate: '*insufficient_scope*' } }, then: deliver }, { name: expired, when: { status: [401] }, then: refresh }]
        refresh:
          use: my-sso
          with: { realm: staff }
          on-exhausted: fail
          on-failure: fail

        """

    /// What `policy lint examples/` needed: a schema file in a folder declares its plugins for the
    /// policies in that folder and below, and its options are checked (a missing `realm` is still
    /// an error).
    @Test func aSchemaFileInTheSearchedFolderDeclaresItsPluginsForThePoliciesBelowIt() async throws {
        let dir = try TemporaryDirectory()
        try dir.write("service/plugins.yaml", Self.schemas)
        try dir.write("service/policy.yaml", Self.policy)
        try dir.write(
            "service/staging/policy.yaml", Self.policy.replacingOccurrences(of: "  with: { realm: staff }\n", with: ""))
        try dir.write("other/policy.yaml", Self.policy)
        let result = try await runPolicy(["lint", "service", "other"], in: dir.url)
        expectResult(
            result,
            stdout: """
                service/staging/policy.yaml:5:8: error: refresh plugin 'my-sso' needs the option 'realm' (the SSO realm) [missing-plugin-option]
                other/policy.yaml:5:8: error: unknown refresh plugin 'my-sso' (known: exec, http, oauth2; declare a host plugin with --plugin refresh:my-sso) [unknown-plugin]
                4 files checked: 2 errors, 0 warnings

                """,
            status: 1)
    }

    /// A policy named on its own finds the schema file beside it.
    @Test func aPolicyNamedOnItsOwnFindsTheSchemaFileBesideIt() async throws {
        let dir = try TemporaryDirectory()
        try dir.write("plugins.yaml", Self.schemas)
        try dir.write("policy.yaml", Self.policy)
        let result = try await runPolicy(["lint", "--strict", "policy.yaml"], in: dir.url)
        expectResult(result, stdout: "1 file checked: 0 errors, 0 warnings\n", status: 0)
    }

    /// The newcomer's command, as README and the examples' folder invite it: clean.
    @Test func theExamplesFolderLintsCleanWithNoFlags() async throws {
        let count = yamlFiles(under: "examples").count
        let result = try await runPolicy(["lint", "examples"])
        expectResult(result, stdout: "\(count) files checked: 0 errors, 0 warnings\n", status: 0)
    }
}

extension String {
    fileprivate func trimmingSuffix(_ suffix: String) -> String {
        hasSuffix(suffix) ? String(dropLast(suffix.count)) : self
    }
}
