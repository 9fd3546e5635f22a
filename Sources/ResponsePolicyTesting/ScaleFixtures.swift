/// Generated policies at the sizes the tools promise to handle, shared by the tests and
/// `policy-bench` (issue 32 item 8): many routes, many rules, and a "mixed" pair for `diff` whose
/// rules name random statuses, codes, paths, header sets and methods together.
package enum ScaleFixtures {
    /// A splitmix64 generator: the same seed gives the same file on every machine.
    package struct Random {
        private var state: UInt64
        package init(seed: UInt64) { state = seed }

        package mutating func next() -> UInt64 {
            state &+= 0x9E37_79B9_7F4A_7C15
            var z = state
            z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
            z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
            return z ^ (z >> 31)
        }

        package mutating func int(_ range: ClosedRange<Int>) -> Int {
            range.lowerBound + Int(next() % UInt64(range.count))
        }

        package mutating func chance(_ percent: Int) -> Bool { int(0...99) < percent }
    }

    /// `count` routes over four top-level rules: a quarter each with a retry override, `rules: []`
    /// for a method, a rule of their own, and a logout override.
    package static func manyRoutes(_ count: Int) -> String {
        var text = """
            policy: 1
            name: routes
            classify: { code: body.status }
            rules:
              - { name: expired, when: { code: [1401] }, then: refresh }
              - { name: revoked, when: { code: [202] }, then: logout }
              - { name: unauthorized, when: { status: [401] }, then: refresh }
              - { name: transient, when: { status: [502, 503, 504], error: [timeout, connection] }, then: retry }
            refresh: { use: oauth2, with: { token-url: "https://auth.example.com/t", client-id: m } }
            routes:

            """
        text.reserveCapacity(count * 80)
        for i in 0..<count {
            switch i % 4 {
            case 0: text += "  - { match: { path: '/svc-\(i)/*' }, retry: { max-retries: \(i % 5) } }\n"
            case 1: text += "  - { match: { path: '/svc-\(i)/*', method: [POST] }, rules: [] }\n"
            case 2:
                text += "  - match: { path: '/svc-\(i)/**' }\n    rules:\n"
                text += "      - { name: r\(i), when: { code: [\(i)] }, then: retry }\n"
            default: text += "  - { match: { path: '/api/v\(i)/*' }, logout: { cooldown: \(i % 60 + 1)s } }\n"
            }
        }
        return text
    }

    /// `count` rules, each naming at random a pair of codes, a status and a status range, a path
    /// glob, one to three header globs, methods and errors; `variant` changes about 30% of the
    /// actions (with its own generator, so the two files keep the same conditions).
    package static func mixedPair(_ count: Int, seed: UInt64) -> (old: String, new: String) {
        (mixed(count, seed: seed, variant: false), mixed(count, seed: seed, variant: true))
    }

    static func mixed(_ count: Int, seed: UInt64, variant: Bool) -> String {
        var random = Random(seed: seed)
        var changes = Random(seed: 99)
        let actions = ["refresh", "logout", "retry", "fail", "deliver"]
        let methods = ["GET", "POST", "PUT", "DELETE", "PATCH"]
        var text = "policy: 1\nname: mixed\nclassify: { code: body.status }\nrules:\n"
        for i in 0..<count {
            var when: [String] = []
            if random.chance(50) { when.append("code: [\(10_000 + 3 * i), \(10_001 + 3 * i)]") }
            if random.chance(50) {
                when.append(
                    "status: [\(random.int(400...599)), '\(random.int(500...520))-\(random.int(521...599))']")
            }
            if random.chance(50) { when.append("path: '/p\(random.int(0...count))/*/x\(random.int(0...count))*'") }
            if random.chance(40) {
                var names = Array(0..<30)
                var headers: [String] = []
                for _ in 0..<random.int(1...3) {
                    let name = names.remove(at: random.int(0...(names.count - 1)))
                    headers.append("X-H\(name): 'v\(random.int(0...count))*'")
                }
                when.append("header: { " + headers.joined(separator: ", ") + " }")
            }
            if random.chance(30) {
                var pool = methods
                var chosen: [String] = []
                for _ in 0..<random.int(1...3) { chosen.append(pool.remove(at: random.int(0...(pool.count - 1)))) }
                when.append("method: [" + chosen.joined(separator: ", ") + "]")
            }
            if random.chance(20) { when.append("error: [timeout, connection]") }
            if when.isEmpty { when.append("code: [\(10_002 + 3 * i)]") }
            var action = actions[random.int(0...4)]
            if variant, changes.chance(30) { action = actions[changes.int(0...4)] }
            text += "  - { name: r\(i), when: { " + when.joined(separator: ", ") + " }, then: \(action) }\n"
        }
        text += "refresh: { use: oauth2, with: { token-url: 'https://auth.example.com/t', client-id: m } }\n"
        return text
    }
}
