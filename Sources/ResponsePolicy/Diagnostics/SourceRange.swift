/// A 1-based position in a source file. Columns count Unicode scalars.
public struct SourcePosition: Sendable, Hashable, Comparable, CustomStringConvertible {
    public var line: Int
    public var column: Int

    package init(line: Int, column: Int) {
        self.line = line
        self.column = column
    }

    public static func < (a: SourcePosition, b: SourcePosition) -> Bool {
        (a.line, a.column) < (b.line, b.column)
    }

    public var description: String { "\(line):\(column)" }
}

/// The stretch of source a node or finding covers, start inclusive, end exclusive.
public struct SourceRange: Sendable, Hashable, CustomStringConvertible {
    public var start: SourcePosition
    public var end: SourcePosition

    package init(start: SourcePosition, end: SourcePosition) {
        self.start = start
        self.end = end
    }

    package init(line: Int, column: Int) {
        start = SourcePosition(line: line, column: column)
        end = start
    }

    /// Position 1:1, for findings about a whole file.
    package static let fileStart = SourceRange(line: 1, column: 1)

    public var description: String { start.description }
}
