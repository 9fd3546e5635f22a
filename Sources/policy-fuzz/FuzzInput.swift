import ResponsePolicy

/// One fuzz input cut into the parts the harness feeds to the package:
/// `POLICY [NUL BODY [NUL REQUEST]]`.
///
/// Why this shape: libFuzzer mutates flat bytes, and a NUL is the one byte a policy file can never
/// hold (the loader refuses it), so cutting at the first two NULs loses no interesting policy. The
/// parts are:
/// - `POLICY`: everything before the first NUL, loaded as a policy file and as a simulation script.
/// - `BODY`: a response body, scanned for the business code the way the engine scans it. Without
///   it the whole input is still given to the JSON code scanner on its own.
/// - `REQUEST`: a first line `STATUS METHOD PATH` (each optional, separated by spaces), then one
///   `Name: value` response header per line. Missing parts default to `200 GET /` and no headers.
///
/// ```text
/// policy: 1\nname: x\nclassify: { code: body.status }\nrules: [...]\n␀{"status":1401}␀401 GET /profile\nX-Reason: quota
/// ```
package struct FuzzInput: Sendable {
    package var policy: [UInt8]
    package var body: [UInt8]?
    package var status: Int
    package var method: String
    package var path: String
    package var headers: HTTPHeaders

    package init(_ bytes: UnsafeRawBufferPointer) {
        let parts = bytes.split(separator: 0, maxSplits: 2, omittingEmptySubsequences: false)
        policy = parts.first.map { Array($0) } ?? []
        body = parts.count > 1 ? Array(parts[1]) : nil
        status = 200
        method = "GET"
        path = "/"
        headers = HTTPHeaders()
        guard parts.count > 2 else { return }
        let lines = String(decoding: parts[2], as: UTF8.self).split(separator: "\n", omittingEmptySubsequences: false)
        if let first = lines.first {
            let words = first.split(separator: " ", maxSplits: 2, omittingEmptySubsequences: true)
            if words.count > 0, let value = Int(words[0]) { status = value }
            if words.count > 1 { method = String(words[1]) }
            if words.count > 2 { path = String(words[2]) }
        }
        for line in lines.dropFirst() {
            guard let colon = line.firstIndex(of: ":") else { continue }
            let value = line[line.index(after: colon)...].drop { $0 == " " }
            headers.add(String(line[..<colon]), String(value))
        }
    }
}
