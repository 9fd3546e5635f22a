/// An HTTP status code or an inclusive range of them, written `503` or `"520-599"`.
package struct StatusRange: Sendable, Hashable, CustomStringConvertible {
    package var lower: Int
    package var upper: Int

    package init(_ status: Int) {
        lower = status
        upper = status
    }

    package init(_ lower: Int, _ upper: Int) {
        self.lower = lower
        self.upper = upper
    }

    package func contains(_ status: Int) -> Bool { status >= lower && status <= upper }

    package var description: String { lower == upper ? "\(lower)" : "\(lower)-\(upper)" }
}

/// An inclusive range of integer business codes, written `"1400-1499"`.
package struct CodeRange: Sendable, Hashable, CustomStringConvertible {
    package var lower: Int64
    package var upper: Int64

    package init(_ lower: Int64, _ upper: Int64) {
        self.lower = lower
        self.upper = upper
    }

    package func contains(_ value: Int64) -> Bool { value >= lower && value <= upper }

    /// How many codes it spans (saturating).
    var count: Int64 {
        let (difference, overflow) = upper.subtractingReportingOverflow(lower)
        return overflow || difference == .max ? .max : difference + 1
    }

    package var description: String { "\(lower)-\(upper)" }
}
