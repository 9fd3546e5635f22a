/// Where a response's business code lives: `classify: { code: body.status }`.
package enum CodeSource: Sendable, Hashable, CustomStringConvertible {
    /// A JSON path into the body: `body.status`, `body.errors.0.code`.
    case body(String)
    /// A response header: `header.X-Error-Code`.
    case header(String)
    /// A host-registered `extract` plugin.
    case plugin(PluginReference)

    package var description: String {
        switch self {
        case .body(let path): return "body.\(path)"
        case .header(let name): return "header.\(name)"
        case .plugin(let reference): return "plugin '\(reference.name)'"
        }
    }
}
