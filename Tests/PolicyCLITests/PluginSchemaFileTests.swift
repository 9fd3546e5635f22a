import Foundation
import Testing

@testable import PolicyCLI
@testable import ResponsePolicy

/// Host plugin schemas exported from a registry and read by `policy lint --plugins`.
struct PluginSchemaFileTests {
    static func registry() -> PluginRegistry {
        var registry = PluginRegistry()
        registry.register(
            refresh: "my-sso",
            schema: PluginSchema(
                [
                    .init("realm", .string, required: true, "the SSO realm"),
                    .init("mode", .string, "how to log in", values: ["fast", "safe"]),
                    .init("timeout", .duration),
                ], forbiddenSecrets: ["api-key": "api-key-env"])
        ) { _ in CountingSSO() }
        registry.register(observe: "metrics") { _ in NoopObserver() }
        return registry
    }

    static let exported = """
        # Host plugins and their options, for `policy lint` (found beside the policies, or --plugins FILE).
        # Written by PluginRegistry.exportSchemas(); regenerate it when a plugin changes.
        plugins: 1
        refresh:
          "my-sso":
            options:
              "realm": { type: string, required: true, summary: "the SSO realm" }
              "mode": { type: string, summary: "how to log in", values: ["fast", "safe"] }
              "timeout": { type: duration }
            secrets:
              "api-key": "api-key-env"
        observe:
          "metrics": any

        """

    @Test func theRegistryExportsItsHostPluginsOnly() {
        #expect(Self.registry().exportSchemas() == Self.exported)
    }

    @Test func theExportReadsBackToTheSameCatalog() throws {
        var catalog = PluginCatalog()
        try catalog.declare(schemasYAML: Self.exported, file: "plugins.yaml")
        #expect(catalog == Self.registry().catalog)
    }

    @Test func lintWithThePluginsFileCatchesATypoInAHostPluginsOptions() async throws {
        let folder = try TemporaryDirectory()
        // Kept apart from the policy, so only --plugins reads it (one beside it would be found).
        let schemas = try folder.write("schemas/plugins.yaml", Self.exported)
        let policy = try folder.write(
            "sso.yaml",
            """
            policy: 1
            name: sso
            rules: [{ name: missing-scope, when: { status: [401], header: { WWW-Authenticate: '*insufficient_scope*' } }, then: deliver }, { when: { status: [401] }, then: refresh }]
            refresh: { use: my-sso, with: { realm: corp, mod: fast } }
            logout: { cooldown: 20s }
            observe: [{ use: metrics, with: { anything: goes } }]
            """)
        let declaredOnly = try await runPolicy([
            "lint", "--plugin", "refresh:my-sso", "--plugin", "observe:metrics", policy.path,
        ])
        #expect(declaredOnly.status == 0)  // a name alone lets the typo through
        let checked = try await runPolicy(["lint", "--plugins", schemas.path, policy.path])
        expectResult(
            checked,
            stdout: "\(policy.path):4:46: error: refresh plugin 'my-sso' has no option 'mod'; did you mean 'mode'? "
                + "[unknown-plugin-option]\n1 file checked: 1 error, 0 warnings\n",
            status: 1)
        // The schema file itself lints clean as part of a folder.
        let folderRun = try await runPolicy(["lint", "--plugins", schemas.path, folder.url.path])
        #expect(folderRun.stdout.hasSuffix("2 files checked: 1 error, 0 warnings\n"))
    }

    @Test func aBrokenPluginsFileIsAPositionedUsageError() async throws {
        let folder = try TemporaryDirectory()
        let schemas = try folder.write(
            "plugins.yaml", "plugins: 1\nrefresh:\n  my-sso:\n    options:\n      realm: { type: text }\n")
        let policy = try folder.write("p.yaml", "policy: 1\nname: p\n")
        let result = try await runPolicy(["lint", "--plugins", schemas.path, policy.path])
        #expect(result.status == 64)
        #expect(
            result.stderr.hasPrefix(
                "\(schemas.path):5:22: error: unknown option type 'text' [invalid-plugin-schema]\n"
                    + "Error: The plugin schema file '\(schemas.path)' is not valid\n"))
        let missing = try await runPolicy(["lint", "--plugins", folder.url.path + "/none.yaml", policy.path])
        #expect(missing.status == 66)
    }
}

private struct CountingSSO: RefreshPlugin {
    func refresh(_ context: RefreshContext) async throws -> Credentials { Credentials(accessToken: "t") }
}

private struct NoopObserver: PolicyObserver {
    func observe(_ event: PolicyEvent) {}
}
