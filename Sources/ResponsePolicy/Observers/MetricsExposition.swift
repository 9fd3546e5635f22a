import Foundation

/// Metric families rendered in the Prometheus text exposition format (version 0.0.4) or in
/// OpenMetrics 1.0, the two formats a Prometheus server scrapes.
///
/// One model, two renderings: a family is named without its type's suffix (`_total` for a
/// counter, `_info` for an info metric) and each format adds what it requires. In Prometheus'
/// format an info metric is a gauge named `…_info` with the value 1; OpenMetrics has the `info`
/// type, `# UNIT` lines for families whose name ends in their unit, and `# EOF` last.
package enum MetricsExposition {
    package enum Kind: String, Sendable {
        case counter, gauge, histogram, info
    }

    /// A histogram's buckets as exposed: the upper bounds and, for each, how many observations
    /// were at most that bound (cumulative), then the sum and the count of all of them.
    package struct Buckets: Sendable, Equatable {
        package var bounds: [Double]
        package var cumulative: [UInt64]
        package var sum: Double
        package var count: UInt64
    }

    package struct Sample: Sendable {
        /// Label names and values, in the order they are printed.
        package var labels: [(String, String)]
        package var value: Double
        /// Set for a histogram's sample (then `value` is unused).
        package var buckets: Buckets?

        package init(_ labels: [(String, String)] = [], _ value: Double) {
            self.labels = labels
            self.value = value
        }

        package init(_ labels: [(String, String)] = [], buckets: Buckets) {
            self.labels = labels
            value = 0
            self.buckets = buckets
        }
    }

    package struct Family: Sendable {
        /// Without the type's suffix: `response_policy_requests` for the counter
        /// `response_policy_requests_total`, `response_policy` for the info metric `response_policy_info`.
        package var name: String
        package var kind: Kind
        package var help: String
        /// The base unit the name ends with (`seconds`), for OpenMetrics' `# UNIT`.
        package var unit: String?
        package var samples: [Sample]

        package init(_ name: String, _ kind: Kind, unit: String? = nil, help: String, samples: [Sample]) {
            self.name = name
            self.kind = kind
            self.unit = unit
            self.help = help
            self.samples = samples
        }
    }

    /// The families as one exposition; a family without samples is left out.
    package static func render(_ families: [Family], openMetrics: Bool) -> String {
        var out = ""
        out.reserveCapacity(families.count * 256)
        for family in families where !family.samples.isEmpty {
            let exposed: String
            let type: String
            switch family.kind {
            case .info where !openMetrics:
                exposed = family.name + "_info"
                type = "gauge"
            default:
                exposed = family.name
                type = family.kind.rawValue
            }
            // Prometheus' format names the counter's samples in HELP and TYPE; OpenMetrics the family.
            let described = family.kind == .counter && !openMetrics ? exposed + "_total" : exposed
            out += "# HELP \(described) \(escapeHelp(family.help))\n"
            out += "# TYPE \(described) \(type)\n"
            if openMetrics, let unit = family.unit { out += "# UNIT \(described) \(unit)\n" }
            for sample in family.samples {
                switch family.kind {
                case .counter:
                    out += line(exposed + "_total", sample.labels, number(sample.value))
                case .gauge:
                    out += line(exposed, sample.labels, number(sample.value))
                case .info:
                    out += line(family.name + "_info", sample.labels, "1")
                case .histogram:
                    guard let buckets = sample.buckets else { continue }
                    for (bound, count) in zip(buckets.bounds, buckets.cumulative) {
                        out += line(exposed + "_bucket", sample.labels + [("le", label(bound))], String(count))
                    }
                    out += line(exposed + "_bucket", sample.labels + [("le", "+Inf")], String(buckets.count))
                    out += line(exposed + "_sum", sample.labels, number(buckets.sum))
                    out += line(exposed + "_count", sample.labels, String(buckets.count))
                }
            }
        }
        if openMetrics { out += "# EOF\n" }
        return out
    }

    static func line(_ name: String, _ labels: [(String, String)], _ value: String) -> String {
        guard !labels.isEmpty else { return name + " " + value + "\n" }
        return name + "{" + labels.map { $0.0 + "=\"" + escapeLabel($0.1) + "\"" }.joined(separator: ",") + "} "
            + value + "\n"
    }

    /// A sample's value: whole numbers without a fraction, others as Swift prints a `Double`
    /// (which Prometheus' and OpenMetrics' float syntax both read), `+Inf`, `-Inf`, `NaN`.
    static func number(_ value: Double) -> String {
        if value.isNaN { return "NaN" }
        if value.isInfinite { return value > 0 ? "+Inf" : "-Inf" }
        if value == value.rounded(), abs(value) < 1e15 { return String(Int64(value)) }
        return String(value)
    }

    /// A bucket bound as the `le` label: always with a fraction (`1.0`, `0.005`), as the
    /// reference clients print it, so one series keeps one label value across clients.
    static func label(_ bound: Double) -> String {
        if bound.isInfinite { return bound > 0 ? "+Inf" : "-Inf" }
        return String(bound)
    }

    /// A label value: backslash, double quote and line feed escaped (the only escapes both
    /// formats define).
    static func escapeLabel(_ text: String) -> String {
        guard text.contains(where: { $0 == "\\" || $0 == "\"" || $0 == "\n" }) else { return text }
        var out = ""
        for character in text {
            switch character {
            case "\\": out += "\\\\"
            case "\"": out += "\\\""
            case "\n": out += "\\n"
            default: out.append(character)
            }
        }
        return out
    }

    /// HELP text: backslash and line feed escaped.
    static func escapeHelp(_ text: String) -> String {
        text.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "\n", with: "\\n")
    }
}
