import Foundation
import Testing

@testable import ResponsePolicy

/// What a token endpoint's answer means (SPEC "The refresh token is irreplaceable"), case by case:
/// the judgement the refresh flight decides from, and `explain` and the docs print.
struct TokenAnswerTests {
    struct KindCase: Sendable, CustomTestStringConvertible {
        var status: Int
        var body: String
        var kind: RefreshFailure.Kind
        var testDescription: String { "\(status) \(body)" }
    }

    @Test(arguments: [
        // Every RFC 6749 §5.2 code, whatever the status it comes with.
        KindCase(status: 400, body: #"{"error":"invalid_request"}"#, kind: .definitive),
        KindCase(status: 401, body: #"{"error":"invalid_client"}"#, kind: .definitive),
        KindCase(status: 400, body: #"{"error":"invalid_grant"}"#, kind: .definitive),
        KindCase(status: 400, body: #"{"error":"unauthorized_client"}"#, kind: .definitive),
        KindCase(status: 400, body: #"{"error":"unsupported_grant_type"}"#, kind: .definitive),
        KindCase(status: 400, body: #"{"error":"invalid_scope"}"#, kind: .definitive),
        KindCase(status: 503, body: #"{"error":"invalid_grant"}"#, kind: .definitive),
        // "Not now", whatever the status.
        KindCase(status: 400, body: #"{"error":"temporarily_unavailable"}"#, kind: .transient),
        KindCase(status: 400, body: #"{"error":"slow_down"}"#, kind: .transient),
        // Any other 4xx is definitive (a login endpoint's 401 or 403: a wrong password), but 408,
        // 425 and 429; every 5xx is transient; an answer that is no token (a proxy's page) too.
        KindCase(status: 401, body: "", kind: .definitive),
        KindCase(status: 403, body: "<html>forbidden</html>", kind: .definitive),
        KindCase(status: 404, body: "", kind: .definitive),
        KindCase(status: 400, body: #"{"error":"made_up"}"#, kind: .definitive),
        KindCase(status: 408, body: "", kind: .transient),
        KindCase(status: 425, body: "", kind: .transient),
        KindCase(status: 429, body: "", kind: .transient),
        KindCase(status: 500, body: "", kind: .transient),
        KindCase(status: 503, body: #"{"error":"server_error"}"#, kind: .transient),
        KindCase(status: 200, body: "<html>captive portal</html>", kind: .transient),
        KindCase(status: 302, body: "", kind: .transient),
    ])
    func eachAnswerIsReadAsTheServerMeantIt(_ testCase: KindCase) {
        let response = HTTPResponse(status: testCase.status, body: Data(testCase.body.utf8))
        #expect(RefreshFailure.kind(of: response) == testCase.kind)
        #expect(RefreshFailure("x", response: response).kind == testCase.kind)
    }

    @Test func thePolicysRulesMakeAnAnswerDefinitiveNeverTransient() {
        let transient = RefreshFailure("503", response: HTTPResponse(status: 503))
        #expect(TokenAnswer.judged(transient, ruleAction: .logout).isDefinitive)
        #expect(TokenAnswer.judged(transient, ruleAction: .refresh).isDefinitive)
        #expect(TokenAnswer.judged(transient, ruleAction: .fail).isDefinitive)
        #expect(!TokenAnswer.judged(transient, ruleAction: .retry).isDefinitive)
        #expect(!TokenAnswer.judged(transient, ruleAction: nil).isDefinitive)
        let definitive = RefreshFailure("400", response: HTTPResponse(status: 400))
        #expect(TokenAnswer.judged(definitive, ruleAction: .retry).isDefinitive)
    }

    @Test func aTokenThatCannotBeSentSaysWhyWithoutShowingIt() {
        #expect(TokenAnswer.unsendable("eyJhbGciOi.x.y") == nil)
        #expect(TokenAnswer.unsendable(String(repeating: "a", count: 16 * 1024)) == nil)
        let long = String(repeating: "a", count: 16 * 1024 + 1)
        #expect(TokenAnswer.unsendable(long) == "the access token is 16385 bytes, over the 16 KiB the engine sends")
        for bad in ["abc\r\nX-Injected: 1", "abc\u{0}", "abc\u{1B}[31m", "tab\tbed", "del\u{7F}"] {
            #expect(
                TokenAnswer.unsendable(bad)
                    == "the access token holds control characters, which cannot be sent in a header",
                "\(bad.debugDescription)")
        }
        #expect(TokenAnswer.unsendable("") == "the access token is empty")
    }

    @Test func aRetryAfterIsReadInFullUpToADay() {
        let date = Date(timeIntervalSince1970: 1_700_000_000)
        func wait(_ header: String) -> Duration? {
            TokenAnswer.requestedWait(
                RefreshFailure("429", response: HTTPResponse(status: 429, headers: ["Retry-After": header])), date: date
            )
        }
        #expect(wait("30") == .seconds(30))
        #expect(wait("3600") == .seconds(3600))
        #expect(wait("99999999") == .seconds(24 * 3600))
        #expect(wait("soon") == nil)
        #expect(TokenAnswer.requestedWait(RefreshFailure("x", retryAfter: .seconds(7)), date: date) == .seconds(7))
    }

    @Test func aValueIsQuotedOnlyWhenItCannotBeASecret() {
        #expect(TokenAnswer.quoted(NSNumber(value: 1e18)) == "1e+18")
        #expect(TokenAnswer.quoted("-5") == "'-5'")
        #expect(TokenAnswer.quoted("soon") == "a text of 4 characters")
        #expect(TokenAnswer.quoted("eyJhbGciOiJIUzI1NiJ9.e30.x") == "a text of 26 characters")
        #expect(TokenAnswer.quotedType("mac") == "'mac'")
        #expect(TokenAnswer.quotedType("PLANTED-SECRET-52aa") == "a text of 19 characters")
        // Beside the answer's tokens: what contains one or is part of one is given by length.
        #expect(TokenAnswer.quotedType("Bearfailer", hiding: ["at-0123456789", nil, ""]) == "'Bearfailer'")
        #expect(TokenAnswer.quotedType("abc123", hiding: ["xabc123y"]) == "a text of 6 characters")
        #expect(TokenAnswer.quotedType("xabc123y", hiding: ["abc123"]) == "a text of 8 characters")
        #expect(TokenAnswer.quoted("4711", hiding: ["t4711"]) == "a text of 4 characters")
        #expect(
            TokenAnswer.quoted(NSNumber(value: 88_123_456_789), hiding: ["88123456789"]) == "a number of 11 characters")
        #expect(TokenAnswer.quoted(NSNumber(value: -5), hiding: ["88123456789"]) == "-5")
        #expect(
            TokenAnswer.tokenTexts(
                in: Data(#"{"access_token":"a","token_type":"b","x":{"Token":"c","refresh":"d"},"n":1}"#.utf8)
            )
            .compactMap { $0 }.sorted() == ["a", "c", "d"])
        #expect(TokenAnswer.tokenTexts(in: Data("not json".utf8)).isEmpty)
    }
}
