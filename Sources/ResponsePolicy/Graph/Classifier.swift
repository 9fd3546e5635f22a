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
    /// For each status from ``statusBase`` on (index status − statusBase), up to the highest
    /// status a rule names: rules constraining status but not code. Only the span the rules name
    /// is kept: a table for all 500 statuses was 4 KiB per scope, 400 MB for 100,000 routes.
    private let byStatus: [[Int32]]
    private let statusBase: Int
    /// Rules constraining the business code (and possibly status), by code text.
    private let byCode: CodeTable
    /// Code ranges too wide to expand into `byCode`, with their rule, in rule order (rare).
    private let wideCodeRanges: [(range: CodeRange, rule: Int32)]
    /// Rules matching responses without constraining status or code (headers, method, path only).
    private let anyResponse: [Int32]
    /// For each error class, in `TransportErrorClass.allCases` order.
    private let byError: [[Int32]]
    /// Whether every rule in the table depends only on status/code, so no further check is needed.
    private let needsRequestCheck: [Bool]
    /// For each rule: whether the code table lists another rule under one of its codes (a code
    /// both name, or one inside the other's range of at most ``expandLimit`` codes).
    ///
    /// Lint's code checks (`shadowed-rule`, `conflicting-codes`) read it so that a rule whose
    /// codes no other rule names, nearly every rule of a large policy, costs them no table
    /// entries of their own: no other rule names its codes to shadow or contradict it there.
    let sharesCode: [Bool]

    /// The widest code range expanded into the code table.
    static let expandLimit: Int64 = 4096

    package init(rules: [Rule]) {
        conditions = rules.map(\.when)
        var byStatus = [[Int32]](repeating: [], count: 500)
        var lowestStatus = 600
        var highestStatus = 99
        // Filled in place: building a `[String: [Int32]]` first and converting it hashed every
        // code's text once more than needed (a fifth of making the table for 20,000 codes).
        var byCode = CodeTable(expecting: CodeTable.integerBound(conditions))
        var anyResponse: [Int32] = []
        var wideCodeRanges: [(range: CodeRange, rule: Int32)] = []
        var byError = [[Int32]](repeating: [], count: TransportErrorClass.allCases.count)
        var needsRequestCheck: [Bool] = []
        needsRequestCheck.reserveCapacity(rules.count)
        var sharesCode = [Bool](repeating: false, count: rules.count)
        /// Lists rule `i` under `code`, and marks both it and the code's first rule when the
        /// code already had one (the rules between were marked when they came).
        func list(_ i: Int32, under code: String) {
            guard let first = byCode.append(i, to: code) else { return }
            sharesCode[Int(first)] = true
            sharesCode[Int(i)] = true
        }
        // Over the conditions just copied out of the rules: reading each rule's again copied
        // its condition a second time (a retain of each of its lists).
        for (index, when) in conditions.enumerated() {
            let i = Int32(index)
            needsRequestCheck.append(when.methods != nil || when.path != nil || when.headers != nil)
            if when.matchesResponses {
                if let codes = when.codes, codes.count == 1, when.codeRanges == nil {
                    // One code (nearly every code rule): nothing to deduplicate, no set to make.
                    list(i, under: codes[0])
                } else if let codes = when.codes {
                    var seen = Set<String>()
                    for code in codes where seen.insert(code).inserted { list(i, under: code) }
                    for range in when.codeRanges ?? [] {
                        // A range of up to 4,096 codes is expanded into the table, so matching it stays
                        // one lookup; a wider one is checked on its own (policies rarely have any).
                        guard range.count <= Self.expandLimit else {
                            wideCodeRanges.append((range, i))
                            continue
                        }
                        for value in range.lower...range.upper {
                            let code = String(value)
                            if seen.insert(code).inserted { list(i, under: code) }
                        }
                    }
                } else if let statuses = when.statuses {
                    for range in statuses {
                        // Rules come in ascending order, so a status that already lists this rule
                        // lists it last: overlapping ranges list it once, without a set per rule.
                        for status in range.lower...range.upper where byStatus[status - 100].last != i {
                            byStatus[status - 100].append(i)
                        }
                        lowestStatus = min(lowestStatus, range.lower)
                        highestStatus = max(highestStatus, range.upper)
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
        if lowestStatus <= highestStatus {
            self.byStatus = Array(byStatus[(lowestStatus - 100)...(highestStatus - 100)])
            statusBase = lowestStatus
        } else {
            self.byStatus = []
            statusBase = 100
        }
        self.byCode = byCode
        self.anyResponse = anyResponse
        self.wideCodeRanges = wideCodeRanges
        self.byError = byError
        self.needsRequestCheck = needsRequestCheck
        self.sharesCode = sharesCode
    }

    /// The index of the first rule matching a response, or `nil` (the response is delivered).
    /// `code` is the business code's text, `nil` when the response has none.
    ///
    /// The answer is the smallest of the lists' answers: the rules on the status (or on no
    /// status or code), and the rules on the code (``matchCodeRules(status:code:headers:method:path:)``).
    /// So `match(status: s, code: c)` is the smaller of `match(status: s, code: nil)` and
    /// `matchCodeRules(status: s, code: c)`, which `policy diff` relies on to ask about every
    /// code without asking about every request context again.
    ///
    /// Allocates nothing, and costs at most one pass over each glob a candidate rule holds
    /// (``Glob`` matches in time linear in the header or path).
    @inline(__always)
    package func match(status: Int, code: String?, headers: HTTPHeaders, method: String, path: String) -> Int? {
        var best = Int32.max
        if status >= statusBase, status - statusBase < byStatus.count {
            best = first(in: byStatus[status - statusBase], below: best, method: method, path: path, headers: headers) {
                _ in true
            }
        }
        if let code {
            best = firstCodeRule(status: status, code: code, below: best, headers: headers, method: method, path: path)
        }
        if !anyResponse.isEmpty {
            best = first(in: anyResponse, below: best, method: method, path: path, headers: headers) { _ in true }
        }
        return best == Int32.max ? nil : Int(best)
    }

    /// The index of the first rule constraining the business code that matches the response, or
    /// `nil`: the part of ``match(status:code:headers:method:path:)`` that depends on the code.
    package func matchCodeRules(status: Int, code: String, headers: HTTPHeaders, method: String, path: String)
        -> Int?
    {
        let best = firstCodeRule(
            status: status, code: code, below: Int32.max, headers: headers, method: method, path: path)
        return best == Int32.max ? nil : Int(best)
    }

    @inline(__always)
    private func firstCodeRule(
        status: Int, code: String, below limit: Int32, headers: HTTPHeaders, method: String, path: String
    ) -> Int32 {
        var best = limit
        if let list = byCode[code] {
            best = first(in: list, below: best, method: method, path: path, headers: headers) { index in
                guard let statuses = conditions[Int(index)].statuses else { return true }
                return statuses.contains { $0.contains(status) }
            }
        }
        if !wideCodeRanges.isEmpty, let value = CodeTable.canonicalInteger(code) {
            for (range, index) in wideCodeRanges where index < best && range.contains(value) {
                let condition = conditions[Int(index)]
                if condition.statuses.map({ $0.contains { $0.contains(status) } }) ?? true,
                    !needsRequestCheck[Int(index)]
                        || (condition.requestMatches(method: method, path: path) && condition.headersMatch(headers))
                {
                    best = index
                    break
                }
            }
        }
        return best
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
            // Read in place: copying the condition out cost a retain and release of each of
            // its lists per candidate rule.
            if needsRequestCheck[Int(index)] {
                guard conditions[Int(index)].requestMatches(method: method, path: path),
                    conditions[Int(index)].headersMatch(headers)
                else { continue }
            }
            if extra(index) { return index }
        }
        return limit
    }
}

/// Rule lists by business code: an open-addressing table keyed by the code's integer value for
/// codes written as canonical integers (`1401`, `-5`, `0`: what nearly every API sends), a
/// dictionary for any other text.
///
/// Why: hashing a `String` (SipHash) was most of a lookup, and made a policy with 20,000 codes
/// cost twice one with five. A canonical integer text and its value determine each other, so
/// two such codes are equal as text exactly when their values are; parsing one costs a few
/// nanoseconds and its table slot is found with one multiplication.
///
/// Concurrency contract: filled by ``Classifier/init(rules:)`` (``append(_:to:)``), then held
/// in a `let` and only read.
package struct CodeTable: Sendable {
    /// Open addressing with linear probing; at most half full.
    private var slots: [(value: Int64, rules: [Int32])?]
    private var shift: Int
    /// Slots in use: the table doubles when more than half are, so a probe always ends.
    private var used = 0
    private var others: [String: [Int32]] = [:]

    /// An empty table with room for `count` integer codes (more make it grow once per doubling).
    init(expecting count: Int) {
        var bits = 1
        while (1 << bits) < count * 2 { bits += 1 }
        slots = [(value: Int64, rules: [Int32])?](repeating: nil, count: 1 << bits)
        shift = 64 - bits
    }

    /// At least the number of distinct integer codes the rules name (each code listed, each
    /// value of each range ``Classifier/expandLimit`` expands), so the table is sized once.
    static func integerBound(_ conditions: [Condition]) -> Int {
        var count = 0
        for when in conditions where when.matchesResponses {
            guard let codes = when.codes else { continue }
            for code in codes where canonicalInteger(code) != nil { count += 1 }
            for range in when.codeRanges ?? [] where range.count <= Classifier.expandLimit {
                count += Int(range.count)
            }
        }
        return count
    }

    /// Adds rule `rule` to the list of `code` (rules are appended in ascending order), and
    /// returns the list's first rule when it had one.
    @discardableResult
    mutating func append(_ rule: Int32, to code: String) -> Int32? {
        func append(to list: inout [Int32]) -> Int32? {
            defer { list.append(rule) }
            return list.first
        }
        guard let value = Self.canonicalInteger(code) else { return append(to: &others[code, default: []]) }
        var slot = Self.slot(value, shift)
        // Only the value is read: a copy of the slot's list held here would make the append
        // below copy the list, for every further rule on a code many rules share.
        while let found = slots[slot]?.value {
            if found == value {
                let first = slots[slot]?.rules.first
                slots[slot]?.rules.append(rule)
                return first
            }
            slot = (slot + 1) & (slots.count - 1)
        }
        slots[slot] = (value, [rule])
        used += 1
        if used * 2 > slots.count { grow() }
        return nil
    }

    /// Twice the slots, every entry placed again (not reached when ``integerBound(_:)`` sized
    /// the table: a safety net, so a table filled past its size never makes a probe loop forever).
    private mutating func grow() {
        let old = slots
        shift -= 1
        slots = [(value: Int64, rules: [Int32])?](repeating: nil, count: old.count * 2)
        for case let entry? in old {
            var slot = Self.slot(entry.value, shift)
            while slots[slot] != nil { slot = (slot + 1) & (slots.count - 1) }
            slots[slot] = entry
        }
    }

    subscript(code: String) -> [Int32]? {
        guard let value = Self.canonicalInteger(code) else { return others[code] }
        var slot = Self.slot(value, shift)
        // Only the value is read while probing: no copy of another code's list per probe.
        while let found = slots[slot]?.value {
            if found == value { return slots[slot]?.rules }
            slot = (slot + 1) & (slots.count - 1)
        }
        return nil
    }

    @inline(__always)
    private static func slot(_ value: Int64, _ shift: Int) -> Int {
        Int(truncatingIfNeeded: (UInt64(bitPattern: value) &* 0x9E37_79B9_7F4A_7C15) >> UInt64(shift))
    }

    /// The value of `text` when it is a canonical integer: an optional `-`, then digits without a
    /// leading zero (`0` itself excepted, `-0` not), at most 18 of them.
    package static func canonicalInteger(_ text: String) -> Int64? {
        // Over the contiguous bytes (every native string, small ones too) when there are: the
        // UTF-8 view's own iterator cost about 200 instructions for a five-digit code, and lint
        // and the classifier read each of 20,000 codes this way several times.
        if let value = text.utf8.withContiguousStorageIfAvailable({ buffer in
            var bytes = buffer.makeIterator()
            return canonicalInteger(&bytes)
        }) {
            return value
        }
        var bytes = text.utf8.makeIterator()
        return canonicalInteger(&bytes)
    }

    @inline(__always)
    private static func canonicalInteger(_ utf8: inout some IteratorProtocol<UInt8>) -> Int64? {
        guard var byte = utf8.next() else { return nil }
        let negative = byte == UInt8(ascii: "-")
        if negative {
            guard let next = utf8.next() else { return nil }
            byte = next
        }
        guard byte >= UInt8(ascii: "0"), byte <= UInt8(ascii: "9") else { return nil }
        var value = Int64(byte &- UInt8(ascii: "0"))
        if value == 0 { return utf8.next() == nil && !negative ? 0 : nil }
        var digits = 1
        while let next = utf8.next() {
            guard next >= UInt8(ascii: "0"), next <= UInt8(ascii: "9"), digits < 18 else { return nil }
            value = value * 10 + Int64(next &- UInt8(ascii: "0"))
            digits += 1
        }
        return negative ? -value : value
    }
}
