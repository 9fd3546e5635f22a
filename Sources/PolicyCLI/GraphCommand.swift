import Foundation
import ResponsePolicy

/// `policy graph [--format dot|mermaid|json] FILE`
enum GraphCommand {
    enum Format: String, CaseIterable, Sendable { case dot, mermaid, json }

    static let format = Option.choice(
        ["--format"], "format", default: Format.dot,
        help: "dot (default, for Graphviz), mermaid, or json (nodes and edges with ids, kinds and settings).")
    static let plugin = Option.plugin()

    static let spec = CommandSpec(
        name: "graph",
        summary: "Print a policy's rule graph (classifier, rules, actions, outcomes) as DOT, Mermaid or JSON.",
        arguments: [.init(name: "FILE", help: "The policy file.")],
        options: [format.declaration, plugin.declaration],
        exitCodes: policyFileExitCodes(done: "the graph was printed"))

    static func run(_ arguments: ParsedArguments, output: CommandOutput) throws(UsageError) -> Int32 {
        let path = try singleFile(arguments)
        let (loaded, code) = loadPolicy(path, catalog: try catalog(from: arguments[plugin]), output: output)
        guard let policy = loaded else { return code }
        switch arguments[format] {
        case .json: output.stdout(GraphRenderer.json(policy))
        case .mermaid: output.stdout(GraphRenderer.mermaid(policy))
        case .dot: output.stdout(GraphRenderer.dot(policy))
        }
        return ExitCode.success
    }
}

/// The exit codes of a command that reads one policy file and prints something about it.
func policyFileExitCodes(done: String) -> [(Int32, String)] {
    [(0, done), (1, "the policy has errors (they are printed)"), (64, "usage error"), (66, "the file cannot be read")]
}

func singleFile(_ arguments: ParsedArguments) throws(UsageError) -> String {
    guard let path = arguments.positional.first else { throw UsageError(message: "Missing expected argument 'FILE'") }
    guard arguments.positional.count == 1 else {
        throw UsageError(message: "Unexpected argument '\(arguments.positional[1])'")
    }
    return path
}

/// Renders the compiled rule graph for Graphviz or Mermaid.
package enum GraphRenderer {
    package static func dot(_ policy: Policy) -> String {
        let graph = policy.graph
        var out = "digraph \(quote(policy.name)) {\n  rankdir=LR;\n  node [fontname=\"Helvetica\", fontsize=11];\n"
        out += "  edge [fontname=\"Helvetica\", fontsize=9];\n"
        for scope in graph.scopes {
            out += "  subgraph \(quote("cluster_" + scope.id)) {\n    label=\(quote(scope.summary));\n"
            for node in scope.nodes {
                out += "    \(quote(node.id)) [\(shape(node.kind)), label=\(quote(node.label))];\n"
            }
            out += "  }\n"
        }
        for node in graph.outcomes {
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
            for node in scope.nodes {
                out += "    \(mermaidNode(node))\n"
            }
            out += "  end\n"
        }
        for node in graph.outcomes {
            out += "  \(mermaidNode(node))\n"
        }
        for edge in graph.edges {
            let label = edge.label.isEmpty ? "" : "|\(mermaidText(edge.label))|"
            out += "  \(id(edge.from)) -->\(label) \(id(edge.to))\n"
        }
        return out
    }

    /// The compiled graph as one JSON document: the scopes with their rules in order (1-based
    /// `index`, as the drawings number them), every node (rule nodes with their `index`, action
    /// nodes with their effective `settings`) and every edge with its stable `id` and `kind`.
    static func json(_ policy: Policy) -> String {
        let graph = policy.graph
        func q(_ text: String) -> String { PolicyEvent.quote(text) }
        func settings(_ list: [RuleGraph.Setting]) -> String {
            "{" + list.map { q($0.key) + ":" + q($0.value) }.joined(separator: ",") + "}"
        }
        var out = "{\"policy\":\(q(policy.name)),\"scopes\":["
        out += graph.scopes.map { scope in
            var text = "{\"id\":\(q(scope.id)),\"summary\":\(q(scope.summary))"
            if let route = scope.route {
                text += ",\"route\":{\"line\":\(route.range.start.line)"
                if let path = route.path { text += ",\"path\":\(q(path.pattern))" }
                if let methods = route.methods { text += ",\"method\":[" + methods.map(q).joined(separator: ",") + "]" }
                text += ",\"own-rules\":\(route.rules != nil)}"
            }
            text += ",\"classifier\":\(q(RuleGraph.classifierID(scope: scope.id))),\"rules\":["
            text += scope.compiled.map { rule in
                "{\"index\":\(rule.index + 1),\"name\":\(q(rule.rule.name)),\"node\":\(q(rule.node)),"
                    + "\"action\":\(q(rule.action.rawValue)),\"action-node\":\(q(rule.actionNode)),"
                    + "\"line\":\(rule.rule.range.start.line),\"when\":\(q(RuleGraph.describe(rule.rule.when)))}"
            }.joined(separator: ",")
            return text + "]}"
        }.joined(separator: ",")
        out += "],\"nodes\":["
        out += graph.nodes.map { node in
            var text = "{\"id\":\(q(node.id)),\"kind\":\(q(node.kind.rawValue)),\"label\":\(q(node.label))"
            if let scope = node.scope { text += ",\"scope\":\(q(scope))" }
            if let rule = node.rule { text += ",\"index\":\(rule + 1)" }
            if let action = node.action { text += ",\"action\":\(q(action.rawValue))" }
            if !node.settings.isEmpty { text += ",\"settings\":" + settings(node.settings) }
            return text + "}"
        }.joined(separator: ",")
        out += "],\"edges\":["
        out += graph.edges.map { edge in
            "{\"id\":\(q(edge.id)),\"from\":\(q(edge.from)),\"to\":\(q(edge.to)),\"kind\":\(q(edge.kind.rawValue)),"
                + "\"label\":\(q(edge.label))}"
        }.joined(separator: ",")
        return out + "]}\n"
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

    /// A dot string: `"` and `\\` escaped. By scalars, not Foundation's search and replace, which
    /// was most of drawing 100,000 routes.
    static func quote(_ text: String) -> String {
        var out = "\""
        out.unicodeScalars.reserveCapacity(text.utf8.count + 2)
        for scalar in text.unicodeScalars {
            if scalar == "\\" || scalar == "\"" { out.unicodeScalars.append("\\") }
            out.unicodeScalars.append(scalar)
        }
        out.unicodeScalars.append("\"")
        return out
    }

    static func id(_ text: String) -> String {
        guard text.utf8.allSatisfy({ $0 < 0x80 }) else {
            return String(text.map { $0.isLetter || $0.isNumber ? $0 : "_" })
        }
        // ASCII (every node id the compiler makes): byte by byte.
        let bytes = text.utf8.map { byte -> UInt8 in
            let letter = (byte | 0x20) >= 0x61 && (byte | 0x20) <= 0x7A
            return letter || (byte >= 0x30 && byte <= 0x39) ? byte : 0x5F
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    static func mermaidText(_ text: String) -> String {
        var out = "\""
        for scalar in text.unicodeScalars {
            if scalar == "\"" { out += "#quot;" } else { out.unicodeScalars.append(scalar) }
        }
        return out + "\""
    }
}
