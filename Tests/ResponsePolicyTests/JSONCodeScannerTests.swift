import Foundation
import TestSupport
import Testing

@testable import ResponsePolicy
@testable import policy_fuzz

struct JSONCodeScannerTests {
    // MARK: - Helpers

    /// Runs the scanner over an exact-size heap copy of `bytes` (no slack capacity, so an over-read is a real bug).
    private static func scan(_ bytes: [UInt8], _ path: JSONPath, maxBytes: Int = 65_536) -> String? {
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: max(bytes.count, 1), alignment: 1)
        defer { buffer.deallocate() }
        buffer.copyBytes(from: bytes)
        let body = UnsafeRawBufferPointer(rebasing: UnsafeRawBufferPointer(buffer)[0..<bytes.count])
        let text = JSONCodeScanner.code(in: body, at: path, maxBytes: maxBytes)
        let raw = JSONCodeScanner.withCode(in: body, at: path, maxBytes: maxBytes) { $0.map { Array($0) } }
        #expect(text.map { Array($0.utf8) } == raw.map { Array(String(decoding: $0, as: UTF8.self).utf8) })
        return text
    }

    private static func scan(_ json: String, _ path: String, maxBytes: Int = 65_536) -> String? {
        guard let parsed = JSONPath(path) else {
            Issue.record("invalid path \(path)")
            return nil
        }
        return scan(Array(json.utf8), parsed, maxBytes: maxBytes)
    }

    // MARK: - JSONPath

    @Test func pathParsing() throws {
        #expect(JSONPath("status")?.segments == [.key(Array("status".utf8))])
        #expect(
            JSONPath("errors.0.code")?.segments == [.key(Array("errors".utf8)), .index(0), .key(Array("code".utf8))])
        #expect(JSONPath("a.12")?.segments == [.key([UInt8(ascii: "a")]), .index(12)])
        #expect(JSONPath("007")?.segments == [.key(Array("007".utf8))])
        #expect(JSONPath("99999999999999999999999")?.segments == [.key(Array("99999999999999999999999".utf8))])
        #expect(JSONPath("ключ")?.segments == [.key(Array("ключ".utf8))])
        for invalid in ["", ".", "a.", ".a", "a..b"] {
            #expect(JSONPath(invalid) == nil, "\(invalid)")
        }
        #expect(JSONPath("a.b") == JSONPath("a.b"))
        #expect(JSONPath("a.b") != JSONPath("a.c"))
        #expect(Set([JSONPath("a.0"), JSONPath("a.0"), JSONPath("a.1")]).count == 2)
    }

    // MARK: - Finding values

    @Test func keyFirstAndKeyLast() {
        #expect(Self.scan(#"{"status":1401,"msg":"x"}"#, "status") == "1401")
        let json = #"""
            {"data":{"a":[1,{"b":"}]\"{[","status":0}],"s":"\\\"","n":{"status":9}},
             "msg":"a\"b\\ \u0022 }","list":[[],{},[{}],"]"],"status":"E42"}
            """#
        #expect(Self.scan(json, "status") == "E42")
        #expect(Self.scan(json, "data.n.status") == "9")
        #expect(Self.scan(json, "data.a.1.status") == "0")
        #expect(Self.scan(json, "list.3") == "]")
    }

    @Test func arraysByIndex() {
        let json = #"{"errors":[{"code":"A"},{"code":"B"},{"x":1}],"n":[10, 20 ,30]}"#
        #expect(Self.scan(json, "errors.0.code") == "A")
        #expect(Self.scan(json, "errors.1.code") == "B")
        #expect(Self.scan(json, "errors.2.code") == nil)
        #expect(Self.scan(json, "errors.3.code") == nil)
        #expect(Self.scan(json, "n.0") == "10")
        #expect(Self.scan(json, "n.2") == "30")
        #expect(Self.scan(json, "n.3") == nil)
        #expect(Self.scan(#"{"e":[]}"#, "e.0") == nil)
        #expect(Self.scan(#"[{"code":5}]"#, "0.code") == "5")
        #expect(Self.scan(#"[1,[2,[3,"deep"]]]"#, "1.1.1") == "deep")
    }

    @Test func numbersInEveryForm() {
        for literal in [
            "0", "-0", "12", "-3.25", "1e10", "1E-5", "2.5e+3", "-0.0e-0", "1401", "123456789012345678901234",
        ] {
            #expect(Self.scan(#"{"c":\#(literal)}"#, "c") == literal)
            #expect(Self.scan(#"{"c": \#(literal) ,"d":1}"#, "c") == literal)
            #expect(Self.scan(#"[\#(literal)]"#, "0") == literal)
        }
        for invalid in [
            "01", "-", "1.", ".5", "1e", "1e+", "+1", "--1", "0x10", "1.e3", "-a", "1ee2", "NaN", "Infinity",
        ] {
            #expect(Self.scan(#"{"c":\#(invalid)}"#, "c") == nil, "\(invalid)")
            #expect(Self.scan(#"{"c":\#(invalid),"d":1}"#, "d") == nil, "sibling \(invalid)")
        }
    }

    @Test func stringsWithEveryEscape() {
        let json = #"{"s":"q\"b\\s\/b\bf\fn\nr\rt\tu\u00e9\u20AC\u20ac\ud83d\ude00\u0000end"}"#
        #expect(Self.scan(json, "s") == "q\"b\\s/b\u{8}f\u{C}n\nr\rt\tué€€😀\u{0}end")
        #expect(Self.scan(#"{"s":""}"#, "s") == "")
        #expect(Self.scan(#"{"s":"1401"}"#, "s") == "1401")
        #expect(Self.scan(#"{"s":"null"}"#, "s") == "null")
        #expect(Self.scan(#"{"s":"raw ünïcødé 😀"}"#, "s") == "raw ünïcødé 😀")
        // Malformed escapes, lone surrogates and raw control characters in the value.
        for bad in [
            #"\x"#, #"\u12"#, #"\u12G4"#, #"\ud83d"#, #"\ude00"#, #"\ud83dx"#, #"\ud83d\u0041"#, "a\nb", "\u{1}",
        ] {
            #expect(Self.scan(#"{"s":"\#(bad)"}"#, "s") == nil, "\(bad)")
        }
    }

    @Test func keysWithUnicodeAndEscapes() {
        #expect(Self.scan(#"{"ключ":"v","😀":1}"#, "ключ") == "v")
        #expect(Self.scan(#"{"ключ":"v","😀":1}"#, "😀") == "1")
        #expect(Self.scan(#"{"st\u0061tus":7}"#, "status") == "7")
        #expect(Self.scan(#"{"\u043a\u043b\u044e\u0447":"v"}"#, "ключ") == "v")
        #expect(Self.scan(#"{"\ud83d\ude00":2}"#, "😀") == "2")
        #expect(Self.scan(#"{"st\\u0061tus":7}"#, "status") == nil)
        #expect(Self.scan(#"{"st\\u0061tus":7}"#, #"st\u0061tus"#) == "7")
        #expect(Self.scan(#"{"a\"b":1}"#, "a\"b") == "1")
        #expect(Self.scan(#"{"stat":1,"statuses":2,"status":3}"#, "status") == "3")
        #expect(Self.scan(#"{"a\ud83d":1,"a":2}"#, "a") == "2")
        let dotted = JSONPath(segments: [.key(Array("a.b".utf8))])
        #expect(dotted.flatMap { Self.scan(Array(#"{"a":{"b":1},"a.b":2}"#.utf8), $0) } == "2")
    }

    @Test func digitSegmentsOnObjectsAndArrays() {
        #expect(Self.scan(#"{"0":"zero","1":"one"}"#, "1") == "one")
        #expect(Self.scan(#"{"007":"x"}"#, "007") == "x")
        #expect(Self.scan(#"["a","b","c","d","e","f","g","h"]"#, "007") == nil)
        #expect(Self.scan(#"["a","b"]"#, "1") == "b")
        #expect(Self.scan(#"["a","b"]"#, "a") == nil)
        #expect(Self.scan(#"{"errors":{"0":{"code":"K"}}}"#, "errors.0.code") == "K")
    }

    /// Issue 32: the first of duplicate keys won (`{"status":1401,"status":0}` refreshed);
    /// JavaScript's `JSON.parse` and Python's `json` keep the last, at every level.
    @Test func duplicateKeysLastWinsAsInJavaScriptAndPython() {
        #expect(Self.scan(#"{"status":1401,"status":0}"#, "status") == "0")
        #expect(Self.scan(#"{"s\u0074atus":1,"status":2}"#, "status") == "2")
        #expect(Self.scan(#"{"status":1,"status":null}"#, "status") == nil)
        #expect(Self.scan(#"{"status":1,"status":{"x":2}}"#, "status") == nil)
        #expect(Self.scan(#"{"a":{"s":1},"a":{"x":2}}"#, "a.s") == nil)
        #expect(Self.scan(#"{"a":{"s":1},"a":5}"#, "a.s") == nil)
        #expect(Self.scan(#"{"a":{"s":1},"b":{"s":3}}"#, "a.s") == "1")
        #expect(Self.scan(#"{"a":{"s":1,"s":2},"a":{"t":0,"s":3,"u":0}}"#, "a.s") == "3")
        #expect(Self.scan(#"{"e":[{"c":1}],"e":[{"c":2},{"c":3}]}"#, "e.0.c") == "2")
        #expect(Self.scan(#"{"e":[{"c":1}],"e":[]}"#, "e.0.c") == nil)
    }

    /// Issue 32: a code was read from bodies no JSON parser accepts.
    @Test(arguments: [
        #"{"status":1401} trailing"#, #"{"status":1401}}"#, #"{"status":1401}{"#, #"{"status":1401}, "x""#,
        #"{"status":1401"#, #"{"status":1401,"#, #"{"status":1401,"m":"unterminated}"#, #"{"status":1401,"x":[1,2}"#,
        #"{"status":1401,"x":01}"#, #"{"status":1401,"x":1.}"#, #"{"status":1401,"x":tru}"#,
        #"{"status":1401,"x":"\q"}"#,
        #"{"status":1401,"x":"\u12"}"#, "{\"status\":1401,\"x\":\"a\tb\"}", #"{"status":1401,,}"#,
        #"{"status":1401,"x":[1,]}"#, #"{"status":1401,"x" 1}"#, #"{'status':1401}"#,
    ])
    func aBodyThatIsNotValidJSONHasNoCode(_ body: String) {
        #expect(Self.scan(body, "status") == nil, "\(body)")
    }

    @Test(
        arguments: [
            [0xFF], [0xC0, 0x80], [0xE0, 0x80, 0x80], [0xED, 0xA0, 0x80], [0xF4, 0x90, 0x80, 0x80], [0xC3], [0x80],
            [0xF8, 0x88, 0x80, 0x80, 0x80],
        ] as [[UInt8]])
    func invalidUTF8AnywhereMeansNoCode(_ bad: [UInt8]) throws {
        let path = try #require(JSONPath("status"))
        for body in [
            Array(#"{"status":1401,"m":""#.utf8) + bad + Array(#""}"#.utf8),
            Array(#"{"m":""#.utf8) + bad + Array(#"","status":1401}"#.utf8),
            Array(#"{"status":"1401"#.utf8) + bad + Array(#""}"#.utf8),
        ] {
            #expect(Self.scan(body, path) == nil, "\(body)")
        }
        // Valid UTF-8 of every length is fine.
        #expect(Self.scan(#"{"m":"é€😀","status":1401}"#, "status") == "1401")
    }

    @Test func nonScalarsAndMissing() {
        let json = #"{"n":null,"o":{"a":1},"a":[1],"t":true,"f":false,"e":{}}"#
        #expect(Self.scan(json, "n") == nil)
        #expect(Self.scan(json, "o") == nil)
        #expect(Self.scan(json, "a") == nil)
        #expect(Self.scan(json, "e") == nil)
        #expect(Self.scan(json, "t") == "true")
        #expect(Self.scan(json, "f") == "false")
        #expect(Self.scan(json, "missing") == nil)
        #expect(Self.scan(json, "o.b") == nil)
        #expect(Self.scan(json, "t.x") == nil)
        #expect(Self.scan(json, "n.0") == nil)
        #expect(Self.scan(#"123"#, "a") == nil)
        #expect(Self.scan(#""status""#, "status") == nil)
        #expect(Self.scan(#"{}"#, "a") == nil)
        #expect(Self.scan(#"{"a":tru}"#, "a") == nil)
        #expect(Self.scan(#"{"a":nul,"b":1}"#, "b") == nil)
    }

    @Test func whitespaceAndBOM() throws {
        let json = "\u{FEFF} \r\n\t{ \n\"a\" \t:\r\n [ 1 ,\n { \"code\" : \"X\" } ] , \"b\" : -1 \n}\n"
        #expect(Self.scan(json, "a.1.code") == "X")
        #expect(Self.scan(json, "b") == "-1")
        #expect(Self.scan(json, "a.0") == "1")
        #expect(Self.scan(Array([0xEF, 0xBB]) + Array(#"{"a":1}"#.utf8), try #require(JSONPath("a"))) == nil)
        #expect(Self.scan("\u{FEFF}\u{FEFF}{\"a\":1}", "a") == nil)
        #expect(Self.scan("\u{B}{\"a\":1}", "a") == nil)
    }

    @Test func truncationAndMaxBytes() throws {
        let json = #"{"x":"abc","status":1401}"#
        let bytes = Array(json.utf8)
        let path = try #require(JSONPath("status"))
        // A cut body is not valid JSON; a body longer than maxBytes is not read.
        for cut in 0...bytes.count {
            let expected: String? = cut == bytes.count ? "1401" : nil
            #expect(Self.scan(Array(bytes[0..<cut]), path) == expected, "truncated to \(cut)")
            #expect(Self.scan(bytes, path, maxBytes: cut) == expected, "maxBytes \(cut)")
        }
        #expect(Self.scan(bytes, path, maxBytes: -1) == nil)
        #expect(Self.scan(bytes, path, maxBytes: .max) == "1401")
        #expect(Self.scan(#"{"s":"abc"#, "s") == nil)
        #expect(Self.scan(#"{"s":"abc\"#, "s") == nil)
        #expect(Self.scan(#"{"s":"abc\u00"#, "s") == nil)
        #expect(Self.scan(#"{"a":[1,2"#, "a.1") == nil)
        #expect(Self.scan(#"{"a":{"b":[1,{"c":"]}"#, "z") == nil)
        #expect(Self.scan(String(repeating: " ", count: 200) + #"{"a":1}"#, "a", maxBytes: 100) == nil)
    }

    @Test func garbageAndEmpty() throws {
        #expect(Self.scan([], try #require(JSONPath("a"))) == nil)
        #expect(
            JSONCodeScanner.code(in: UnsafeRawBufferPointer(start: nil, count: 0), at: try #require(JSONPath("a")))
                == nil)
        let garbage = [
            "not json", "{status:1}", #"{"status" 1}"#, #"{"status":1 "x":2}"#, #"{'status':1}"#, "{\"status\":1\u{0}}",
            #"{"status":1x}"#, #"{"status":true1}"#, #"{"status":"x" "b"}"#, #"{"status":"x"]"#, #"[1}"#, "]", "}",
            "\"",
            #"{"a":1,,"status":2}"#, #"{"a":1 "status":2}"#, #"{"a":01,"status":2}"#, #"{"a" "status":2}"#,
            #"{"a":"x":"status":2}"#, #"{,"status":2}"#, #"["status"]"#, #"{"status"}"#, #"{"status":}"#,
        ]
        for text in garbage {
            #expect(Self.scan(text, "status") == nil, "\(text)")
        }
        // The whole document is read: what follows the value counts.
        #expect(Self.scan(#"{"status":1,}"#, "status") == nil)
        #expect(Self.scan(#"{"status":1,,,garbage"#, "status") == nil)
        var rng = SeededGenerator(seed: 7)
        for _ in 0..<200 {
            let bytes = (0..<rng.int(0...64)).map { _ in UInt8(truncatingIfNeeded: rng.next()) }
            _ = Self.scan(bytes, try #require(JSONPath("a.0.b")))
        }
    }

    @Test func malformedSiblingsHideTheCode() {
        // Before issue 32 a container that was skipped was only checked for balance; now every byte counts.
        #expect(Self.scan(#"{"a":[1,],"status":1}"#, "status") == nil)
        #expect(Self.scan(#"{"a":{"x" 1 2},"status":1}"#, "status") == nil)
        #expect(Self.scan(#"{"a":[1,{"b":2],"status":1}"#, "status") == nil)
        #expect(Self.scan(#"{"a":["x],"status":1}"#, "status") == nil)
        #expect(Self.scan(#"{"a":["\"],"status":1}"#, "status") == nil)
        #expect(Self.scan(#"{"a":[1,{"b":[]}],"status":1}"#, "status") == "1")
    }

    @Test func deepNestingIsReadWithoutRecursionUpToItsBound() {
        func nested(_ depth: Int) -> String {
            let deep = String(repeating: "[", count: depth) + String(repeating: "]", count: depth)
            return #"{"a":\#(deep),"status":1}"#
        }
        // The object is level 1: 511 arrays inside it make 512 levels, the most a code is read under.
        #expect(Self.scan(nested(JSONCodeScanner.maxDepth - 1), "status") == "1")
        #expect(Self.scan(nested(JSONCodeScanner.maxDepth), "status") == nil)
        #expect(Self.scan(nested(200_000), "status", maxBytes: .max) == nil)
        #expect(Self.scan(#"{"a":"# + String(repeating: "{\"k\":[", count: 50_000), "status", maxBytes: .max) == nil)
    }

    @Test func withCodePassesSlicesAndUnescapes() throws {
        func check(_ json: String, _ path: String, expected: [UInt8]?, insideBody: Bool) throws {
            let parsed = try #require(JSONPath(path))
            let bytes = Array(json.utf8)
            bytes.withUnsafeBytes { body in
                JSONCodeScanner.withCode(in: body, at: parsed) { value in
                    #expect(value.map(Array.init) == expected, "\(json)")
                    if let value, let start = value.baseAddress, let base = body.baseAddress {
                        let inside = start >= base && start + value.count <= base + body.count
                        #expect(inside == insideBody, "\(json)")
                    }
                }
            }
        }
        try check(#"{"c":"E42"}"#, "c", expected: Array("E42".utf8), insideBody: true)
        try check(#"{"c":-1.5e3}"#, "c", expected: Array("-1.5e3".utf8), insideBody: true)
        try check(#"{"c":false}"#, "c", expected: Array("false".utf8), insideBody: true)
        try check(#"{"c":""}"#, "c", expected: [], insideBody: true)
        try check(#"{"c":"E\u0034\"2"}"#, "c", expected: Array("E4\"2".utf8), insideBody: false)
        let long = String(repeating: #"ab\n"#, count: 40)
        try check(
            #"{"c":"\#(long)"}"#, "c", expected: Array(String(repeating: "ab\n", count: 40).utf8), insideBody: false)
        try check(#"{"c":"\#(long)\x"}"#, "c", expected: nil, insideBody: false)
        try check(#"{"c":null}"#, "c", expected: nil, insideBody: false)
    }

    // MARK: - Property test against JSONSerialization

    @Test func randomDocumentsAgreeWithJSONSerialization() throws {
        var rng = SeededGenerator(seed: 0x5EED_C0DE)
        var checkedPaths = 0
        var foundValues = 0
        for _ in 0..<2_500 {
            let root = Node.random(&rng, depth: 0, forceContainer: true)
            var text = ""
            root.serialize(into: &text, &rng)
            let bytes = Array(text.utf8)
            let parsed = try JSONSerialization.jsonObject(with: Data(bytes), options: [.fragmentsAllowed])
            for _ in 0..<4 {
                let segments = Self.randomPath(in: root, &rng)
                guard let path = JSONPath(segments: segments) else { continue }
                // Foundation's choice among duplicate keys is its own: compared only without them.
                let expected = root.hasDuplicateKeys ? nil : Self.expectedFromFoundation(parsed, segments)
                let model = root.value(at: segments)
                let result = Self.scan(bytes, path)
                checkedPaths += 1
                if result != nil { foundValues += 1 }
                if !root.hasDuplicateKeys { Self.compare(result, expected, model, context: text) }
                if case .number(let literal)? = model { #expect(result == literal, "\(text)") }
                // The text form of the path, when it can express the segments, must behave the same.
                if let textPath = Self.textPath(segments) {
                    #expect(JSONPath(textPath).map { Self.scan(bytes, $0) } == result, "\(textPath) in \(text)")
                }
                // A limit below the body's length reads nothing.
                let cut = rng.int(0...bytes.count)
                let cutResult = Self.scan(bytes, path, maxBytes: cut)
                #expect(cutResult == (cut == bytes.count ? result : nil), "cut \(cut) of \(text)")
                #expect(result == ReferenceJSON.code(in: bytes, at: path), "reference, \(text)")
            }
        }
        // Guard against a generator that accidentally only produces misses.
        #expect(checkedPaths >= 8_000)
        #expect(foundValues >= checkedPaths / 4)
    }

    @Test func mutatedDocumentsNeverCrash() {
        var rng = SeededGenerator(seed: 0xBAD_F00D)
        let specials: [UInt8] = Array(#"{}[]",:\ u0e-.9"#.utf8) + [0x00, 0x1F, 0xFF, 0xEF, 0xBB]
        for _ in 0..<1_500 {
            let root = Node.random(&rng, depth: 0, forceContainer: true)
            var text = ""
            root.serialize(into: &text, &rng)
            var bytes = Array(text.utf8)
            for _ in 0..<rng.int(1...4) where !bytes.isEmpty {
                let at = rng.int(0...(bytes.count - 1))
                let byte =
                    rng.oneIn(2) ? specials[rng.int(0...(specials.count - 1))] : UInt8(truncatingIfNeeded: rng.next())
                switch rng.int(0...3) {
                case 0: bytes[at] = byte
                case 1: bytes.remove(at: at)
                case 2: bytes.insert(byte, at: at)
                default: bytes.removeSubrange(at...)
                }
            }
            for _ in 0..<3 {
                guard let path = JSONPath(segments: Self.randomPath(in: root, &rng)) else { continue }
                let maxBytes = rng.oneIn(3) ? rng.int(0...(bytes.count + 1)) : 65_536
                let result = Self.scan(bytes, path, maxBytes: maxBytes)
                // The plain recursive parser agrees on every mutated body: the code of a valid one, nil otherwise.
                let expected = bytes.count <= maxBytes ? ReferenceJSON.code(in: bytes, at: path) : nil
                #expect(result == expected, "\(String(decoding: bytes, as: UTF8.self).debugDescription)")
            }
        }
    }

    // MARK: - Property test support

    private enum Expected: Equatable {
        case string([UInt8]), number(Double), bool(Bool)
    }

    /// Walks a `JSONSerialization` result with the scanner's path semantics.
    private static func expectedFromFoundation(_ root: Any, _ segments: [JSONPath.Segment]) -> Expected? {
        var current: Any = root
        for segment in segments {
            if let object = current as? [String: Any] {
                let key: String
                switch segment {
                case .key(let bytes): key = String(decoding: bytes, as: UTF8.self)
                case .index(let index): key = String(index)
                }
                guard let next = object[key] else { return nil }
                current = next
            } else if let array = current as? [Any], case .index(let index) = segment {
                guard array.indices.contains(index) else { return nil }
                current = array[index]
            } else {
                return nil
            }
        }
        if let string = current as? String {
            return .string(Array(string.utf8))
        }
        guard !(current is NSNull), !(current is [Any]), !(current is [String: Any]) else { return nil }
        guard let number = current as? NSNumber else {
            Issue.record("unexpected Foundation value \(String(describing: current))")
            return nil
        }
        // JSONSerialization returns booleans as NSNumber with ObjC type "c".
        if String(cString: number.objCType) == "c" { return .bool(number.boolValue) }
        return .number(number.doubleValue)
    }

    private static func compare(_ result: String?, _ expected: Expected?, _ model: Node?, context: String) {
        switch expected {
        case nil:
            #expect(result == nil, "\(context)")
        case .string(let utf8):
            #expect(result.map { Array($0.utf8) } == utf8, "\(context)")
        case .bool(let value):
            #expect(result == (value ? "true" : "false"), "\(context)")
        case .number(let value):
            // Foundation's number parsing is not always correctly rounded (e.g. 73774955.10226E+14 is off by one ulp),
            // so allow a relative error of a few ulps; the exact literal is checked against the model below.
            let scanned = result.flatMap(Double.init) ?? .nan
            #expect(abs(scanned - value) <= Swift.max(abs(scanned), abs(value)) * 1e-14, "\(context)")
        }
        // The model also knows the exact literal text of numbers.
        if case .number(let literal)? = model {
            #expect(result == literal, "\(context)")
        }
    }

    /// A path that exists in `root` most of the time, and a near miss otherwise.
    private static func randomPath(in root: Node, _ rng: inout SeededGenerator) -> [JSONPath.Segment] {
        var segments: [JSONPath.Segment] = []
        var node = root
        while true {
            let stop = !segments.isEmpty && rng.oneIn(4)
            switch node {
            case .object(let members) where !members.isEmpty && !stop:
                let (key, child) = members[rng.int(0...(members.count - 1))]
                if let index = Int(key), String(index) == key, rng.oneIn(2) {
                    segments.append(.index(index))
                } else {
                    segments.append(.key(Array(key.utf8)))
                }
                node = child
                continue
            case .array(let elements) where !elements.isEmpty && !stop:
                let index = rng.int(0...(elements.count - 1))
                segments.append(.index(index))
                node = elements[index]
                continue
            default:
                break
            }
            break
        }
        guard rng.oneIn(4) else { return segments }
        // Near misses: unknown key, index out of range, wrong kind of segment, step past a scalar.
        switch rng.int(0...3) {
        case 0: segments.append(.key(Array("zz_missing".utf8)))
        case 1: segments.append(.index(rng.int(0...6)))
        case 2 where !segments.isEmpty: segments[segments.count - 1] = .key(Array("nope".utf8))
        default: segments.append(.index(99))
        }
        return segments
    }

    /// The dot form of `segments`, when every key can be written in it with the same meaning.
    private static func textPath(_ segments: [JSONPath.Segment]) -> String? {
        var parts: [String] = []
        for segment in segments {
            switch segment {
            case .index(let index):
                parts.append(String(index))
            case .key(let key):
                let text = String(decoding: key, as: UTF8.self)
                let isDigits = !key.isEmpty && key.allSatisfy { $0 >= 0x30 && $0 <= 0x39 }
                guard !text.isEmpty, !text.contains("."), !isDigits else { return nil }
                parts.append(text)
            }
        }
        return parts.joined(separator: ".")
    }
}

// MARK: - Deterministic generator

extension JSONCodeScannerTests {

    /// A JSON document model with its own serializer (random whitespace, random escaping, every number form).
    fileprivate indirect enum Node {
        case null
        case bool(Bool)
        case number(String)
        case string(String)
        case array([Node])
        case object([(String, Node)])

        static let characterPool: [Unicode.Scalar] =
            Array("abcXYZ019 _-.:/\"\\{}[],".unicodeScalars) + [
                "\n", "\t", "\r", "\u{8}", "\u{C}", "\u{0}", "\u{1}", "\u{1F}", "\u{7F}",
                "é", "ß", "€", "中", "к", "😀", "𝄞", "\u{FFFF}", "\u{2028}",
            ]

        static func random(_ rng: inout SeededGenerator, depth: Int, forceContainer: Bool = false) -> Node {
            let kind = forceContainer ? rng.int(4...5) : rng.int(0...(depth >= 4 ? 3 : 5))
            switch kind {
            case 0: return .null
            case 1: return .bool(rng.oneIn(2))
            case 2: return .number(randomNumber(&rng))
            case 3: return .string(randomString(&rng, maxLength: 12))
            case 4: return .array((0..<rng.int(0...5)).map { _ in random(&rng, depth: depth + 1) })
            default:
                var seen = Set<String>()
                var members: [(String, Node)] = []
                for _ in 0..<rng.int(0...6) {
                    let key: String
                    switch rng.int(0...5) {
                    case 0: key = String(rng.int(0...12))
                    case 1: key = ["status", "code", "data", "errors", "stat", "statuses"][rng.int(0...5)]
                    default: key = randomString(&rng, maxLength: 6)
                    }
                    // Now and then a key twice (the last one wins).
                    guard seen.insert(key).inserted || rng.oneIn(3) else { continue }
                    members.append((key, random(&rng, depth: depth + 1)))
                }
                return .object(members)
            }
        }

        static func randomString(_ rng: inout SeededGenerator, maxLength: Int) -> String {
            var scalars = String.UnicodeScalarView()
            for _ in 0..<rng.int(0...maxLength) {
                scalars.append(characterPool[rng.int(0...(characterPool.count - 1))])
            }
            return String(scalars)
        }

        static func randomNumber(_ rng: inout SeededGenerator) -> String {
            var text = rng.oneIn(3) ? "-" : ""
            if rng.oneIn(3) {
                text += "0"
            } else {
                text += String(rng.int(1...9))
                for _ in 0..<rng.int(0...8) { text += String(rng.int(0...9)) }
            }
            if rng.oneIn(2) {
                text += "."
                for _ in 0..<rng.int(1...6) { text += String(rng.int(0...9)) }
            }
            if rng.oneIn(3) {
                text += rng.oneIn(2) ? "e" : "E"
                text += ["", "+", "-"][rng.int(0...2)]
                text += String(rng.int(0...30))
            }
            return text
        }

        var hasDuplicateKeys: Bool {
            switch self {
            case .array(let elements): return elements.contains { $0.hasDuplicateKeys }
            case .object(let members):
                return Set(members.map(\.0)).count < members.count || members.contains { $0.1.hasDuplicateKeys }
            default: return false
            }
        }

        func value(at segments: [JSONPath.Segment]) -> Node? {
            var node = self
            for segment in segments {
                switch (segment, node) {
                case (.key(let key), .object(let members)):
                    guard let member = members.last(where: { Array($0.0.utf8) == key }) else { return nil }
                    node = member.1
                case (.index(let index), .object(let members)):
                    guard let member = members.last(where: { $0.0 == String(index) }) else { return nil }
                    node = member.1
                case (.index(let index), .array(let elements)):
                    guard elements.indices.contains(index) else { return nil }
                    node = elements[index]
                default:
                    return nil
                }
            }
            return node
        }

        func serialize(into out: inout String, _ rng: inout SeededGenerator) {
            switch self {
            case .null: out += "null"
            case .bool(let value): out += value ? "true" : "false"
            case .number(let text): out += text
            case .string(let text): Self.serialize(string: text, into: &out, &rng)
            case .array(let elements):
                out += "["
                for (n, element) in elements.enumerated() {
                    if n > 0 { out += "," }
                    Self.space(&out, &rng)
                    element.serialize(into: &out, &rng)
                    Self.space(&out, &rng)
                }
                if elements.isEmpty { Self.space(&out, &rng) }
                out += "]"
            case .object(let members):
                out += "{"
                for (n, (key, value)) in members.enumerated() {
                    if n > 0 { out += "," }
                    Self.space(&out, &rng)
                    Self.serialize(string: key, into: &out, &rng)
                    Self.space(&out, &rng)
                    out += ":"
                    Self.space(&out, &rng)
                    value.serialize(into: &out, &rng)
                    Self.space(&out, &rng)
                }
                if members.isEmpty { Self.space(&out, &rng) }
                out += "}"
            }
        }

        static func space(_ out: inout String, _ rng: inout SeededGenerator) {
            guard rng.oneIn(4) else { return }
            out += [" ", "\n", "\t", "\r\n  ", "   "][rng.int(0...4)]
        }

        static func serialize(string: String, into out: inout String, _ rng: inout SeededGenerator) {
            out += "\""
            for scalar in string.unicodeScalars {
                let short: String? =
                    switch scalar {
                    case "\"": #"\""#
                    case "\\": #"\\"#
                    case "/": #"\/"#
                    case "\u{8}": #"\b"#
                    case "\u{C}": #"\f"#
                    case "\n": #"\n"#
                    case "\r": #"\r"#
                    case "\t": #"\t"#
                    default: nil
                    }
                let mustEscape = scalar == "\"" || scalar == "\\" || scalar.value < 0x20
                if !mustEscape && !rng.oneIn(5) {
                    out.unicodeScalars.append(scalar)
                } else if let short, rng.oneIn(2) {
                    out += short
                } else {
                    for unit in String(scalar).utf16 {
                        let hex = String(unit, radix: 16)
                        let padded = String(repeating: "0", count: 4 - hex.count) + hex
                        out += "\\u" + (rng.oneIn(2) ? padded.uppercased() : padded)
                    }
                }
            }
            out += "\""
        }
    }
}
