import Foundation
@_exported import TestSupport
import Testing

@testable import ResponsePolicy

/// Every finding for a policy text, as `policy lint` would report it.
func findings(_ yaml: String, catalog: PluginCatalog = PluginCatalog(), limits: YAMLLimits = .default) -> [Diagnostic] {
    Policy.analyze(bytes: Array(yaml.utf8), file: "test.yaml", catalog: catalog, limits: limits).diagnostics
}

/// The findings rendered one per line, `test.yaml:L:C: severity: message [rule]`.
func rendered(_ yaml: String) -> String {
    findings(yaml).map(\.description).joined(separator: "\n")
}

/// The errors only, rendered one per line.
func renderedErrors(_ yaml: String) -> String {
    findings(yaml).filter { $0.severity == .error }.map(\.description).joined(separator: "\n")
}

/// Loads a policy that must be valid, recording its errors otherwise.
func validPolicy(_ yaml: String, sourceLocation: SourceLocation = #_sourceLocation) throws -> Policy {
    do {
        return try Policy.load(yaml: yaml, file: "test.yaml")
    } catch {
        Issue.record("policy did not load: \(error)", sourceLocation: sourceLocation)
        throw error
    }
}
