import Foundation
import ResponsePolicy

/// Decodes just the business code, the fastest way the standard library offers.
struct StatusOnly: Decodable {
    let status: Int
}

enum Benchmarks {
    /// A ~1 KiB JSON body with nested objects and escaped strings; the code first or last.
    static func body(codeFirst: Bool) -> Data {
        var fields: [String] = []
        fields.append(#""message":"token \"expired\" for user \\ caf\u00e9 \ud83d\ude00 please refresh""#)
        fields.append(
            #""data":{"user":{"id":12345,"name":"A \"quoted\" name","roles":["admin","ops",{"nested":[1,2,3,{"deep":"x"}]}]},"flags":[true,false,null]}"#
        )
        fields.append(
            #""trace":{"span":"0af7651916cd43dd8448eb211c80319c","parent":"b7ad6b7169203331","sampled":true,"tags":{"a":"1","b":"2","c":"\u0041\n\t"}}"#
        )
        var padding = 0
        while (fields.joined(separator: ",").utf8.count + 40) < 1000 {
            fields.append(
                "\"pad\(padding)\":{\"k\":\"v\(padding)\",\"n\":[\(padding),\(padding + 1)],\"s\":\"\\\"\(padding)\\\"\"}"
            )
            padding += 1
        }
        let code = "\"status\":1401"
        let all = codeFirst ? [code] + fields : fields + [code]
        return Data(("{" + all.joined(separator: ",") + "}").utf8)
    }

    static func classify(quick: Bool) -> [BenchResult] {
        let policy: Policy
        do {
            policy = try Policy.load(yaml: Policy.defaultPolicyText, file: "default.yaml")
        } catch {
            fatalError("the embedded default policy does not load: \(error)")
        }
        let scope = policy.graph.scope(method: "GET", path: "/profile")
        guard let path = scope.codePath else { fatalError("default.yaml has no body code path") }
        let iterations = quick ? 200 : 200_000
        let rounds = quick ? 1 : 5
        var results: [BenchResult] = []
        for first in [true, false] {
            let body = body(codeFirst: first)
            let response = HTTPResponse(status: 200, body: body)
            let ours = measure(iterations: iterations, rounds: rounds) {
                let rule = response.body.withUnsafeBytes { bytes in
                    JSONCodeScanner.withCode(in: bytes, at: path) { code in
                        // Codes up to 15 bytes become small strings: no allocation.
                        scope.classifier.match(
                            status: 200, code: code.map { String(decoding: $0, as: UTF8.self) },
                            headers: response.headers, method: "GET", path: "/profile")
                    }
                }
                blackHole(rule)
            }
            let decoder = JSONDecoder()
            let viaDecoder = measure(iterations: iterations / 4, rounds: rounds) {
                let decoded = try? decoder.decode(StatusOnly.self, from: body)
                blackHole(decoded?.status)
            }
            let viaSerialization = measure(iterations: iterations / 4, rounds: rounds) {
                let object = try? JSONSerialization.jsonObject(with: body) as? [String: Any]
                blackHole(object?["status"] as? Int)
            }
            let bytesPerSecond = Double(body.count) / (ours / 1e9)
            results.append(
                BenchResult(
                    name: first ? "classify-1k-first" : "classify-1k-last", value: ours, unit: "ns",
                    baseline: viaDecoder, baselineName: "JSONDecoder", ratio: viaDecoder / ours,
                    ratioMeaning: "JSONDecoder ns / ours ns, higher is better",
                    extra: [
                        ("jsonserialization_ns", viaSerialization),
                        ("ratio_vs_jsonserialization", viaSerialization / ours),
                        ("bytes_per_second", bytesPerSecond), ("body_bytes", Double(body.count)),
                    ],
                    goal: first ? ">= 50x JSONDecoder" : ">= 10x JSONDecoder, >= 1 GB/s"))
        }
        return results
    }

    static func rulesPolicy(_ count: Int) -> String {
        var text = "policy: 1\nname: many\nclassify: { code: body.status }\nrules:\n"
        for index in 0..<count {
            switch index % 4 {
            case 0: text += "  - { name: c\(index), when: { code: [\(10_000 + index)] }, then: fail }\n"
            case 1: text += "  - { name: h\(index), when: { code: [\"E\(index)\"], status: [200] }, then: deliver }\n"
            case 2:
                text +=
                    "  - { name: p\(index), when: { code: [\(10_000 + index)], path: \"/p\(index)/*\" }, then: fail }\n"
            default:
                text += "  - { name: s\(index), when: { code: [\(10_000 + index)], method: [POST] }, then: deliver }\n"
            }
        }
        return text
    }

    static func decide(quick: Bool) -> BenchResult {
        let large = quick ? 200 : 20_000
        func timing(_ count: Int, code: String) -> Double {
            guard let policy = try? Policy.load(yaml: rulesPolicy(count)) else {
                fatalError("generated policy invalid")
            }
            let classifier = policy.graph.scopes[policy.graph.scopes.count - 1].classifier
            let headers = HTTPHeaders()
            return measure(iterations: quick ? 1000 : 2_000_000, rounds: quick ? 1 : 5) {
                blackHole(classifier.match(status: 200, code: code, headers: headers, method: "GET", path: "/x"))
            }
        }
        // The last rule's code: a scan would walk every rule before it.
        let lastCode = String(10_000 + (large - 4))
        let many = timing(large, code: lastCode)
        let few = timing(5, code: "10004")
        return BenchResult(
            name: "decide-20k-rules", value: many, unit: "ns", baseline: few, baselineName: "5 rules",
            ratio: many / few, ratioMeaning: "20k-rule ns / 5-rule ns, lower is better", goal: "<= 2")
    }

    static func loadDefault(quick: Bool) -> BenchResult {
        let iterations = quick ? 5 : 500
        let start = ContinuousClock.now
        for _ in 0..<iterations { blackHole(try? Policy.load(yaml: Policy.defaultPolicyText)) }
        let micros = (ContinuousClock.now - start).nanoseconds / 1000 / Double(iterations)
        // Baseline: libyaml's events for the same text, nothing built from them.
        let bytes = Array(Policy.defaultPolicyText.utf8)
        let parseStart = ContinuousClock.now
        for _ in 0..<iterations { blackHole(YAMLLoader.countEvents(bytes)) }
        let parse = (ContinuousClock.now - parseStart).nanoseconds / 1000 / Double(iterations)
        return BenchResult(
            name: "load-default", value: micros, unit: "us", baseline: parse, baselineName: "libyaml events",
            ratio: micros / parse, ratioMeaning: "load us / libyaml event parse us, lower is better", goal: "report")
    }
}
