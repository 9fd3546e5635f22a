import Foundation

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// A loaded, checked and compiled policy.
///
/// Loading parses the YAML, checks it against schema 1 and every lint rule, and compiles the
/// rule graph the engine runs. A policy with any error is refused (``PolicyError/invalid(file:diagnostics:)``
/// carries every finding); warnings are kept in ``warnings``.
///
/// ```swift
/// let policy = try Policy.load(contentsOf: URL(fileURLWithPath: "policies/default.yaml"))
/// print(policy.name, policy.warnings.count)
/// ```
public struct Policy: Sendable {
    /// The policy's `name:`.
    public let name: String
    package let classify: CodeSource?
    package let rules: [Rule]
    package let refresh: RefreshSettings
    package let logout: LogoutSettings
    package let retry: RetrySettings
    package let authorize: PluginReference
    package let store: PluginReference
    package let observe: [PluginReference]
    /// `coordination:`: who shares the session with this process; `local` (nobody) by default.
    package let coordination: PluginReference
    package let routes: [Route]
    /// The `dispatch:` section: how many requests go out at once per host.
    package let dispatch: DispatchSettings
    /// The compiled graph the engine runs.
    package let graph: RuleGraph
    /// Lint warnings (errors make loading fail).
    public let warnings: [Diagnostic]
    /// The file it was loaded from, as named by the caller.
    public let file: String?

    init(parts: PolicyParts, graph: RuleGraph, warnings: [Diagnostic], file: String?) {
        name = parts.name
        classify = parts.classify
        rules = parts.rules
        refresh = parts.refresh
        logout = parts.logout
        retry = parts.retry
        authorize = parts.authorize
        store = parts.store
        observe = parts.observe
        coordination = parts.coordination
        routes = parts.routes
        dispatch = parts.dispatch
        self.graph = graph
        self.warnings = warnings
        self.file = file
    }

    /// Loads a policy file.
    ///
    /// - Parameters:
    ///   - url: the YAML file.
    ///   - plugins: the plugin names `use:` may name; the built-ins by default. Pass the catalog
    ///     of the registry your engine uses so host plugins are accepted.
    ///   - limits: input bounds, ``YAMLLimits/default`` by default.
    /// - Throws: ``PolicyError/unreadable(path:reason:)`` when the file cannot be read,
    ///   ``PolicyError/invalid(file:diagnostics:)`` when it has errors.
    public static func load(
        contentsOf url: URL, plugins: PluginCatalog = PluginCatalog(), limits: YAMLLimits = .default
    ) throws(PolicyError) -> Policy {
        let bytes = try readFile(url.path, limits: limits)
        return try load(bytes: bytes, file: url.path, plugins: plugins, limits: limits)
    }

    /// Loads a policy file, naming it in diagnostics exactly as `path` is written.
    public static func load(
        path: String, plugins: PluginCatalog = PluginCatalog(), limits: YAMLLimits = .default
    ) throws(PolicyError) -> Policy {
        try load(path: path, plugins: plugins, limits: limits, owner: .userOrRoot)
    }

    /// ``load(path:plugins:limits:)`` for a file of any owner when `owner` is `.anyone`: the
    /// tools that only read a policy (`explain`, `graph`, `diff`) take one a colleague wrote.
    package static func load(
        path: String, plugins: PluginCatalog = PluginCatalog(), limits: YAMLLimits = .default, owner: SafeFile.Owner
    ) throws(PolicyError) -> Policy {
        try load(bytes: try readFile(path, limits: limits, owner: owner), file: path, plugins: plugins, limits: limits)
    }

    /// Loads a policy from YAML text. `file` names it in diagnostics.
    public static func load(
        yaml: String, file: String? = nil, plugins: PluginCatalog = PluginCatalog(), limits: YAMLLimits = .default
    ) throws(PolicyError) -> Policy {
        try load(bytes: Array(yaml.utf8), file: file, plugins: plugins, limits: limits)
    }

    static func load(bytes: [UInt8], file: String?, plugins: PluginCatalog, limits: YAMLLimits) throws(PolicyError)
        -> Policy
    {
        let analysis = analyze(bytes: bytes, file: file, catalog: plugins, limits: limits)
        guard let policy = analysis.policy, !analysis.diagnostics.hasErrors else {
            throw .invalid(file: file, diagnostics: analysis.diagnostics)
        }
        return policy
    }

    /// Reads a file with the size limit applied before reading it whole, through ``SafeFile``: a
    /// link at the end of the path only when it is this user's or root's, never a FIFO or a
    /// device, and, for a policy that will run (`owner: .userOrRoot`, the default), only a file
    /// of this user or root.
    package static func readFile(
        _ path: String, limits: YAMLLimits, owner: SafeFile.Owner = .userOrRoot
    ) throws(PolicyError) -> [UInt8] {
        do {
            guard let bytes = try SafeFile.read(path, limit: limits.maxFileBytes, owner: owner) else {
                throw PolicyError.unreadable(path: path, reason: PolicyError.noSuchFile)
            }
            return bytes
        } catch let error as PolicyError {
            throw error
        } catch let failure as SafeFile.Failure {
            throw .unreadable(path: path, reason: failure.reason)
        } catch {
            throw .unreadable(path: path, reason: "read failed")
        }
    }

    /// The result of checking one file: the policy when it compiled, and every finding.
    package struct Analysis: Sendable {
        package var policy: Policy?
        package var diagnostics: [Diagnostic]
        /// The file's bytes: the caller's own array, not a copy.
        package var bytes: [UInt8]
        /// The file as text, for rendering findings: made when asked, so that checking a file
        /// holds no second copy of it while the graph is built.
        package var source: String { String(decoding: bytes, as: UTF8.self) }
    }

    /// A file parsed into its YAML tree; `root` is `nil` when parsing failed (the diagnostics
    /// say why) or the file is empty.
    package struct Parsed: Sendable {
        package var root: YAMLNode?
        package var diagnostics: [Diagnostic]
        /// The file's bytes: the caller's own array, not a copy.
        package var bytes: [UInt8]
        /// The file as text, made when asked (see ``Analysis/source``).
        package var source: String { String(decoding: bytes, as: UTF8.self) }
    }

    /// Parses YAML once, for callers that decide what the document is before analysing it.
    package static func parse(bytes: [UInt8], limits: YAMLLimits) -> Parsed {
        var diagnostics: [Diagnostic] = []
        do {
            let root = try YAMLLoader(limits: limits).load(bytes, diagnostics: &diagnostics)
            return Parsed(root: root, diagnostics: diagnostics, bytes: bytes)
        } catch {
            if case .syntax(let diagnostic) = error { diagnostics.append(diagnostic) }
            return Parsed(root: nil, diagnostics: diagnostics, bytes: bytes)
        }
    }

    /// Parses, decodes, compiles and lints; never throws. What `policy lint` runs per file.
    package static func analyze(bytes: [UInt8], file: String?, catalog: PluginCatalog, limits: YAMLLimits) -> Analysis {
        analyze(parse(bytes: bytes, limits: limits), file: file, catalog: catalog)
    }

    /// Decodes, compiles and lints an already parsed file.
    ///
    /// The parsed file is consumed: its tree is let go once decoded, before the graph is
    /// compiled, so the two are never in memory together (pass it with `consume`).
    package static func analyze(_ parsed: consuming Parsed, file: String?, catalog: PluginCatalog) -> Analysis {
        var diagnostics = parsed.diagnostics
        let bytes = parsed.bytes
        guard let root = parsed.root else {
            if !diagnostics.hasErrors {
                diagnostics.append(
                    .error(
                        "empty-file", "the file is empty; a policy needs at least 'policy: 1' and 'name:'",
                        at: .fileStart))
            }
            return Analysis(policy: nil, diagnostics: finish(diagnostics, file), bytes: bytes)
        }
        parsed.root = nil
        var decoder = PolicyDecoder(catalog: catalog)
        guard let parts = decoder.policy(consume root) else {
            return Analysis(policy: nil, diagnostics: finish(diagnostics + decoder.diagnostics, file), bytes: bytes)
        }
        diagnostics += decoder.diagnostics
        let graph = RuleGraph(parts: parts, catalog: catalog)
        diagnostics += Linter.check(
            LintContext(
                parts: parts, graph: graph, catalog: catalog, decodeFailed: decoder.diagnostics.hasErrors,
                errorPositions: decoder.diagnostics.filter { $0.severity == .error }.map(\.range.start)))
        let sorted = finish(diagnostics, file)
        let policy = Policy(parts: parts, graph: graph, warnings: sorted.filter { $0.severity == .warning }, file: file)
        return Analysis(policy: policy, diagnostics: sorted, bytes: bytes)
    }

    private static func finish(_ diagnostics: [Diagnostic], _ file: String?) -> [Diagnostic] {
        diagnostics.sortedByPosition().map { diagnostic in
            var copy = diagnostic
            copy.file = file
            return copy
        }
    }
}

/// Why a policy could not be loaded.
public enum PolicyError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The file could not be read.
    case unreadable(path: String, reason: String)
    /// The file has errors; every finding, warnings included, in file order.
    case invalid(file: String?, diagnostics: [Diagnostic])

    /// The reason for a path that does not exist, in the words of `strerror(ENOENT)`: one wording
    /// for every command (lint, graph, explain, simulate, test, diff and fetch's files alike).
    package static let noSuchFile = "no such file or directory"

    /// The findings of an invalid policy; empty for an unreadable file.
    public var diagnostics: [Diagnostic] {
        if case .invalid(_, let diagnostics) = self { return diagnostics }
        return []
    }

    /// The error for people: the path and reason, or the file's errors one per line (the first 20).
    public var description: String {
        switch self {
        case .unreadable(let path, let reason):
            return "cannot read policy '\(path)': \(reason)"
        case .invalid(let file, let diagnostics):
            let errors = diagnostics.filter { $0.severity == .error }
            let lines = errors.prefix(20).map(\.description)
            let more = errors.count > 20 ? ["… and \(errors.count - 20) more errors"] : []
            return "policy '\(file ?? "<input>")' has \(errors.count) error\(errors.count == 1 ? "" : "s"):\n"
                + (lines + more).joined(separator: "\n")
        }
    }
}
