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
