import Foundation

/// One benchmark figure with its baseline from the same run.
struct BenchResult {
    var name: String
    var value: Double
    var unit: String
    /// The baseline's figure in the same unit, when there is one.
    var baseline: Double?
    var baselineName: String?
    /// `baseline / value` for times (higher is better) unless `lowerIsBetter`.
    var ratio: Double?
    var ratioMeaning: String
    var extra: [(String, Double)] = []
    var goal: String

    var json: String {
        var fields = [
            "\"name\":\"\(name)\"", "\"value\":\(number(value))", "\"unit\":\"\(unit)\"",
        ]
        if let baseline { fields.append("\"baseline\":\(number(baseline))") }
        if let baselineName { fields.append("\"baseline_name\":\"\(baselineName)\"") }
        if let ratio { fields.append("\"ratio\":\(number(ratio))") }
        fields.append("\"ratio_meaning\":\"\(ratioMeaning)\"")
        for (key, value) in extra { fields.append("\"\(key)\":\(number(value))") }
        fields.append("\"goal\":\"\(goal)\"")
        return "{" + fields.joined(separator: ",") + "}"
    }

    func number(_ value: Double) -> String {
        guard value.isFinite else { return "null" }
        if value == value.rounded(), abs(value) < 1e15 { return String(Int64(value)) }
        return String(format: "%.3f", value)
    }

    static func table(_ results: [BenchResult]) -> String {
        var lines = [
            pad("benchmark", 20) + pad("value", 16) + pad("baseline", 30) + pad("ratio", 10) + "goal",
            String(repeating: "-", count: 100),
        ]
        for r in results {
            let value = r.number(r.value) + " " + r.unit
            let baseline = r.baseline.map { r.number($0) + " " + r.unit + " (" + (r.baselineName ?? "") + ")" } ?? "-"
            let ratio = r.ratio.map { String(format: "%.2f", $0) } ?? "-"
            lines.append(pad(r.name, 20) + pad(value, 16) + pad(baseline, 30) + pad(ratio, 10) + r.goal)
            for (key, value) in r.extra { lines.append(pad("", 20) + "\(key): \(r.number(value))") }
        }
        return lines.joined(separator: "\n")
    }

    static func pad(_ text: String, _ width: Int) -> String {
        text.count >= width ? text + " " : text + String(repeating: " ", count: width - text.count)
    }
}

/// Best-of-N timing of a closure running `iterations` times; returns ns per iteration.
func measure(iterations: Int, rounds: Int, _ body: () -> Void) -> Double {
    var best = Double.infinity
    for _ in 0..<rounds {
        let start = ContinuousClock.now
        for _ in 0..<iterations { body() }
        let elapsed = ContinuousClock.now - start
        best = min(best, elapsed.nanoseconds / Double(iterations))
    }
    return best
}

extension Duration {
    var nanoseconds: Double {
        let (seconds, attoseconds) = components
        return Double(seconds) * 1e9 + Double(attoseconds) / 1e9
    }
}

/// Keeps the optimiser from deleting work whose result is otherwise unused.
@inline(never)
func blackHole<T>(_ value: T) {
    withExtendedLifetime(value) {}
}

/// Resident memory from /proc/self/status, in bytes: current (VmRSS) and peak (VmHWM).
func residentMemory() -> (current: Double, peak: Double) {
    guard let text = try? String(contentsOfFile: "/proc/self/status", encoding: .utf8) else { return (0, 0) }
    func field(_ name: String) -> Double {
        for line in text.split(separator: "\n") where line.hasPrefix(name) {
            let digits = line.split(separator: " ").compactMap { Double($0) }.first ?? 0
            return digits * 1024
        }
        return 0
    }
    return (field("VmRSS:"), field("VmHWM:"))
}

/// The 1, 5 and 15 minute load averages, as /proc/loadavg prints them (`?` where there is none).
func machineLoad() -> String {
    guard let text = try? String(contentsOfFile: "/proc/loadavg", encoding: .utf8) else { return "?" }
    return text.split(separator: " ").prefix(3).joined(separator: " ")
}
