import Testing

@testable import ResponsePolicy

struct GlobTests {
    @Test(arguments: [
        ("/oauth/*", "/oauth/token", true), ("/oauth/*", "/oauth/v2/token", true), ("/oauth/*", "/oauth", false),
        ("*", "", true), ("a?c", "abc", true), ("a?c", "ac", false), ("*b*b", "abab", true), ("*b*b", "abba", false),
        ("/caf?/*", "/café/menu", true), ("/x", "/x", true), ("/x", "/y", false), ("**a", "bba", true),
    ])
    func matches(_ pattern: String, _ text: String, _ expected: Bool) {
        #expect(Glob(pattern).matches(text) == expected, "\(pattern) ~ \(text)")
    }
}
