import Foundation
import ResponsePolicy
import Testing

/// `policy fetch` prints what a server or a store chose only escaped (issue 32 item 2): a
/// business code holding newlines and escape sequences cannot forge lines, a summary, or drive
/// the terminal; `--verbose`'s events stay one JSON object per line.
struct ForgedOutputTests {
    /// A business code that, printed raw, would add three "delivered" lines and a summary, set
    /// the terminal's title (OSC 0), hide text (SGR 8) and write a C1 CSI and a bidi override.
    static let forgedCode =
        "1401\nr2 200 code=0 attempts=1 1ms delivered\nr3 200 code=0 attempts=1 1ms delivered\n"
        + "r4 200 code=0 attempts=1 1ms delivered\nsummary: 4 requests: 4 delivered, 0 failed, 0 logged out\n"
        + "\u{1B}]0;owned\u{07}\u{1B}[8mhidden\u{9B}2J\u{202E}txt\r"

    @Test func aServerChosenBusinessCodeIsPrintedOnOneLineEscaped() async throws {
        try await withTestServer { server in
            try await withScratch { directory in
                // The test server's /echo answers with the request's query in its JSON body: the
                // code is whatever the query says, JSON-escaped by the server, unescaped by us.
                let policy = directory + "/policy.yaml"
                try Data(
                    "policy: 1\nname: forged\nclassify: { code: body.query.c.0 }\nrules: []\n".utf8
                ).write(to: URL(fileURLWithPath: policy))
                let query = Self.forgedCode.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? ""
                let url = server.url("/echo?c=" + query).absoluteString
                let run = try await runPolicy(["fetch", "--policy", policy, "--verbose", url])
                #expect(run.status == 0, "\(run.stderr)")
                let lines = run.stdout.split(separator: "\n", omittingEmptySubsequences: false)
                // One request line, the summary, and the final newline: nothing forged.
                #expect(lines.count == 3, "\(run.stdout.debugDescription)")
                #expect(lines.first?.hasPrefix("r1 200 code=1401\\nr2 200 code=0 attempts=1 1ms delivered\\n") == true)
                #expect(lines.first?.contains("\\u{1B}]0;owned\\u{7}\\u{1B}[8mhidden\\u{9B}2J\\u{202E}txt\\r") == true)
                #expect(lines.dropFirst().first?.hasPrefix("summary: 1 request: 1 delivered") == true)
                for text in [run.stdout, run.stderr] {
                    #expect(!text.unicodeScalars.contains { $0 == "\u{1B}" || $0 == "\u{9B}" || $0 == "\r" })
                    #expect(!text.unicodeScalars.contains { $0 == "\u{202E}" || $0 == "\u{07}" })
                }
                // --verbose: every stderr line is one JSON object, the code in it unchanged.
                var codes: [String] = []
                for line in run.stderr.split(separator: "\n") {
                    let object = try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any]
                    #expect(object != nil, "\(line)")
                    if let code = object?["code"] as? String { codes.append(code) }
                }
                #expect(codes.contains(Self.forgedCode))
            }
        }
    }
}
