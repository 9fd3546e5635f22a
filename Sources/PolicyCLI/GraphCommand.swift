import Foundation
import ResponsePolicy

/// `policy graph [--format dot|mermaid] FILE`
enum GraphCommand {
    static let spec = CommandSpec(
        name: "graph",
        overview: "Print a policy's rule graph: classifier, rules, actions and outcomes.",
        usage: "policy graph [--format dot|mermaid] FILE",
        arguments: [("FILE", "The policy file.")],
        options: [
            .init(names: ["--format"], valueName: "format", help: "dot (default, for Graphviz) or mermaid."),
            .init(
                names: ["--plugin"], valueName: "kind:name", help: "Declare a host plugin. Repeatable.",
                repeatable: true),
        ])

    static func run(_ arguments: ParsedArguments, output: CommandOutput) throws(UsageError) -> Int32 {
        let format = arguments.value("--format") ?? "dot"
        guard format == "dot" || format == "mermaid" else {
            throw UsageError(message: "Unknown format '\(format)'; use dot or mermaid")
        }
        let path = try singleFile(arguments)
        let (loaded, code) = loadPolicy(path, catalog: try catalog(from: arguments.all("--plugin")), output: output)
        guard let policy = loaded else { return code }
        output.stdout(format == "dot" ? GraphRenderer.dot(policy) : GraphRenderer.mermaid(policy))
        return ExitCode.success
    }
}

func singleFile(_ arguments: ParsedArguments) throws(UsageError) -> String {
    guard let path = arguments.positional.first else { throw UsageError(message: "Missing expected argument 'FILE'") }
    guard arguments.positional.count == 1 else {
        throw UsageError(message: "Unexpected argument '\(arguments.positional[1])'")
    }
    return path
}

/// Renders the compiled rule graph for Graphviz or Mermaid.
enum GraphRenderer {
    static func dot(_ policy: Policy) -> String {
        let graph = policy.graph
        var out = "digraph \(quote(policy.name)) {\n  rankdir=LR;\n  node [fontname=\"Helvetica\", fontsize=11];\n"
        out += "  edge [fontname=\"Helvetica\", fontsize=9];\n"
        for scope in graph.scopes {
            out += "  subgraph \(quote("cluster_" + scope.id)) {\n    label=\(quote(scope.summary));\n"
            for node in graph.nodes where node.id.hasPrefix(scope.id + ".") {
                out += "    \(quote(node.id)) [\(shape(node.kind)), label=\(quote(node.label))];\n"
            }
            out += "  }\n"
        }
        for node in graph.nodes where node.kind == .outcome {
            out += "  \(quote(node.id)) [\(shape(node.kind)), label=\(quote(node.label))];\n"
        }
        for edge in graph.edges {
            let label = edge.label.isEmpty ? "" : " [label=\(quote(edge.label))]"
            out += "  \(quote(edge.from)) -> \(quote(edge.to))\(label);\n"
        }
        return out + "}\n"
    }

    static func mermaid(_ policy: Policy) -> String {
        let graph = policy.graph
        var out = "flowchart LR\n"
        for scope in graph.scopes {
            out += "  subgraph \(id(scope.id))[\(mermaidText(scope.summary))]\n"
            for node in graph.nodes where node.id.hasPrefix(scope.id + ".") {
                out += "    \(mermaidNode(node))\n"
            }
            out += "  end\n"
        }
        for node in graph.nodes where node.kind == .outcome {
            out += "  \(mermaidNode(node))\n"
        }
        for edge in graph.edges {
            let label = edge.label.isEmpty ? "" : "|\(mermaidText(edge.label))|"
            out += "  \(id(edge.from)) -->\(label) \(id(edge.to))\n"
        }
        return out
    }

    static func shape(_ kind: RuleGraph.Node.Kind) -> String {
        switch kind {
        case .classifier: return "shape=diamond"
        case .rule: return "shape=box"
        case .action: return "shape=ellipse, style=filled, fillcolor=\"#eeeeee\""
        case .outcome: return "shape=doublecircle"
        }
    }

    static func mermaidNode(_ node: RuleGraph.Node) -> String {
        let text = mermaidText(node.label)
        switch node.kind {
        case .classifier: return "\(id(node.id)){\(text)}"
        case .rule: return "\(id(node.id))[\(text)]"
        case .action: return "\(id(node.id))(\(text))"
        case .outcome: return "\(id(node.id))([\(text)])"
        }
    }

    static func quote(_ text: String) -> String {
        "\"" + text.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "\"", with: "\\\"") + "\""
    }

    static func id(_ text: String) -> String {
        String(text.map { $0.isLetter || $0.isNumber ? $0 : "_" })
    }

    static func mermaidText(_ text: String) -> String {
        "\"" + text.replacingOccurrences(of: "\"", with: "#quot;") + "\""
    }
}
