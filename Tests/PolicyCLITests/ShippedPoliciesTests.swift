import Foundation
import ResponsePolicy
import TestSupport
import Testing

@testable import PolicyCLI

/// Every policy the repository ships must load: the ones in `policies/` with no finding at all,
/// the examples without errors.
struct ShippedPoliciesTests {
    /// Every `*.yaml`/`*.yml` under `policies/` and `examples/`, recursively, except simulation scripts.
    ///
    /// `examples/simulations/` holds `policy simulate` scripts: YAML, but not policies (SPEC §5).
    /// They are told apart as `policy lint` tells them apart, by ``SimulationScript/looksLikeScript(_:)``
    /// (a top-level `requests:` and no `policy:`), not by folder, so a policy put next to the
    /// scripts is still checked here. The scripts themselves are replayed by
    /// `ExampleSimulationTests` and linted as scripts by ``examplesFolderLintsWithoutErrorsThroughTheBinary()``.
    static let shippedFiles: [String] = (yamlFiles(under: "policies") + yamlFiles(under: "examples")).filter {
        !isSimulationScript($0) && !isPluginSchemaFile($0)
    }

    /// `examples/service/plugins.yaml` holds host plugin schemas (`policy lint --plugins`), not a policy.
    static func isPluginSchemaFile(_ relativePath: String) -> Bool {
        let path = repositoryRoot.appendingPathComponent(relativePath).path
        guard let bytes = try? Policy.readFile(path, limits: .default) else { return false }
        return PluginCatalog.isSchemaFile(Policy.parse(bytes: bytes, limits: .default).root)
    }

    static func isSimulationScript(_ relativePath: String) -> Bool {
        let path = repositoryRoot.appendingPathComponent(relativePath).path
        guard let bytes = try? Policy.readFile(path, limits: .default) else { return false }
        return SimulationScript.looksLikeScript(bytes)
    }

    @Test func theShippedPoliciesArePresent() {
        for name in ["policies/default.yaml", "policies/oauth2-401.yaml", "policies/transient.yaml"] {
            #expect(Self.shippedFiles.contains(name), "\(name) is missing")
        }
    }

    /// The host plugins the examples register (`examples/embedding/` registers `refresh:my-sso`).
    static let exampleCatalog: PluginCatalog = {
        var catalog = PluginCatalog()
        catalog.declare(.refresh, "my-sso")
        catalog.declare(.logout, "host-signout", schema: PluginSchema([]))  // examples/service/
        return catalog
    }()

    @Test(arguments: shippedFiles)
    func lintsWithoutErrors(_ relativePath: String) throws {
        let path = repositoryRoot.appendingPathComponent(relativePath).path
        let bytes = try Policy.readFile(path, limits: .default)
        let catalog = relativePath.hasPrefix("policies/") ? PluginCatalog() : Self.exampleCatalog
        let analysis = Policy.analyze(bytes: bytes, file: relativePath, catalog: catalog, limits: .default)
        let errors = analysis.diagnostics.filter { $0.severity == .error }
        #expect(errors.isEmpty, "\(errors.map(\.description).joined(separator: "\n"))")
        if relativePath.hasPrefix("policies/") {
            let warnings = analysis.diagnostics.filter { $0.severity == .warning }
            #expect(warnings.isEmpty, "\(warnings.map(\.description).joined(separator: "\n"))")
        }
        let policy = try Policy.load(path: path, plugins: catalog)
        #expect(!policy.rules.isEmpty || !policy.routes.isEmpty)
        #expect(!PolicyExplainer.explain(policy).isEmpty)
    }

    @Test func policiesFolderPassesStrictLintThroughTheBinary() async throws {
        let count = yamlFiles(under: "policies").count
        let result = try await runPolicy(["lint", "--strict", "policies"])
        expectResult(
            result, stdout: "\(count) file\(count == 1 ? "" : "s") checked: 0 errors, 0 warnings\n", status: 0)
    }

    @Test func examplesFolderLintsWithoutErrorsThroughTheBinary() async throws {
        let count = yamlFiles(under: "examples").count
        try #require(count > 0, "examples/ has no YAML files")
        let result = try await runPolicy([
            "lint", "--plugin", "refresh:my-sso", "--plugins",
            repositoryRoot.appendingPathComponent("examples/service/plugins.yaml").path, "examples",
        ])
        #expect(result.status == 0)
        #expect(result.stderr == "")
        #expect(result.stdoutLines.last?.hasPrefix("\(count) files checked: 0 errors, ") == true, "\(result.stdout)")
    }
}
