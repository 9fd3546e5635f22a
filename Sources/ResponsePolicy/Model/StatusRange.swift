/// An HTTP status code or an inclusive range of them, written `503` or `"520-599"`.
public struct StatusRange: Sendable, Hashable, CustomStringConvertible {
    public var lower: Int
    public var upper: Int

    public init(_ status: Int) {
        lower = status
        upper = status
    }

    public init(_ lower: Int, _ upper: Int) {
        self.lower = lower
        self.upper = upper
    }

    public func contains(_ status: Int) -> Bool { status >= lower && status <= upper }

    public var description: String { lower == upper ? "\(lower)" : "\(lower)-\(upper)" }
}

/// An inclusive range of integer business codes, written `"1400-1499"`.
public struct CodeRange: Sendable, Hashable, CustomStringConvertible {
    public var lower: Int64
    public var upper: Int64

    public init(_ lower: Int64, _ upper: Int64) {
        self.lower = lower
        self.upper = upper
    }

    public func contains(_ value: Int64) -> Bool { value >= lower && value <= upper }

    /// How many codes it spans (saturating).
    var count: Int64 {
        let (difference, overflow) = upper.subtractingReportingOverflow(lower)
        return overflow || difference == .max ? .max : difference + 1
    }

    public var description: String { "\(lower)-\(upper)" }
}
