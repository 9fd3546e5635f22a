internal import CYAML

/// Parses YAML text with libyaml into a ``YAMLDocument`` whose nodes keep 1-based positions.
///
/// Why events and not libyaml's document API: building the tree from events lets the loader
/// enforce ``YAMLLimits`` as it goes (depth, nodes after alias expansion) and stop at the first
/// node past a bound, instead of letting libyaml materialise a hostile document first.
///
/// What it accepts: one document (explicit `---`/`...` allowed), block and flow styles, quoted
/// keys, comments, anchors, aliases and merge keys (`<<: *base` or `<<: [*a, *b]`, explicit keys
/// win over merged ones, earlier merged mappings over later ones). What it refuses, each with a
/// positioned diagnostic: a second document, an undefined alias, a duplicate key in one mapping,
/// input over the limits, and whatever libyaml refuses (bad indentation, tabs, control
/// characters such as NUL, invalid UTF-8).
///
/// Concurrency contract: a value type with no shared state; any number may run at once. The
/// libyaml parser, every event and the input buffer live only inside ``load(_:)``, and are freed
/// on every path.
package struct YAMLLoader {
    package var limits: YAMLLimits

    package init(limits: YAMLLimits = .default) {
        self.limits = limits
    }

    package enum Failure: Error, Equatable {
        case syntax(Diagnostic)
    }

    /// Returns the document's root node, or `nil` for an empty stream (no document at all).
    /// Non-fatal findings (duplicate keys) are appended to `diagnostics`.
    package func load(_ bytes: [UInt8], diagnostics: inout [Diagnostic]) throws(Failure) -> YAMLNode? {
        if bytes.count > limits.maxFileBytes {
            throw .syntax(
                .error(
                    "file-too-large",
                    "the file is \(bytes.count) bytes; policy files are limited to \(limits.maxFileBytes) bytes",
                    at: .fileStart))
        }
        var builder = TreeBuilder(limits: limits)
        let result: Result<YAMLNode?, Failure> = bytes.withUnsafeBufferPointer { buffer in
            Self.parse(buffer, bytes: bytes, builder: &builder)
        }
        diagnostics += builder.diagnostics
        return try result.get()
    }

    private static func parse(
        _ buffer: UnsafeBufferPointer<UInt8>, bytes: [UInt8], builder: inout TreeBuilder
    ) -> Result<YAMLNode?, Failure> {
        var parser = yaml_parser_t()
        guard yaml_parser_initialize(&parser) != 0 else {
            return .failure(
                .syntax(.error("yaml-syntax", "the YAML parser could not start (out of memory)", at: .fileStart)))
        }
        defer { yaml_parser_delete(&parser) }
        // An empty buffer has no base address; libyaml wants a valid pointer either way.
        let empty: [UInt8] = [0]
        return empty.withUnsafeBufferPointer { fallback in
            let base = buffer.baseAddress ?? fallback.baseAddress
            yaml_parser_set_input_string(&parser, base, buffer.count)
            var event = yaml_event_t()
            while true {
                guard yaml_parser_parse(&parser, &event) != 0 else {
                    return .failure(.syntax(syntaxDiagnostic(parser, bytes: bytes)))
                }
                defer { yaml_event_delete(&event) }
                if event.type == YAML_STREAM_END_EVENT {
                    return .success(builder.root())
                }
                if let failure = builder.handle(&event) {
                    return .failure(.syntax(failure))
                }
            }
        }
    }

    /// Runs libyaml over `bytes` and does nothing with its events but count them: the baseline
    /// `policy-bench` measures lint against (what no YAML-based lint can be faster than).
    /// `nil` when libyaml refuses the text.
    package static func countEvents(_ bytes: [UInt8]) -> Int? {
        var parser = yaml_parser_t()
        guard yaml_parser_initialize(&parser) != 0 else { return nil }
        defer { yaml_parser_delete(&parser) }
        return bytes.withUnsafeBufferPointer { buffer -> Int? in
            guard let base = buffer.baseAddress else { return 0 }
            yaml_parser_set_input_string(&parser, base, buffer.count)
            var event = yaml_event_t()
            var count = 0
            while true {
                guard yaml_parser_parse(&parser, &event) != 0 else { return nil }
                defer { yaml_event_delete(&event) }
                count += 1
                if event.type == YAML_STREAM_END_EVENT { return count }
            }
        }
    }

    /// Turns libyaml's `problem`/`context` and their marks into one diagnostic.
    private static func syntaxDiagnostic(_ parser: yaml_parser_t, bytes: [UInt8]) -> Diagnostic {
        let problem = parser.problem.map { String(cString: $0) } ?? "invalid YAML"
        if parser.error == YAML_READER_ERROR {
            let position = positionOfByte(parser.problem_offset, in: bytes)
            var message = problem
            if problem.contains("control characters") {
                let value = parser.problem_value
                message =
                    value == 0
                    ? "the file contains a NUL byte; policy files are text"
                    : "control character \(hex(value)) is not allowed in YAML"
            } else if problem.contains("UTF-8") {
                message = "the file is not valid UTF-8 (\(problem))"
            }
            return .error("yaml-syntax", message, at: SourceRange(start: position, end: position))
        }
        let mark = parser.problem_mark
        let position = SourcePosition(line: Int(mark.line) + 1, column: Int(mark.column) + 1)
        // libyaml's `index` counts characters, not bytes: find the character by line and column.
        let character = DiagnosticRenderer.character(in: String(decoding: bytes, as: UTF8.self), at: position)
        let context = parser.context.map { String(cString: $0) }
        let cm = parser.context_mark
        let contextPosition = SourcePosition(line: Int(cm.line) + 1, column: Int(cm.column) + 1)
        var message = explain(problem, context: context, contextLine: contextPosition.line, character: character)
        var notes: [Diagnostic.Note] = []
        if let context {
            let said = contextNote(context)
            if contextPosition != position {
                notes.append(.init(range: SourceRange(start: contextPosition, end: contextPosition), message: said))
            } else if said == context, message == problem {
                message += " \(context)"
            }
        }
        return .error("yaml-syntax", message, at: SourceRange(start: position, end: position), notes: notes)
    }

    /// libyaml's problem in words that say how to fix it. libyaml describes its parser's state
    /// ("mapping values are not allowed in this context"); a reader needs to know that a line is
    /// indented too far or a value needs quotes. Unknown problems keep libyaml's text.
    static func explain(_ problem: String, context: String?, contextLine: Int, character: Unicode.Scalar?) -> String {
        if character == "\t" || problem.contains("tab character") {
            return "a tab indents this line; YAML indents with spaces only: replace the tab with spaces"
        }
        switch problem {
        case "found character that cannot start any token":
            let shown = character.map { "'\($0)'" } ?? "this character"
            return "\(shown) cannot start a value here; put the value in quotes"
        case "mapping values are not allowed in this context":
            return "unexpected ':' here: this line is indented more than the keys above it "
                + "(line it up with them), or a value holds ': ' and needs quotes"
        case "did not find expected key":
            return "this line does not line up with the keys of the mapping that starts on line \(contextLine): "
                + "indent it like them"
        case "did not find expected '-' indicator":
            return "this line does not line up with the list that starts on line \(contextLine): "
                + "start a new item with '- ' or indent it like the item's other keys"
        case "could not find expected ':'":
            return "a key needs ':' after it; if this line continues a long value, put the value in quotes"
        case "found unexpected end of stream":
            return context == "while scanning a quoted scalar"
                ? "a quoted text is not closed: add the closing quote" : "the file ends in the middle of a value"
        case "did not find expected node content":
            return context == "while parsing a flow node"
                ? "a value is missing here, or a '[' or '{' is not closed" : "a value is missing here"
        case "did not find expected ',' or ']'":
            return "a '[' list is not closed with ']', or two of its items have no ',' between them"
        case "did not find expected ',' or '}'":
            return "a '{' mapping is not closed with '}', or two of its entries have no ',' between them"
        case "block sequence entries are not allowed in this context":
            return "a list item ('- ') cannot start here: put the list on the next lines, indented under its key"
        case "found unknown escape character while parsing a quoted scalar", "found unknown escape character":
            return "unknown escape in a double-quoted text: write \\\\ for a backslash, or use single quotes"
        case "did not find expected <document start>":
            return "more follows the policy's mapping: a policy file holds one mapping (check the indentation)"
        default:
            return problem
        }
    }

    /// libyaml's context ("while parsing a block mapping") as what its position is.
    static func contextNote(_ context: String) -> String {
        switch context {
        case "while parsing a block mapping": return "the mapping starts here"
        case "while parsing a block collection": return "the list starts here"
        case "while scanning a simple key": return "the key starts here"
        case "while scanning a quoted scalar": return "the quoted text starts here"
        case "while parsing a flow sequence": return "the '[' list starts here"
        case "while parsing a flow mapping": return "the '{' mapping starts here"
        case "while parsing a flow node", "while parsing a block node": return "the value starts here"
        default: return context
        }
    }

    private static func hex(_ value: Int32) -> String {
        let digits = String(value, radix: 16, uppercase: true)
        return "U+" + String(repeating: "0", count: max(0, 4 - digits.count)) + digits
    }

    /// The 1-based line and column (in Unicode scalars) of a byte offset.
    static func positionOfByte(_ offset: Int, in bytes: [UInt8]) -> SourcePosition {
        var line = 1
        var column = 1
        var index = 0
        let end = min(offset, bytes.count)
        while index < end {
            let byte = bytes[index]
            if byte == 0x0A {
                line += 1
                column = 1
            } else if byte & 0xC0 != 0x80 {
                column += 1
            }
            index += 1
        }
        return SourcePosition(line: line, column: column)
    }
}

/// Builds a ``YAMLDocument`` from libyaml events with an explicit stack (no recursion, so depth
/// is bounded by ``YAMLLimits/maxDepth`` and not by the thread's stack).
///
/// The children of the open collections wait in one shared list (`pending`), each open
/// collection owning the part from its `firstSlot` on; a finished collection moves its part into
/// the document. No collection allocates a list of its own while it is being read.
private struct TreeBuilder {
    /// An open mapping or sequence.
    struct Frame {
        var isMapping: Bool
        var start: SourcePosition
        var anchor: String?
        var tag: String?
        var size: Int
        /// Where this collection's children start in `pending` (a mapping's as key, value, …).
        var firstSlot: Int
        /// A mapping's key read, waiting for its value; -1 for none.
        var pendingKey: Int32 = -1
        var hasMergeKey = false
        /// The mapping's scalar keys so far, for duplicate detection in O(1), once it has more
        /// than ``Frame/scanLimit`` pairs; a smaller mapping (nearly all of them) is scanned:
        /// a dictionary per mapping was a tenth of building a 20,000-rule file's tree.
        var keys: [String: SourceRange]?

        static let scanLimit = 8
    }

    let limits: YAMLLimits
    /// The node bound: the limits', but at most ``nodeBound``.
    let maxNodes: Int
    /// The most nodes a document holds whatever the limits say (4,194,304, twice the default
    /// limit): one collection's slots (two per pair, merged pairs included, each counted as a
    /// node) then always fit ``YAMLDocument/Entry/maxSlots``.
    static let nodeBound = 1 << 22
    var document = YAMLDocument.Builder()
    var stack: [Frame] = []
    var pending: [Int32] = []
    var anchors: [String: (node: Int32, size: Int)] = [:]
    var rootNode: Int32?
    var documents = 0
    var nodes = 0
    var diagnostics: [Diagnostic] = []

    init(limits: YAMLLimits) {
        self.limits = limits
        maxNodes = min(limits.maxNodes, Self.nodeBound)
    }

    /// The finished document's root; the builder is not used after.
    mutating func root() -> YAMLNode? {
        guard let rootNode else { return nil }
        let built = YAMLDocument(document)
        document = YAMLDocument.Builder()
        return YAMLNode(built, rootNode)
    }

    static func position(_ mark: yaml_mark_t) -> SourcePosition {
        SourcePosition(line: Int(mark.line) + 1, column: Int(mark.column) + 1)
    }

    static let coreTagPrefix = "tag:yaml.org,2002:"

    /// A scalar under a YAML 1.2 core-schema tag, read as that type: `!!str` makes it a text
    /// (as if quoted); `!!int`, `!!float`, `!!bool` and `!!null` hold when the text is one (the
    /// value is then the plain scalar, `!!bool True` being `true`), and are an error otherwise.
    /// Any other tag is kept, and the decoder refuses the value as not of the expected type.
    static func resolveCoreTag(
        _ tag: String?, text: String, style: YAMLNode.Style
    ) -> Result<(text: String, style: YAMLNode.Style, tag: String?), TagError> {
        guard let tag, tag.hasPrefix(coreTagPrefix) else { return .success((text, style, tag)) }
        let name = String(tag.dropFirst(coreTagPrefix.count))
        func refuse(_ what: String) -> Result<(text: String, style: YAMLNode.Style, tag: String?), TagError> {
            .failure(TagError("'!!\(name)' is given '\(text.truncatedForMessage)', which is not \(what)"))
        }
        switch name {
        case "str":
            return .success((text, style == .plain ? .doubleQuoted : style, nil))
        case "int":
            let digits = text.hasPrefix("-") || text.hasPrefix("+") ? text.dropFirst() : Substring(text)
            guard !digits.isEmpty, digits.allSatisfy({ $0.isASCII && $0.isNumber }) else {
                return refuse("a whole number written in decimal")
            }
            return .success((text, .plain, nil))
        case "float":
            guard Double(text) != nil || [".inf", "-.inf", "+.inf", ".nan"].contains(text.lowercased()) else {
                return refuse("a number")
            }
            return .success((text, .plain, nil))
        case "bool":
            guard ["true", "True", "TRUE", "false", "False", "FALSE"].contains(text) else {
                return refuse("true or false")
            }
            return .success((text.lowercased(), .plain, nil))
        case "null":
            guard ["", "~", "null", "Null", "NULL"].contains(text) else { return refuse("null") }
            return .success(("null", .plain, nil))
        default:
            return .failure(
                TagError("'!!\(name.truncatedForMessage)' is not a tag a policy can use; write the value without it"))
        }
    }

    struct TagError: Error, CustomStringConvertible {
        let description: String
        init(_ description: String) { self.description = description }
    }

    static func string(_ pointer: UnsafeMutablePointer<yaml_char_t>?) -> String? {
        guard let pointer else { return nil }
        return String(cString: pointer)
    }

    mutating func handle(_ event: inout yaml_event_t) -> Diagnostic? {
        let start = Self.position(event.start_mark)
        let end = Self.position(event.end_mark)
        let range = SourceRange(start: start, end: end)
        switch event.type {
        case YAML_DOCUMENT_START_EVENT:
            documents += 1
            if documents > 1 {
                return .error(
                    "multiple-documents",
                    "a policy file holds one YAML document; remove the second document or move it to its own file",
                    at: range)
            }
        case YAML_SCALAR_EVENT:
            let scalar = event.data.scalar
            let text = String(decoding: UnsafeBufferPointer(start: scalar.value, count: scalar.length), as: UTF8.self)
            let style: YAMLNode.Style
            switch scalar.style {
            case YAML_SINGLE_QUOTED_SCALAR_STYLE: style = .singleQuoted
            case YAML_DOUBLE_QUOTED_SCALAR_STYLE: style = .doubleQuoted
            case YAML_LITERAL_SCALAR_STYLE: style = .literal
            case YAML_FOLDED_SCALAR_STYLE: style = .folded
            default: style = .plain
            }
            let node: Int32
            if scalar.tag == nil {
                // No tag (nearly every scalar): nothing to resolve.
                node = document.scalar(text, style: style, tag: nil, range: range)
            } else {
                switch Self.resolveCoreTag(Self.string(scalar.tag), text: text, style: style) {
                case .success(let resolved):
                    node = document.scalar(resolved.text, style: resolved.style, tag: resolved.tag, range: range)
                case .failure(let message): return .error("invalid-tag", message.description, at: range)
                }
            }
            return add(node, size: 1, anchor: Self.string(scalar.anchor), at: range)
        case YAML_ALIAS_EVENT:
            let name = Self.string(event.data.alias.anchor) ?? ""
            guard let anchored = anchors[name] else {
                return .error(
                    "undefined-alias", "alias '*\(name.truncatedForMessage)' refers to no anchor defined before it",
                    at: range)
            }
            return add(document.alias(of: anchored.node, at: range), size: anchored.size, anchor: nil, at: range)
        case YAML_MAPPING_START_EVENT:
            if let failure = push(at: range) { return failure }
            let data = event.data.mapping_start
            stack.append(
                Frame(
                    isMapping: true, start: start, anchor: Self.string(data.anchor), tag: Self.string(data.tag),
                    size: 1, firstSlot: pending.count))
        case YAML_SEQUENCE_START_EVENT:
            if let failure = push(at: range) { return failure }
            let data = event.data.sequence_start
            stack.append(
                Frame(
                    isMapping: false, start: start, anchor: Self.string(data.anchor), tag: Self.string(data.tag),
                    size: 1, firstSlot: pending.count))
        case YAML_MAPPING_END_EVENT, YAML_SEQUENCE_END_EVENT:
            guard let frame = stack.popLast() else { return nil }
            let fullRange = SourceRange(start: frame.start, end: end)
            // `!!map` on a mapping and `!!seq` on a list say what they are anyway.
            // (The text is made only for a tagged collection: a 21-byte text per mapping showed.)
            let tag = frame.tag.flatMap { written in
                written == (frame.isMapping ? Self.coreTagPrefix + "map" : Self.coreTagPrefix + "seq") ? nil : written
            }
            let node: Int32
            if frame.isMapping, frame.hasMergeKey {
                let slots = resolveMerges(pending[frame.firstSlot...])
                node = document.collection(.mapping, slots: slots, tag: tag, range: fullRange)
            } else {
                node = document.collection(
                    frame.isMapping ? .mapping : .sequence, slots: pending[frame.firstSlot...], tag: tag,
                    range: fullRange)
            }
            pending.removeLast(pending.count - frame.firstSlot)
            return add(node, size: frame.size, anchor: frame.anchor, at: fullRange, counted: true)
        default:
            break
        }
        return nil
    }

    mutating func push(at range: SourceRange) -> Diagnostic? {
        if stack.count >= limits.maxDepth {
            return .error(
                "nesting-too-deep", "nesting deeper than \(limits.maxDepth) levels; policy files are shallow",
                at: range)
        }
        nodes += 1
        if nodes > maxNodes { return tooManyNodes(range) }
        return nil
    }

    func tooManyNodes(_ range: SourceRange) -> Diagnostic {
        .error(
            "too-many-nodes",
            "the document expands to more than \(maxNodes) nodes (aliases count what they repeat)",
            at: range)
    }

    /// Adds a finished node to the enclosing collection, or makes it the root.
    /// `counted` is true for collections, whose own node was counted when they started.
    mutating func add(
        _ node: Int32, size: Int, anchor: String?, at range: SourceRange, counted: Bool = false
    ) -> Diagnostic? {
        if !counted {
            nodes += size
            if nodes > maxNodes { return tooManyNodes(range) }
        }
        if let anchor { anchors[anchor] = (node, size) }
        let last = stack.count - 1
        guard last >= 0 else {
            rootNode = node
            return nil
        }
        stack[last].size += size
        guard stack[last].isMapping else {
            pending.append(node)
            return nil
        }
        let key = stack[last].pendingKey
        guard key >= 0 else {
            stack[last].pendingKey = node
            return nil
        }
        stack[last].pendingKey = -1
        let keyEntry = document.entries[Int(key)]
        if keyEntry.kind == .scalar {
            let text = document.texts[Int(keyEntry.first)]
            if keyEntry.style == .plain, !keyEntry.isTagged, text == "<<" {
                stack[last].hasMergeKey = true
            } else if let first = register(text, at: keyEntry.range) {
                diagnostics.append(
                    .error(
                        "duplicate-key",
                        "duplicate key '\(text.truncatedForMessage)'; each key may appear once in a mapping",
                        at: keyEntry.range, notes: [.init(range: first, message: "first written here")]))
                return nil
            }
        }
        pending.append(key)
        pending.append(node)
        return nil
    }

    /// Records a scalar key of the innermost mapping (merge keys aside), before its pair is
    /// added, and returns where it was first written when it is a duplicate (then it is not
    /// recorded).
    mutating func register(_ text: String, at range: SourceRange) -> SourceRange? {
        let last = stack.count - 1
        if let first = stack[last].keys?[text] { return first }
        guard stack[last].keys == nil else {
            stack[last].keys?[text] = range
            return nil
        }
        let firstSlot = stack[last].firstSlot
        var table: [String: SourceRange]?
        if pending.count - firstSlot >= 2 * Frame.scanLimit { table = [:] }
        var slot = firstSlot
        while slot < pending.count {
            let key = pending[slot]
            if !document.isMergeKey(key), let written = document.text(of: key) {
                let writtenRange = document.entries[Int(key)].range
                if written == text { return writtenRange }
                if table != nil, table?[written] == nil { table?[written] = writtenRange }
            }
            slot += 2
        }
        if var table {
            table[text] = range
            stack[last].keys = table
        }
        return nil
    }

    /// Applies `<<` merge keys to a finished mapping's slots (key, value, …): the merged mappings'
    /// pairs are added where the mapping does not already have the key, earlier merged mappings
    /// winning over later ones. A merge value that is not a mapping (or list of mappings) is
    /// reported.
    mutating func resolveMerges(_ slots: ArraySlice<Int32>) -> [Int32] {
        var result: [Int32] = []
        var merges: [Int32] = []
        var present = Set<String>()
        var slot = slots.startIndex
        while slot + 1 < slots.endIndex {
            let key = slots[slot]
            if document.isMergeKey(key) {
                merges.append(slots[slot + 1])
            } else {
                result.append(key)
                result.append(slots[slot + 1])
                if let text = document.text(of: key) { present.insert(text) }
            }
            slot += 2
        }
        for value in merges {
            let valueEntry = document.entries[Int(value)]
            let sources: ArraySlice<Int32>
            switch valueEntry.kind {
            case .mapping: sources = [value]
            case .sequence:
                sources = document.children[Int(valueEntry.first)..<Int(valueEntry.first + valueEntry.count)]
            case .scalar:
                diagnostics.append(
                    .error(
                        "invalid-merge", "a merge key '<<' takes an alias of a mapping, like '<<: *defaults'",
                        at: valueEntry.range))
                continue
            }
            var reported = false
            for source in sources {
                let sourceEntry = document.entries[Int(source)]
                guard sourceEntry.kind == .mapping else {
                    // An item written here is pointed at; one reached through an alias was written
                    // at its anchor, so the finding points at the alias that brought it (once).
                    let written =
                        sourceEntry.range.start >= valueEntry.range.start
                        && sourceEntry.range.end <= valueEntry.range.end
                    if written || !reported {
                        diagnostics.append(
                            .error(
                                "invalid-merge", "a merge key '<<' can only merge mappings",
                                at: written ? sourceEntry.range : valueEntry.range))
                    }
                    reported = reported || !written
                    continue
                }
                var merged = Int(sourceEntry.first)
                while merged + 1 < Int(sourceEntry.first + sourceEntry.count) {
                    let mergedKey = document.children[merged]
                    if let text = document.text(of: mergedKey), !present.contains(text) {
                        present.insert(text)
                        result.append(mergedKey)
                        result.append(document.children[merged + 1])
                    }
                    merged += 2
                }
            }
        }
        return result
    }
}
