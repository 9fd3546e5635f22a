import Foundation

extension Duration {
    /// The duration in seconds as a `Double`.
    package var seconds: Double {
        let (s, attoseconds) = components
        return Double(s) + Double(attoseconds) / 1e18
    }

    /// Parses a policy duration: a number with a unit, `250ms`, `1s`, `1.5s`, `2m`, `1h`.
    /// Returns `nil` for anything else (a bare number, an unknown unit, a negative value).
    package static func parsePolicy(_ text: String) -> Duration? {
        let units: [(String, Double)] = [("ms", 0.001), ("s", 1), ("m", 60), ("h", 3600)]
        for (unit, scale) in units where text.hasSuffix(unit) {
            let number = text.dropLast(unit.count)
            guard !number.isEmpty, number.allSatisfy({ $0.isASCII && ($0.isNumber || $0 == ".") }),
                number.filter({ $0 == "." }).count <= 1, number.first != ".", number.last != ".",
                let value = Double(number), value.isFinite
            else { return nil }
            let seconds = value * scale
            guard seconds <= 3_153_600_000 else { return nil }
            return .milliseconds(Int64((seconds * 1000).rounded()))
        }
        return nil
    }

    /// The shortest policy spelling: `250ms`, `1s`, `1.5s`, `2m`, `1h`.
    package var policyText: String {
        let ms = Int64((seconds * 1000).rounded())
        if ms == 0 { return "0s" }
        if ms % 3_600_000 == 0 { return "\(ms / 3_600_000)h" }
        if ms % 60_000 == 0 { return "\(ms / 60_000)m" }
        if ms % 1000 == 0 { return "\(ms / 1000)s" }
        if ms < 1000 { return "\(ms)ms" }
        return formatNumber(Double(ms) / 1000) + "s"
    }
}

/// A number without a trailing `.0`, at most three decimals: `2`, `1.5`, `0.125`.
package func formatNumber(_ value: Double) -> String {
    if value == value.rounded(), abs(value) < 1e15 { return String(Int64(value)) }
    var text = String(format: "%.3f", value)
    while text.hasSuffix("0") { text.removeLast() }
    if text.hasSuffix(".") { text.removeLast() }
    return text
}
