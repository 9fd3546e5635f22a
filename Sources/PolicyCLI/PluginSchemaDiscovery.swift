import Foundation
import ResponsePolicy

/// The plugin schema files lint finds on its own: a file whose top level has `plugins:` (written
/// by `PluginRegistry.exportSchemas()`) declares its host plugins, with their options, for the
/// policies in its folder and the folders below it.
///
/// Why: `policy lint examples/` failed on the service example's `use: host-signout` although
/// `examples/service/plugins.yaml` declares it: only `--plugins FILE` read such a file, so a
/// folder of policies and their schema file could not be checked by one plain command. Found
/// among the files a folder search yields, or, for a policy named on its own, among the YAML
/// files beside it. `--plugin` and `--plugins` still apply everywhere.
struct PluginSchemaDiscovery {
    /// Each schema file found, by the folder it applies to (`""` for the current one).
    private var schemas: [(folder: String, file: String, text: String)] = []
    private let base: PluginCatalog
    /// The catalogs made so far, by the schema files they hold: a folder of many policies and one
    /// schema file reads it once.
    private var made: [[String]: PluginCatalog] = [:]

    /// Reads the schema files among `files`. A file that is not valid is left out here; lint
    /// reports its problems when it checks the file itself.
    init(files: [String], base: PluginCatalog) {
        self.base = base
        for file in files {
            guard let text = Self.schemaText(file) else { continue }
            var probe = PluginCatalog()
            guard (try? probe.declare(schemasYAML: text, file: file)) != nil else { continue }
            schemas.append((Self.folder(of: file), file, text))
        }
    }

    /// The catalog for a policy at `file`: the base, with every schema file found in its folder
    /// or a folder above it.
    mutating func catalog(for file: String) -> PluginCatalog {
        guard !schemas.isEmpty else { return base }
        let folder = Self.folder(of: file)
        let applying = schemas.filter { $0.file != file && Self.folder(folder, isWithin: $0.folder) }
        let key = applying.map(\.file)
        if let catalog = made[key] { return catalog }
        var catalog = base
        for schema in applying { try? catalog.declare(schemasYAML: schema.text, file: schema.file) }
        made[key] = catalog
        return catalog
    }

    /// The *.yaml and *.yml files in the folder of `path`, for a policy named on its own.
    static func yamlFiles(besides path: String) -> [String] {
        let folder = folder(of: path)
        let names = (try? FileManager.default.contentsOfDirectory(atPath: folder.isEmpty ? "." : folder)) ?? []
        return names.filter { ($0.hasSuffix(".yaml") || $0.hasSuffix(".yml")) && !$0.hasPrefix(".") }.sorted()
            .map { folder.isEmpty ? $0 : folder + "/" + $0 }
    }

    /// The text of `file` when it may be a schema file: at most the size `--plugins` reads, UTF-8,
    /// with a top-level `plugins:` key (checked on the bytes first, so a folder of large policies
    /// is not parsed twice).
    private static func schemaText(_ file: String) -> String? {
        let limit = LintCommand.maxPluginSchemaBytes
        guard let bytes = try? Policy.readFile(file, limits: YAMLLimits(maxFileBytes: limit)), bytes.count <= limit,
            let text = String(validating: bytes, as: UTF8.self),
            text.hasPrefix("plugins:") || text.contains("\nplugins:")
        else { return nil }
        return PluginCatalog.isSchemaFile(Policy.parse(bytes: bytes, limits: .default).root) ? text : nil
    }

    static func folder(of file: String) -> String {
        guard let slash = file.lastIndex(of: "/") else { return "" }
        return slash == file.startIndex ? "/" : String(file[..<slash])
    }

    /// Whether `folder` is `ancestor` or below it.
    static func folder(_ folder: String, isWithin ancestor: String) -> Bool {
        ancestor.isEmpty || folder == ancestor || folder.hasPrefix(ancestor.hasSuffix("/") ? ancestor : ancestor + "/")
    }
}
