import Foundation
import ResponsePolicy
import TestSupport
import Testing

@testable import PolicyCLI

/// docs/plugins.md is printed from the plugins' option schemas, the ones lint checks `with:`
/// against, so an option added to a plugin cannot be missing from the reference.
struct PluginReferenceTests {
    @Test func thePluginReferenceInDocsIsGeneratedFromThePluginSchemas() async throws {
        let file = try String(contentsOf: repositoryRoot.appendingPathComponent("docs/plugins.md"), encoding: .utf8)
        let result = try await runPolicy(["schema", "--list-plugins"])
        #expect(result.status == 0)
        #expect(result.stderr == "")
        #expect(file == result.stdout, "run: swift run policy schema --list-plugins > docs/plugins.md")
    }

    /// Every option of every built-in plugin has a row under its plugin's heading, and a plugin
    /// that takes none says so: the reference is complete whatever the schemas hold.
    @Test func everyBuiltinOptionHasItsRowUnderItsPlugin() throws {
        let catalog = PluginCatalog()
        let markdown = PluginOptionsReference.markdown(catalog: catalog)
        var checked = 0
        for kind in PluginKind.allCases {
            for name in catalog.names(kind) where catalog.isBuiltin(kind, name) {
                let heading = "### \(kind.rawValue): \(name)\n"
                let start = try #require(markdown.range(of: heading), "no heading for \(kind.rawValue) \(name)")
                let section = markdown[start.upperBound...].prefix { $0 != "#" }
                let options = catalog.schema(kind, name)??.options ?? []
                if options.isEmpty { #expect(section.contains("Takes no options.")) }
                for option in options {
                    #expect(
                        section.contains("| `\(option.name)` | \(option.type.rawValue) | "),
                        "\(kind.rawValue) \(name) lacks '\(option.name)'")
                    checked += 1
                }
            }
        }
        // The http refresh plugin's lifetime and rotated-token paths were once only in the schema.
        #expect(markdown.contains("| `refresh-token` | value path | no |"))
        #expect(markdown.contains("| `expires-in` | value path | no |"))
        #expect(checked > 20)
    }
}
