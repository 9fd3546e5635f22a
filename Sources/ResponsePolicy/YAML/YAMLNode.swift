/// A YAML node with the source range it came from.
///
/// The loader resolves aliases and merge keys while building the tree, so a consumer sees plain
/// scalars, mappings and sequences. Scalars stay untyped text plus their style: the schema decides
/// what a scalar means, so YAML 1.1's `yes`/`no`/`on`/`off` never silently become booleans and a
/// quoted scalar is always a string.
///
/// A node is a position in its ``YAMLDocument``, which holds every node of one file in a few flat
/// arrays. Why not a tree of values: a tree of enums allocated an array per mapping and per list
/// and a 56-byte value per node, and building, copying and freeing it cost a 20,000-rule file's
/// lint more than libyaml's whole parse. A node is compared and hashed by what it holds (its
/// value, range and tag), not by which document it is in.
package struct YAMLNode: Sendable, Hashable {
    package enum Style: UInt8, Sendable, Hashable {
        case plain, singleQuoted, doubleQuoted, literal, folded
    }

    package struct Pair: Sendable, Hashable {
        package var key: YAMLNode
        package var value: YAMLNode
    }

    package enum Value: Sendable, Equatable {
        case scalar(String, Style)
        case mapping(Pairs)
        case sequence(Items)
    }

    let document: YAMLDocument
    let index: Int32

    init(_ document: YAMLDocument, _ index: Int32) {
        self.document = document
        self.index = index
    }

    private var entry: YAMLDocument.Entry { document.entries[Int(index)] }

    package var value: Value {
        let entry = entry
        switch entry.kind {
        case .scalar: return .scalar(document.texts[Int(entry.first)], entry.style)
        case .mapping: return .mapping(Pairs(document, entry.first, entry.count / 2))
        case .sequence: return .sequence(Items(document, entry.first, entry.count))
        }
    }

    package var range: SourceRange { entry.range }

    /// The explicit tag, e.g. `!!str`, when one was written.
    package var tag: String? {
        entry.isTagged ? document.tags[index] : nil
    }

    /// The scalar's text when this is a scalar.
    package var scalar: String? {
        let entry = entry
        return entry.kind == .scalar ? document.texts[Int(entry.first)] : nil
    }

    package var isPlainScalar: Bool {
        let entry = entry
        return entry.kind == .scalar && entry.style == .plain && !entry.isTagged
    }

    /// A plain scalar that YAML reads as null: empty, `~` or `null`.
    package var isNull: Bool {
        guard isPlainScalar, let text = scalar else { return false }
        // By length first: asked of nearly every scalar the decoder reads, and four text
        // comparisons each time showed in profiles. (Only ASCII texts equal these.)
        switch text.utf8.count {
        case 0: return true
        case 1: return text == "~"
        case 4: return text == "null" || text == "Null" || text == "NULL"
        default: return false
        }
    }

    package var pairs: Pairs? {
        let entry = entry
        return entry.kind == .mapping ? Pairs(document, entry.first, entry.count / 2) : nil
    }

    package var items: Items? {
        let entry = entry
        return entry.kind == .sequence ? Items(document, entry.first, entry.count) : nil
    }

    /// What the node is, for messages: `a mapping`, `a list`, `the number 3`, `the text 'x'`.
    package var kindDescription: String {
        switch value {
        case .mapping: return "a mapping"
        case .sequence: return "a list"
        case .scalar(let text, let style):
            if isNull { return "nothing (null)" }
            if style == .plain, Int(text) != nil || Double(text) != nil { return "the number \(text)" }
            return "'\(text.truncatedForMessage)'"
        }
    }

    /// This node and what is under it in a document of their own. A value that outlives the
    /// file's decoding (a rule's `then:` overrides) keeps only itself alive, not the whole file.
    package func detached() -> YAMLNode {
        var copier = YAMLDocument.Builder()
        let root = copier.copy(self)
        return YAMLNode(YAMLDocument(copier), root)
    }

    package static func == (a: YAMLNode, b: YAMLNode) -> Bool {
        if a.document === b.document, a.index == b.index { return true }
        return a.range == b.range && a.tag == b.tag && a.value == b.value
    }

    /// Hashes what `==` compares but the children: equal nodes have equal ranges, kinds and
    /// texts, and two different nodes rarely share all three.
    package func hash(into hasher: inout Hasher) {
        let entry = entry
        hasher.combine(entry.range)
        hasher.combine(entry.kind)
        hasher.combine(scalar)
    }

    /// The pairs of a mapping, in order: a view of the document, allocating nothing.
    package struct Pairs: RandomAccessCollection, Sendable, Equatable, ExpressibleByArrayLiteral {
        let document: YAMLDocument?
        let first: Int32
        package let count: Int

        init(_ document: YAMLDocument, _ first: Int32, _ count: Int32) {
            self.document = document
            self.first = first
            self.count = Int(count)
        }

        /// `[]`, for `node.pairs ?? []`; a literal can give no pairs (its element type is `Never`).
        package init(arrayLiteral elements: Never...) {
            document = nil
            first = 0
            count = 0
        }

        package var startIndex: Int { 0 }
        package var endIndex: Int { count }

        package subscript(position: Int) -> Pair {
            precondition(position >= 0 && position < count, "pair index out of range")
            // Non-nil whenever count > 0: the empty literal has no elements to read.
            let document = document.unsafelyUnwrapped
            let slot = Int(first) + 2 * position
            return Pair(
                key: YAMLNode(document, document.children[slot]), value: YAMLNode(document, document.children[slot + 1])
            )
        }

        package static func == (a: Pairs, b: Pairs) -> Bool { a.elementsEqual(b) }
    }

    /// The items of a list, in order: a view of the document, allocating nothing.
    package struct Items: RandomAccessCollection, Sendable, Equatable, ExpressibleByArrayLiteral {
        let document: YAMLDocument?
        /// The first slot in the document's children; or, for ``init(single:)``, the node itself.
        let first: Int32
        let isSingle: Bool
        package let count: Int

        init(_ document: YAMLDocument, _ first: Int32, _ count: Int32) {
            self.document = document
            self.first = first
            self.count = Int(count)
            isSingle = false
        }

        /// A list of one node, for a scalar read as a one-item list (`status: 401`).
        package init(single node: YAMLNode) {
            document = node.document
            first = node.index
            count = 1
            isSingle = true
        }

        /// `[]`, for `node.items ?? []`; a literal can give no items (its element type is `Never`).
        package init(arrayLiteral elements: Never...) {
            document = nil
            first = 0
            count = 0
            isSingle = false
        }

        package var startIndex: Int { 0 }
        package var endIndex: Int { count }

        package subscript(position: Int) -> YAMLNode {
            precondition(position >= 0 && position < count, "item index out of range")
            let document = document.unsafelyUnwrapped
            return YAMLNode(document, isSingle ? first : document.children[Int(first) + position])
        }

        package static func == (a: Items, b: Items) -> Bool { a.elementsEqual(b) }
    }
}

/// Every node of one YAML file, in flat arrays: one entry per node (its kind, style, range and
/// where its text or children are), the scalars' texts, and the collections' children as node
/// numbers (a mapping's as key, value, key, value). Immutable once built, so nodes of it can be
/// read from any thread.
package final class YAMLDocument: Sendable {
    enum Kind: UInt8, Hashable {
        case scalar, mapping, sequence
    }

    /// One node in 24 bytes (a 20,000-rule file has about 240,000): its range, where its text or
    /// children are, and its slot count, kind, style and whether it has a tag packed in one word.
    struct Entry {
        var range: SourceRange
        /// A scalar's index in `texts`; a collection's first slot in `children`.
        var first: Int32
        /// Bits 0-23: a collection's number of slots in `children` (two per pair of a mapping);
        /// 24-25: the kind; 26-28: the style; 29: tagged (the tag is in `tags`).
        private var bits: UInt32

        /// The most slots one collection can have (the builder's node bound keeps under it).
        static let maxSlots = (1 << 24) - 1

        init(range: SourceRange, first: Int32, count: Int32, kind: Kind, style: YAMLNode.Style, tagged: Bool) {
            self.range = range
            self.first = first
            bits =
                UInt32(truncatingIfNeeded: count) & 0xFF_FFFF | UInt32(kind.rawValue) << 24
                | UInt32(style.rawValue) << 26 | (tagged ? 1 << 29 : 0)
        }

        var count: Int32 { Int32(bits & 0xFF_FFFF) }
        var kind: Kind { Kind(rawValue: UInt8(bits >> 24 & 0x3)) ?? .scalar }
        var style: YAMLNode.Style { YAMLNode.Style(rawValue: UInt8(bits >> 26 & 0x7)) ?? .plain }
        var isTagged: Bool { bits & 1 << 29 != 0 }
    }

    let entries: [Entry]
    let texts: [String]
    let children: [Int32]
    /// The tags written, by node number (nearly no node has one).
    let tags: [Int32: String]

    init(_ builder: consuming Builder) {
        entries = Self.fitted(builder.entries)
        texts = Self.fitted(builder.texts)
        children = Self.fitted(builder.children)
        tags = builder.tags
    }

    /// `array` in a buffer of its own size when more than a sixteenth of its size is unused room
    /// (growing by doubling leaves up to as much room as it holds). Why: lint's memory peak comes
    /// at the end of decoding, when the file's nodes and the decoded rules are both alive; copied
    /// here, while the nodes are the only large thing in memory, their unused room is not held
    /// through decoding (2 MB of a 20,000-rule file's 12 MB).
    static func fitted<Element>(_ array: [Element]) -> [Element] {
        guard array.capacity - array.count > array.count / 16 else { return array }
        var copy: [Element] = []
        copy.reserveCapacity(array.count)
        copy.append(contentsOf: array)
        return copy
    }

    /// Appends nodes; ``YAMLDocument/init(_:)`` freezes them.
    struct Builder {
        var entries: [Entry] = []
        var texts: [String] = []
        var children: [Int32] = []
        var tags: [Int32: String] = [:]

        mutating func scalar(_ text: String, style: YAMLNode.Style, tag: String?, range: SourceRange) -> Int32 {
            texts.append(text)
            return append(
                Entry(
                    range: range, first: Int32(texts.count - 1), count: 0, kind: .scalar, style: style,
                    tagged: tag != nil),
                tag: tag)
        }

        /// A mapping or list whose children (a mapping's as key, value, …) are `slots`.
        mutating func collection(
            _ kind: Kind, slots: some Collection<Int32>, tag: String?, range: SourceRange
        ) -> Int32 {
            let first = Int32(children.count)
            children.append(contentsOf: slots)
            return append(
                Entry(
                    range: range, first: first, count: Int32(children.count) - first, kind: kind, style: .plain,
                    tagged: tag != nil),
                tag: tag)
        }

        /// Another node like `node` (already in this builder) but written at `range`: an alias.
        mutating func alias(of node: Int32, at range: SourceRange) -> Int32 {
            var entry = entries[Int(node)]
            entry.range = range
            return append(entry, tag: entry.isTagged ? tags[node] : nil)
        }

        /// Copies `node`, from another document, and everything under it.
        mutating func copy(_ node: YAMLNode) -> Int32 {
            switch node.value {
            case .scalar(let text, let style):
                return scalar(text, style: style, tag: node.tag, range: node.range)
            case .mapping(let pairs):
                var slots: [Int32] = []
                slots.reserveCapacity(2 * pairs.count)
                for pair in pairs {
                    slots.append(copy(pair.key))
                    slots.append(copy(pair.value))
                }
                return collection(.mapping, slots: slots, tag: node.tag, range: node.range)
            case .sequence(let items):
                let slots = items.map { copy($0) }
                return collection(.sequence, slots: slots, tag: node.tag, range: node.range)
            }
        }

        func text(of node: Int32) -> String? {
            let entry = entries[Int(node)]
            return entry.kind == .scalar ? texts[Int(entry.first)] : nil
        }

        func isMergeKey(_ node: Int32) -> Bool {
            let entry = entries[Int(node)]
            return entry.kind == .scalar && entry.style == .plain && !entry.isTagged && texts[Int(entry.first)] == "<<"
        }

        private mutating func append(_ entry: Entry, tag: String?) -> Int32 {
            entries.append(entry)
            let node = Int32(entries.count - 1)
            if let tag { tags[node] = tag }
            return node
        }
    }
}

extension String {
    /// The text cut to 40 characters for quoting in a message, control characters made visible.
    package var truncatedForMessage: String {
        var out = ""
        for scalar in unicodeScalars.prefix(40) {
            out += scalar.value < 0x20 || scalar.value == 0x7F ? "?" : String(scalar)
        }
        return unicodeScalars.count > 40 ? out + "…" : out
    }
}
