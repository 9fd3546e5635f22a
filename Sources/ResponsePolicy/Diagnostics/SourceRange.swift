/// A 1-based position in a source file. Columns count Unicode scalars.
///
/// Stored as two 32-bit numbers (a policy file is at most 16 MiB, so neither can overflow):
/// every YAML node, rule part and finding holds positions, and at 8 bytes a position the
/// parsed tree and the decoded rules of a 20,000-rule file are a good part smaller.
public struct SourcePosition: Sendable, Hashable, Comparable, CustomStringConvertible {
    private var storedLine: UInt32
    private var storedColumn: UInt32

    /// The line, from 1.
    public var line: Int {
        get { Int(storedLine) }
        set { storedLine = UInt32(clamping: newValue) }
    }

    /// The column, from 1, in Unicode scalars.
    public var column: Int {
        get { Int(storedColumn) }
        set { storedColumn = UInt32(clamping: newValue) }
    }

    package init(line: Int, column: Int) {
        storedLine = UInt32(clamping: line)
        storedColumn = UInt32(clamping: column)
    }

    /// Positions order by line, then column.
    public static func < (a: SourcePosition, b: SourcePosition) -> Bool {
        (a.line, a.column) < (b.line, b.column)
    }

    /// `LINE:COLUMN`.
    public var description: String { "\(line):\(column)" }
}

/// The stretch of source a node or finding covers, start inclusive, end exclusive.
public struct SourceRange: Sendable, Hashable, CustomStringConvertible {
    /// The first position covered.
    public var start: SourcePosition
    /// The position just past the last one covered.
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

    /// The start, `LINE:COLUMN`.
    public var description: String { start.description }
}
