import Foundation
import ResponsePolicy

extension PolicyDiff.TriggerSpace {
    /// A set of contexts (indices into ``contexts``) as bits: equal sets compare and hash equal,
    /// so atoms that hold in the same contexts are grouped by it.
    struct ContextSet: Hashable {
        private(set) var words: [UInt64]

        init(count: Int) {
            words = [UInt64](repeating: 0, count: (count + 63) / 64)
        }

        init(words: [UInt64]) {
            self.words = words
        }

        /// Every context of `count`.
        init(all count: Int) {
            words = [UInt64](repeating: ~0, count: (count + 63) / 64)
            if count % 64 != 0, !words.isEmpty { words[words.count - 1] = (1 << UInt64(count % 64)) - 1 }
        }

        /// Sets bits `range` of the set stored at `offset` in `buffer`, a word at a time.
        static func setBits(_ buffer: UnsafeMutableBufferPointer<UInt64>, offset: Int, _ range: Range<Int>) {
            var index = range.lowerBound
            while index < range.upperBound {
                let bit = index & 63
                let take = min(64 - bit, range.upperBound - index)
                let mask: UInt64 = take == 64 ? ~0 : ((1 << UInt64(take)) - 1) << UInt64(bit)
                buffer[offset + index >> 6] |= mask
                index += take
            }
        }

        /// ORs `mask` (bit i standing for bit `at + i`) into the set stored at `offset`.
        static func orBits(_ buffer: UnsafeMutableBufferPointer<UInt64>, offset: Int, at start: Int, _ mask: [UInt64]) {
            for (index, value) in mask.enumerated() where value != 0 {
                let position = start + index * 64
                let word = offset + position >> 6
                let shift = UInt64(position & 63)
                buffer[word] |= value << shift
                if shift > 0, value >> (64 - shift) != 0 { buffer[word + 1] |= value >> (64 - shift) }
            }
        }

        @inline(__always)
        mutating func insert(_ index: Int) {
            words[index >> 6] |= 1 << UInt64(index & 63)
        }

        var count: Int { words.reduce(0) { $0 + $1.nonzeroBitCount } }

        /// Calls `body` with each context, ascending, without building a list.
        @inline(__always)
        func forEach(_ body: (Int) -> Void) {
            for (wordIndex, word) in words.enumerated() where word != 0 {
                var rest = word
                while rest != 0 {
                    body(wordIndex * 64 + rest.trailingZeroBitCount)
                    rest &= rest - 1
                }
            }
        }

        /// The contexts, ascending.
        var elements: [Int] {
            var out: [Int] = []
            for (wordIndex, word) in words.enumerated() where word != 0 {
                var rest = word
                while rest != 0 {
                    out.append(wordIndex * 64 + rest.trailingZeroBitCount)
                    rest &= rest - 1
                }
            }
            return out
        }
    }

    /// Classes of the values of one dimension (methods, paths or header sets) that a set of
    /// rules cannot tell apart: each value's class, and one value standing for each class.
    struct Classes {
        var of: [Int]
        var representative: [Int]

        init(size: Int) {
            of = [Int](repeating: 0, count: size)
            representative = size > 0 ? [0] : []
        }

        var count: Int { representative.count }

        /// Splits each class by whether `holds` is true of its values.
        mutating func refine(by holds: [Bool]) {
            var split = [Int](repeating: -1, count: count * 2)
            var representative: [Int] = []
            for value in of.indices {
                let key = of[value] * 2 + (holds[value] ? 1 : 0)
                if split[key] < 0 {
                    split[key] = representative.count
                    representative.append(value)
                }
                of[value] = split[key]
            }
            self.representative = representative
        }
    }

    /// The classes of all three dimensions: a context's class is one index.
    struct Partition {
        var methods: Classes
        var paths: Classes
        var headers: Classes

        var count: Int { methods.count * paths.count * headers.count }

        @inline(__always)
        func of(method: Int, path: Int, header: Int) -> Int {
            (methods.of[method] * paths.count + paths.of[path]) * headers.count + headers.of[header]
        }

        /// The method, path and header set standing for class `index`.
        func representative(_ index: Int) -> (method: Int, path: Int, header: Int) {
            let header = index % headers.count
            let path = (index / headers.count) % paths.count
            let method = index / (headers.count * paths.count)
            return (methods.representative[method], paths.representative[path], headers.representative[header])
        }
    }

    /// What one rule's request conditions say about each method, path and header set of the
    /// space (`nil`: the rule does not constrain that dimension). Globs are asked once per pattern.
    struct RequestTruths {
        var methods: [[Bool]?] = []
        var paths: [[Bool]?] = []
        var headers: [[Bool]?] = []

        init(_ conditions: [Condition], _ space: PolicyDiff.TriggerSpace) {
            var byGlob: [Glob: [Bool]] = [:]
            for when in conditions {
                methods.append(when.methods.map { listed in space.methods.map { listed.contains($0.probe) } })
                paths.append(
                    when.path.map { glob in
                        if let known = byGlob[glob] { return known }
                        let truths = space.paths.map { glob.matches($0.probe) }
                        byGlob[glob] = truths
                        return truths
                    })
                headers.append(when.headers.map { _ in space.headers.map { when.headersMatch($0.probe) } })
            }
        }

        /// The partition of the space by the rules at `indices`, refining `start`.
        func partition(_ indices: [Int], refining start: Partition) -> Partition {
            var partition = start
            for index in indices {
                if let truths = methods[index] { partition.methods.refine(by: truths) }
                if let truths = paths[index] { partition.paths.refine(by: truths) }
                if let truths = headers[index] { partition.headers.refine(by: truths) }
            }
            return partition
        }
    }

    /// Where each atom leads to each action in `scope`: the same sets as
    /// ``enumeratedHolds(_:)``, from one question to the decision table per class of contexts
    /// that no rule in play tells apart, instead of one per context.
    ///
    /// Why it is the same: the decision table's answer for a response depends on the context
    /// only through which rules' method, path and header conditions hold, so contexts in one
    /// class of the partition by those rules get one answer. The rules in play: for a status
    /// (no code), those naming no code; for a code, also those naming it, whose part of the
    /// answer is ``Classifier/matchCodeRules(status:code:headers:method:path:)`` (the table's
    /// answer is the smaller of the two); for an error class, those naming errors. A 1,000-rule
    /// policy with 400 paths and 100 header values has 160,000 contexts; asking about each, for
    /// every code and status, took over ten minutes.
    func holds(_ scope: RuleGraph.Scope) -> [Atom: [ActionKind: ContextSet]] {
        var budget = Int.max
        return holds(scope, budget: &budget) ?? [:]
    }

    /// ``holds(_:)`` within `budget` steps (a question to the decision table, a context or a
    /// class visited), taken from it; `nil` once it ran out (the caller says the triggers were not
    /// compared).
    func holds(_ scope: RuleGraph.Scope, budget: inout Int) -> [Atom: [ActionKind: ContextSet]]? {
        let compiled = scope.compiled
        let conditions = compiled.map(\.rule.when)
        let actions = compiled.map(\.action)
        func action(_ index: Int?) -> ActionKind { index.map { actions[$0] } ?? .deliver }
        let truths = RequestTruths(conditions, self)
        let whole = Partition(
            methods: Classes(size: methods.count), paths: Classes(size: paths.count),
            headers: Classes(size: headers.count))
        let count = contexts.count
        let kinds: [ActionKind] = [.refresh, .logout, .retry, .fail]
        var holds: [Atom: [ActionKind: ContextSet]] = [:]

        // Statuses: the rules naming no code decide; one question per status and class.
        let statusRules = conditions.indices.filter { conditions[$0].codes == nil && conditions[$0].matchesResponses }
        let byStatus = truths.partition(statusRules, refining: whole)
        budget -= contexts.count
        let classOfContext = contexts.map { byStatus.of(method: $0.method, path: $0.path, header: $0.headers) }
        var statusIndex: [[Int32]] = []  // [status][class]: the rule, -1 for none
        for range in statuses {
            budget -= 2 * byStatus.count + contexts.count
            guard budget >= 0 else { return nil }
            // Only the rules that can answer for this status tell its contexts apart: one
            // question per class of their partition (a 429 rule's header values need not be
            // asked about at every path a 502 rule names; that was 40,000 questions per status).
            let relevant = statusRules.filter { index in
                conditions[index].statuses?.contains { $0.contains(range.lowerBound) } ?? true
            }
            budget -= statusRules.count + relevant.count * (methods.count + paths.count + headers.count)
            let own = truths.partition(relevant, refining: whole)
            var answers = [Int32](repeating: -2, count: own.count)  // -2: not asked yet
            var row = [Int32](repeating: -1, count: byStatus.count)
            for index in 0..<byStatus.count {
                let (m, p, h) = byStatus.representative(index)
                let cls = own.of(method: m, path: p, header: h)
                if answers[cls] == -2 {
                    budget -= 16  // a question costs about as much as that many steps
                    let (om, op, oh) = own.representative(cls)
                    let answer = scope.classifier.match(
                        status: range.lowerBound, code: nil, headers: headers[oh].probe, method: methods[om].probe,
                        path: paths[op].probe)
                    answers[cls] = Int32(answer ?? -1)
                }
                row[index] = answers[cls]
            }
            statusIndex.append(row)
        }
        func kindOf(_ index: Int32) -> ActionKind { index < 0 ? .deliver : actions[Int(index)] }
        // Which dimensions each status's answers depend on (1: method, 2: path, 4: header
        // set). When each depends on one at most (502 on paths, 429 on header values), a code's
        // effect is worked out per dimension and combined, instead of per class of all three.
        let (pN, hN) = (byStatus.paths.count, byStatus.headers.count)
        var dependence = [Int](repeating: 0, count: statuses.count)
        for (s, row) in statusIndex.enumerated() {
            for index in 0..<byStatus.count {
                let h = index % hN
                let p = (index / hN) % pN
                let m = index / (hN * pN)
                if row[index] != row[(m * pN + p) * hN] { dependence[s] |= 4 }
                if row[index] != row[m * pN * hN + h] { dependence[s] |= 2 }
                if row[index] != row[p * hN + h] { dependence[s] |= 1 }
            }
        }
        let factored = dependence.allSatisfy { $0.nonzeroBitCount <= 1 }
        for (s, row) in statusIndex.enumerated() {
            var sets: [ActionKind: ContextSet] = [:]
            for (context, cls) in classOfContext.enumerated() {
                let kind = kindOf(row[cls])
                if kind != .deliver { sets[kind, default: ContextSet(count: count)].insert(context) }
            }
            if !sets.isEmpty { holds[.status(s)] = sets }
        }

        // Codes: the rules naming the code refine the statuses' classes.
        var byCodeText: [String: [Int]] = [:]
        var ranged: [Int] = []
        for (index, when) in conditions.enumerated() where when.codes != nil && when.matchesResponses {
            for code in Set(when.codes ?? []) { byCodeText[code, default: []].append(index) }
            if when.codeRanges?.isEmpty == false { ranged.append(index) }
        }
        let statusCount = statuses.count
        let maskWords = (statusCount + 63) / 64
        for (codeIndex, code) in codes.enumerated() {
            guard budget >= 0 else { return nil }
            let probe = code.probe
            var codeRules = byCodeText[probe] ?? []
            codeRules += ranged.filter { !codeRules.contains($0) && conditions[$0].codeMatches(probe) }
            guard !codeRules.isEmpty else { continue }  // the code changes no answer
            let own = truths.partition(codeRules, refining: whole)
            budget -= 16 * statuses.count * own.count + codeRules.count * (methods.count + paths.count + headers.count)
            guard budget >= 0 else { return nil }
            // The code rules' answer per status and class of their own partition.
            var codeIndexTable = [Int32](repeating: -1, count: statusCount * own.count)
            for (s, range) in statuses.enumerated() {
                for index in 0..<own.count {
                    let (m, p, h) = own.representative(index)
                    let answer = scope.classifier.matchCodeRules(
                        status: range.lowerBound, code: probe, headers: headers[h].probe, method: methods[m].probe,
                        path: paths[p].probe)
                    codeIndexTable[s * own.count + index] = Int32(answer ?? -1)
                }
            }
            // Joint classes (status class, own class), each with the records it makes; classes
            // that make the same records share a key (a code usually has a handful of keys).
            let keyWidth = 2 * kinds.count * maskWords
            let half = kinds.count * maskWords
            var records: [(atom: Atom, kind: ActionKind)] = []
            var recordIndex: [String: Int] = [:]
            /// The records a key (changed masks, then everywhere masks) makes.
            func recordsOf(_ key: [UInt64]) -> [Int] {
                var list: [Int] = []
                for (k, kind) in kinds.enumerated() {
                    let changed = key[(k * maskWords)..<((k + 1) * maskWords)]
                    guard changed.contains(where: { $0 != 0 }) else { continue }
                    let everywhere = key[(half + k * maskWords)..<(half + (k + 1) * maskWords)]
                    let indices = (0..<statusCount).filter {
                        key[k * maskWords + $0 >> 6] & (1 << UInt64($0 & 63)) != 0
                    }
                    let qualifier =
                        changed.elementsEqual(everywhere)
                        ? "" : " with " + runs(indices, prefix: "status").joined(separator: ", ")
                    let name = "\(k)|" + qualifier
                    if let existing = recordIndex[name] {
                        list.append(existing)
                    } else {
                        recordIndex[name] = records.count
                        list.append(records.count)
                        records.append((.code(codeIndex, qualifier), kind))
                    }
                }
                return list
            }
            /// Adds status `s`'s part of the key at status class `cls` (own class `ownClass`).
            func addBits(_ s: Int, _ cls: Int, _ ownClass: Int, into key: inout [UInt64], at offset: Int) {
                let without = statusIndex[s][cls]
                let fromCode = codeIndexTable[s * own.count + ownClass]
                let with: Int32 = without < 0 ? fromCode : (fromCode < 0 ? without : min(without, fromCode))
                let before = kindOf(without)
                let after = kindOf(with)
                let bit: UInt64 = 1 << UInt64(s & 63)
                for (k, kind) in kinds.enumerated() {
                    if after == kind, after != before { key[offset + k * maskWords + s >> 6] |= bit }
                    if before != kind { key[offset + half + k * maskWords + s >> 6] |= bit }
                }
            }
            // The code's own rules constrain one dimension at most (a method, or a path).
            let ownSizes = [own.methods.count, own.paths.count, own.headers.count]
            let ownDimension = ownSizes.firstIndex { $0 > 1 }
            if factored && ownSizes.filter({ $0 > 1 }).count <= 1 {
                // Per dimension and value (a method, a path, a header set): the bits of the
                // statuses that depend on that dimension, for each class of the code's own rules.
                // A context's key is the union of its three values' bits and the constant ones,
                // for the own class its value in the own rules' dimension picks.
                let ownCount = own.count
                let sizes = [methods.count, paths.count, headers.count]
                let statusClassOf = [byStatus.methods.of, byStatus.paths.of, byStatus.headers.of]
                let ownClassOf = [own.methods.of, own.paths.of, own.headers.of]
                var constant = [UInt64](repeating: 0, count: ownCount * keyWidth)
                for s in 0..<statusCount where dependence[s] == 0 {
                    for o in 0..<ownCount { addBits(s, 0, o, into: &constant, at: o * keyWidth) }
                }
                var partial: [[[UInt64]]] = [[], [], []]  // [dimension][id]: ownCount keys
                var idOf: [[Int]] = [[], [], []]  // [dimension][value]
                var ownOfId: [[Int]] = [[], [], []]
                for d in 0..<3 {
                    let bit = 1 << d
                    var index: [[UInt64]: Int] = [:]
                    for v in 0..<sizes[d] {
                        let cls = statusClassOf[d][v]
                        let statusClass = d == 0 ? cls * pN * hN : (d == 1 ? cls * hN : cls)
                        var bits = [UInt64](repeating: 0, count: ownCount * keyWidth + 1)
                        for s in 0..<statusCount where dependence[s] == bit {
                            for o in 0..<ownCount { addBits(s, statusClass, o, into: &bits, at: o * keyWidth) }
                        }
                        let ownClass = d == ownDimension ? ownClassOf[d][v] : 0
                        bits[ownCount * keyWidth] = UInt64(ownClass)
                        if let known = index[bits] {
                            idOf[d].append(known)
                        } else {
                            index[bits] = partial[d].count
                            idOf[d].append(partial[d].count)
                            partial[d].append(bits)
                            ownOfId[d].append(ownClass)
                        }
                    }
                }
                let (nM, nP, nH) = (partial[0].count, partial[1].count, partial[2].count)
                budget -= nM * nP * nH + count / 64
                if nM * nP * nH <= 65_536 {
                    var recordsOfCombination: [[Int]] = []
                    recordsOfCombination.reserveCapacity(nM * nP * nH)
                    var key = [UInt64](repeating: 0, count: keyWidth)
                    // Neighbouring combinations mostly make the same key: reuse its records.
                    var lastKey: [UInt64] = []
                    var lastRecords: [Int] = []
                    for a in 0..<nM {
                        for b in 0..<nP {
                            for c in 0..<nH {
                                let o = ownDimension.map { [ownOfId[0][a], ownOfId[1][b], ownOfId[2][c]][$0] } ?? 0
                                let base = o * keyWidth
                                for word in 0..<keyWidth {
                                    key[word] =
                                        constant[base + word] | partial[0][a][base + word] | partial[1][b][base + word]
                                        | partial[2][c][base + word]
                                }
                                if key != lastKey {
                                    lastKey = key
                                    lastRecords = recordsOf(key)
                                }
                                recordsOfCombination.append(lastRecords)
                            }
                        }
                    }
                    guard !records.isEmpty else { continue }
                    var sets = [ContextSet](repeating: ContextSet(count: count), count: records.count)
                    if recordsOfCombination.allSatisfy({ $0 == recordsOfCombination[0] }) {
                        for record in recordsOfCombination[0] { sets[record] = ContextSet(all: count) }
                    } else {
                        // Flat arrays: nested ones cost a retain and a release per context.
                        let (mIds, pIds, hIds) = (idOf[0], idOf[1], idOf[2])
                        var start = [0]
                        var flat: [Int] = []
                        for list in recordsOfCombination {
                            flat += list
                            start.append(flat.count)
                        }
                        // Contexts are numbered method, then path, then header set: the
                        // contexts of one method and path are a run, which takes one
                        // combination when the header sets make one id (a code's rules on
                        // paths): set as a range of bits, not context by context (that loop,
                        // 160,000 contexts for each of 900 codes, was most of a 1,000-rule diff).
                        let width = (count + 63) / 64
                        var words = [UInt64](repeating: 0, count: records.count * width)
                        let (pathCount, headerCount) = (paths.count, headers.count)
                        let sameHeaders = hIds.allSatisfy { $0 == hIds.first }
                        var masksOfBase: [Int: [(record: Int, mask: [UInt64])]] = [:]
                        let maskZero = [UInt64](repeating: 0, count: (headerCount + 63) / 64)
                        words.withUnsafeMutableBufferPointer { buffer in
                            for m in 0..<methods.count {
                                for p in 0..<pathCount {
                                    let run = (m * pathCount + p) * headerCount
                                    let base = (mIds[m] * nP + pIds[p]) * nH
                                    if sameHeaders {
                                        let combination = base + (hIds.first ?? 0)
                                        for position in start[combination]..<start[combination + 1] {
                                            ContextSet.setBits(
                                                buffer, offset: flat[position] * width, run..<(run + headerCount))
                                        }
                                        continue
                                    }
                                    // Otherwise each record's header sets in this run, as a
                                    // mask worked out once per combination base and laid over
                                    // every run that has the base.
                                    let masks: [(record: Int, mask: [UInt64])]
                                    if let known = masksOfBase[base] {
                                        masks = known
                                    } else {
                                        var byRecord: [Int: [UInt64]] = [:]
                                        for h in 0..<headerCount {
                                            let combination = base + hIds[h]
                                            for position in start[combination]..<start[combination + 1] {
                                                byRecord[flat[position], default: maskZero][h >> 6] |=
                                                    1 << UInt64(h & 63)
                                            }
                                        }
                                        masks = byRecord.map { ($0.key, $0.value) }
                                        masksOfBase[base] = masks
                                    }
                                    for (record, mask) in masks {
                                        ContextSet.orBits(buffer, offset: record * width, at: run, mask)
                                    }
                                }
                            }
                        }
                        sets = (0..<records.count).map {
                            ContextSet(words: Array(words[($0 * width)..<(($0 + 1) * width)]))
                        }
                    }
                    for (index, record) in records.enumerated() {
                        holds[record.atom, default: [:]][record.kind] = sets[index]
                    }
                    continue
                }
                records = []
                recordIndex = [:]
            }
            budget -= count + byStatus.count * own.count
            guard budget >= 0 else { return nil }
            var keyOfPair = [Int32](repeating: -1, count: byStatus.count * own.count)
            var keyStore: [UInt64] = []
            var keyIndex: [[UInt64]: Int] = [:]
            var recordsOfKey: [[Int]] = []  // indices into `records`
            var contextKey = [Int32](repeating: 0, count: count)
            var key = [UInt64](repeating: 0, count: keyWidth)  // changed masks, then everywhere masks
            for (context, cls) in classOfContext.enumerated() {
                let c = contexts[context]
                let ownClass = own.count == 1 ? 0 : own.of(method: c.method, path: c.path, header: c.headers)
                let pair = cls * own.count + ownClass
                if keyOfPair[pair] >= 0 {
                    contextKey[context] = keyOfPair[pair]
                    continue
                }
                // What each status answers here without the code and with it.
                budget -= statusCount
                for index in key.indices { key[index] = 0 }
                for s in 0..<statusCount { addBits(s, cls, ownClass, into: &key, at: 0) }
                var found = -1
                let known = recordsOfKey.count
                if known <= 16 {
                    for candidate in 0..<known
                    where keyStore[(candidate * keyWidth)..<((candidate + 1) * keyWidth)].elementsEqual(key) {
                        found = candidate
                        break
                    }
                } else {
                    found = keyIndex[key] ?? -1
                }
                if found < 0 {
                    found = known
                    keyStore += key
                    keyIndex[key] = found
                    let list = recordsOf(key)
                    recordsOfKey.append(list)
                }
                keyOfPair[pair] = Int32(found)
                contextKey[context] = Int32(found)
            }
            guard !records.isEmpty else { continue }
            var sets = [ContextSet](repeating: ContextSet(count: count), count: records.count)
            if recordsOfKey.count == 1 {
                for record in recordsOfKey[0] { sets[record] = ContextSet(all: count) }
            } else {
                // One flat buffer: inserting into an array of sets checked two buffers'
                // uniqueness per context.
                let width = (count + 63) / 64
                var words = [UInt64](repeating: 0, count: records.count * width)
                words.withUnsafeMutableBufferPointer { buffer in
                    for context in 0..<count {
                        for record in recordsOfKey[Int(contextKey[context])] {
                            buffer[record * width + context >> 6] |= 1 << UInt64(context & 63)
                        }
                    }
                }
                sets = (0..<records.count).map { ContextSet(words: Array(words[($0 * width)..<(($0 + 1) * width)])) }
            }
            for (index, record) in records.enumerated() { holds[record.atom, default: [:]][record.kind] = sets[index] }
        }

        // Error classes: the rules naming errors decide (methods and paths only).
        let errorRules = conditions.indices.filter { conditions[$0].errors != nil }
        let byError = truths.partition(errorRules, refining: whole)
        for (index, error) in TransportErrorClass.allCases.enumerated() {
            budget -= contexts.count + 16 * byError.count
            guard budget >= 0 else { return nil }
            var answers: [ActionKind?] = [ActionKind?](repeating: nil, count: byError.count)
            var sets: [ActionKind: ContextSet] = [:]
            for (context, c) in contexts.enumerated() {
                let cls = byError.of(method: c.method, path: c.path, header: c.headers)
                let kind: ActionKind
                if let known = answers[cls] {
                    kind = known
                } else {
                    let (m, p, _) = byError.representative(cls)
                    kind = action(scope.classifier.match(error: error, method: methods[m].probe, path: paths[p].probe))
                    answers[cls] = kind
                }
                if kind != .deliver { sets[kind, default: ContextSet(count: count)].insert(context) }
            }
            if !sets.isEmpty { holds[.error(index)] = sets }
        }
        return holds
    }
}
