import Foundation
import Testing

@testable import ResponsePolicy

/// `HTTPRequest.path` takes a fast route for plain paths; it must agree with the rule it
/// documents (`URL.path`, percent-decoded and without a trailing slash; `/` when empty) for
/// every URL, plain or not.
@Suite struct HTTPRequestPathTests {
    static let urls: [String] = [
        "https://api.example.com/profile",
        "https://api.example.com/v1/profile/settings?x=1#frag",
        "https://api.example.com/",
        "https://api.example.com",
        "https://api.example.com/a/b/",
        "https://api.example.com/a//b//",
        "https://api.example.com/caf%C3%A9/menu",
        "https://api.example.com/a%2Fb/c",
        "https://api.example.com/with%20space/",
        "https://api.example.com/%7Euser",
        "https://api.example.com/a;param=1/b",
        "https://api.example.com/oauth/token",
        "https://user:pass@api.example.com:8443/x/y?z",
        "http://127.0.0.1:8080/items/42",
        "file:///tmp/some/file.json",
        "/relative/path",
        "relative",
    ]

    @Test(arguments: urls)
    func pathAgreesWithURLPath(_ text: String) throws {
        let url = try #require(URL(string: text))
        let reference = url.path.isEmpty ? "/" : url.path
        #expect(HTTPRequest(url: url).path == reference)
    }

    /// Every path of up to three segments from pieces that need decoding, trimming or neither.
    @Test func everyShortPathAgreesWithURLPath() throws {
        let pieces = ["a", "profile", "%20", "%C3%A9", "%2F", "~", "..", "", "x%41y", ";p", "@", ":"]
        var paths = [""]
        for _ in 0..<3 { paths += paths.flatMap { path in pieces.map { path + "/" + $0 } } }
        var checked = 0
        for path in Set(paths) {
            for candidate in [path, path + "/"] {
                guard let url = URL(string: "https://api.example.com" + candidate) else { continue }
                let reference = url.path.isEmpty ? "/" : url.path
                #expect(HTTPRequest(url: url).path == reference, "\(url.absoluteString)")
                checked += 1
            }
        }
        #expect(checked > 3_000)
    }
}
