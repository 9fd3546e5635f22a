/// The decision table of one scope: which rule, if any, matches a response or a failed attempt.
///
/// Why tables and not a scan: a policy may hold thousands of rules, and classification runs on
/// every response. Rules are indexed by what they constrain — status (an array indexed by the
/// status code), business code (a dictionary), error class — and the lists hold rule indices in
/// ascending order, so the first rule in a list whose remaining conditions (method, path,
/// headers, the other of status/code) hold is that list's answer, and the smallest of the lists'
/// answers is the first match overall, as "first match wins" requires. The typical lookup reads
/// one array slot and one dictionary entry, whatever the number of rules.
///
/// Concurrency contract: immutable after construction; read from any number of tasks at once.
package struct Classifier: Sendable {
    private let conditions: [Condition]
    /// For each status 100...599 (index status − 100): rules constraining status but not code.
    private let byStatus: [[Int32]]
    /// Rules constraining the business code (and possibly status), by code text.
    private let byCode: [String: [Int32]]
    /// The same, as a list, when there are few codes: comparing a handful of short strings is
    /// cheaper than hashing one (most policies name two or three codes).
    private let fewCodes: [(code: String, rules: [Int32])]?
    /// Rules matching responses without constraining status or code (headers, method, path only).
    private let anyResponse: [Int32]
    /// For each error class, in `TransportErrorClass.allCases` order.
    private let byError: [[Int32]]
    /// Whether every rule in the table depends only on status/code, so no further check is needed.
    private let needsRequestCheck: [Bool]

    package init(rules: [Rule]) {
        conditions = rules.map(\.when)
        var byStatus = [[Int32]](repeating: [], count: 500)
        var byCode: [String: [Int32]] = [:]
        var anyResponse: [Int32] = []
        var byError = [[Int32]](repeating: [], count: TransportErrorClass.allCases.count)
        var needsRequestCheck: [Bool] = []
        needsRequestCheck.reserveCapacity(rules.count)
        for (index, rule) in rules.enumerated() {
            let i = Int32(index)
            let when = rule.when
            needsRequestCheck.append(when.methods != nil || when.path != nil || when.headers != nil)
            if when.matchesResponses {
                if let codes = when.codes {
                    for code in Set(codes) { byCode[code, default: []].append(i) }
                } else if let statuses = when.statuses {
                    var seen = Set<Int>()
                    for range in statuses {
                        for status in range.lower...range.upper where seen.insert(status).inserted {
                            byStatus[status - 100].append(i)
                        }
                    }
                } else {
                    anyResponse.append(i)
                }
            }
            if let errors = when.errors {
                for (classIndex, errorClass) in TransportErrorClass.allCases.enumerated()
                where errors.contains(where: { $0.matches(errorClass) }) {
                    byError[classIndex].append(i)
                }
            }
        }
        self.byStatus = byStatus
        self.byCode = byCode
        fewCodes = byCode.count <= Self.fewCodesLimit ? byCode.map { ($0.key, $0.value) } : nil
        self.anyResponse = anyResponse
        self.byError = byError
        self.needsRequestCheck = needsRequestCheck
    }

    /// The index of the first rule matching a response, or `nil` (the response is delivered).
    /// `code` is the business code's text, `nil` when the response has none.
    @inline(__always)
    package func match(status: Int, code: String?, headers: HTTPHeaders, method: String, path: String) -> Int? {
        var best = Int32.max
        if (100...599).contains(status) {
            best = first(in: byStatus[status - 100], below: best, method: method, path: path, headers: headers) {
                _ in true
            }
        }
        if let code, let list = rules(forCode: code) {
            best = first(in: list, below: best, method: method, path: path, headers: headers) { index in
                guard let statuses = conditions[Int(index)].statuses else { return true }
                return statuses.contains { $0.contains(status) }
            }
        }
        if !anyResponse.isEmpty {
            best = first(in: anyResponse, below: best, method: method, path: path, headers: headers) { _ in true }
        }
        return best == Int32.max ? nil : Int(best)
    }

    static let fewCodesLimit = 8

    @inline(__always)
    private func rules(forCode code: String) -> [Int32]? {
        guard let fewCodes else { return byCode[code] }
        for entry in fewCodes where entry.code == code { return entry.rules }
        return nil
    }

    /// The index of the first rule matching an attempt that failed with `errorClass`.
    package func match(error errorClass: TransportErrorClass, method: String, path: String) -> Int? {
        let classIndex = TransportErrorClass.allCases.firstIndex(of: errorClass) ?? 0
        for index in byError[classIndex] {
            let condition = conditions[Int(index)]
            if !needsRequestCheck[Int(index)] || condition.requestMatches(method: method, path: path) {
                return Int(index)
            }
        }
        return nil
    }

    @inline(__always)
    private func first(
        in list: [Int32], below limit: Int32, method: String, path: String, headers: HTTPHeaders,
        _ extra: (Int32) -> Bool
    ) -> Int32 {
        for index in list {
            if index >= limit { return limit }
            if needsRequestCheck[Int(index)] {
                let condition = conditions[Int(index)]
                guard condition.requestMatches(method: method, path: path), condition.headersMatch(headers) else {
                    continue
                }
            }
            if extra(index) { return index }
        }
        return limit
    }
}
