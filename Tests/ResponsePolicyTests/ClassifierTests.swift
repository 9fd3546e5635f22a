import Foundation
import Testing

@testable import ResponsePolicy

/// The decision tables answer as a first-match scan of the rules would, with few codes (a list
/// compared in turn) and with many (a dictionary): the classifier switches representation at
/// `Classifier.fewCodesLimit` codes.
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
        text += "  - { name: s500, when: { status: [500] }, then: fail }\n"
        return text
    }

    static func firstMatch(_ rules: [Rule], status: Int, code: String?) -> Int? {
        rules.firstIndex { rule in
            let when = rule.when
            if let codes = when.codes {
                guard let code, codes.contains(code) else { return false }
            }
            if let statuses = when.statuses, !statuses.contains(where: { $0.contains(status) }) { return false }
            return true
        }
    }

    @Test(arguments: [1, 3, Classifier.fewCodesLimit - 1, Classifier.fewCodesLimit, 12, 40])
    func tablesAgreeWithAFirstMatchScan(codeCount: Int) throws {
        let policy = try Policy.load(yaml: Self.policy(codes: codeCount))
        let scope = policy.graph.scopes[policy.graph.scopes.count - 1]
        var probes: [String?] = [nil, "0", "", "E", "1000 ", "E999"]
        for index in -1...(codeCount + 1) { probes += ["\(1000 + index)", "E\(1000 + index)"] }
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
}
