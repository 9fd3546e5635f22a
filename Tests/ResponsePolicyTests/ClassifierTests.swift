import Foundation
import Testing

@testable import ResponsePolicy

/// The decision tables answer as a first-match scan of the rules would, for codes that are
/// canonical integers (found by value in an open-addressing table) and any other text (a
/// dictionary), in tables from one code to thousands.
@Suite struct ClassifierTests {
    /// Rules over `codeCount` codes, some shadowing others, some narrowed by status.
    static func policy(codes codeCount: Int) -> String {
        var text = "policy: 1\nname: codes\nclassify: { code: body.status }\nrules:\n"
        for index in 0..<codeCount {
            let code = 1000 + index
            switch index % 3 {
            case 0: text += "  - { name: r\(index), when: { code: [\(code), \(code + 1)] }, then: fail }\n"
            case 1: text += "  - { name: r\(index), when: { code: [\(code)], status: [200] }, then: deliver }\n"
            default: text += "  - { name: r\(index), when: { code: [\"E\(code)\", \(code)] }, then: fail }\n"
            }
        }
        // Text that only looks like a number, and negative numbers.
        text += "  - { name: t1, when: { code: [\"01000\", \"+1001\", \"1002.0\", \"-0\", \"1e3\"] }, then: fail }\n"
        text += "  - { name: t2, when: { code: [-1000, 0, \"-1003\"] }, then: deliver }\n"
        // A range expanded into the table, over codes earlier rules already name, and one too wide to.
        text += "  - { name: t3, when: { code: [\"1003-1020\", 5000, \"E1004\"] }, then: fail }\n"
        text += "  - { name: t4, when: { code: [\"990-9999\"] }, then: fail }\n"
        // A code whose first rule is narrowed by status: the later rule on it answers other statuses.
        text += "  - { name: t5, when: { code: [20000], status: [200] }, then: deliver }\n"
        text += "  - { name: t6, when: { code: [20000, \"20001-20003\"] }, then: fail }\n"
        text += "  - { name: s500, when: { status: [500] }, then: fail }\n"
        return text
    }

    /// The reference answer: the first rule by ``Condition/matches(status:code:headers:method:path:)``.
    static func firstMatch(_ rules: [Rule], status: Int, code: String?) -> Int? {
        rules.firstIndex {
            $0.when.matches(status: status, code: code, headers: HTTPHeaders(), method: "GET", path: "/")
        }
    }

    @Test(arguments: [1, 3, 8, 12, 40, 3_000])
    func tablesAgreeWithAFirstMatchScan(codeCount: Int) throws {
        let policy = try Policy.load(yaml: Self.policy(codes: codeCount))
        let scope = policy.graph.scopes[policy.graph.scopes.count - 1]
        var probes: [String?] = [nil, "0", "", "E", "1000 ", "E999", "-", "-0", "00", "01000", "+1001", "1002.0"]
        probes += ["1e3", "-1000", "-1003", "-01003", "999999999999999999", "9999999999999999999", "１０００"]
        probes += ["995", "1015", "5000", "9999", "10000", "20000", "20002"]
        for index in -1...min(codeCount + 1, 60) { probes += ["\(1000 + index)", "E\(1000 + index)"] }
        for index in stride(from: 60, through: codeCount + 1, by: 97) {
            probes += ["\(1000 + index)", "E\(1000 + index)"]
        }
        for status in [200, 201, 404, 500] {
            for code in probes {
                let answer = scope.classifier.match(
                    status: status, code: code, headers: HTTPHeaders(), method: "GET", path: "/x")
                #expect(
                    answer == Self.firstMatch(scope.rules, status: status, code: code),
                    "status \(status) code \(code ?? "none")")
            }
        }
    }

    @Test func canonicalIntegersAreExactlyTheTextsAnIntegerPrintsAs() {
        for text in ["0", "7", "1401", "-5", "-1401", "999999999999999999", "-999999999999999999"] {
            #expect(CodeTable.canonicalInteger(text).map { String($0) } == text, "\(text)")
        }
        for text in ["", "-", "-0", "00", "01", "+1", "1.0", "1e3", " 1", "1 ", "0x10", "１", "1000000000000000000"] {
            #expect(CodeTable.canonicalInteger(text) == nil, "\(text)")
        }
    }

    /// A table sized for fewer codes than it is given grows instead of filling up (a full
    /// open-addressing table would make a probe loop forever), and finds every code after.
    @Test func aTableGivenMoreCodesThanItExpectedGrowsAndFindsThemAll() {
        var table = CodeTable(expecting: 1)
        for code in 0..<1_000 {
            table.append(Int32(code), to: String(code * 7 - 300))
            table.append(Int32(code + 1), to: String(code * 7 - 300))
        }
        for code in 0..<1_000 {
            #expect(table[String(code * 7 - 300)] == [Int32(code), Int32(code + 1)], "code \(code * 7 - 300)")
        }
        #expect(table["5"] == nil)
        #expect(table["-301"] == nil)
    }
}
