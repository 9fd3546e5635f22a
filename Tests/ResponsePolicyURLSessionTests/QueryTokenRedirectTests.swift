import Foundation
import ResponsePolicy
import Testing

@testable import ResponsePolicyURLSession

/// A `query` authorizer puts the token in the URL; a redirect that repeats the request's query
/// in its `Location` (query-preserving) must not carry it to another origin.
struct QueryTokenRedirectTests {
    static let token = "tok-QUERY-8265"

    @Test(arguments: RedirectTests.statuses)
    func aQueryPreservingRedirectToAnotherOriginDropsTheToken(_ status: Int) async throws {
        try await withTwoServers { home, elsewhere in
            let policy = try Policy.load(
                yaml: """
                    policy: 1
                    name: query-token
                    rules: []
                    authorize: { use: query, with: { name: access_token } }
                    """, file: "query.yaml")
            let engine = PolicyEngine(
                policy: policy, transport: URLSessionTransport(timeout: .seconds(10)),
                credentials: MemoryCredentialStore(Credentials(accessToken: Self.token)))
            // What a query-preserving redirect sends: the target with the request's own query,
            // token included, plus a parameter of the server's own.
            let target = elsewhere.url("/echo").absoluteString + "?page=2&access_token=\(Self.token)"
            let start = home.url("/redirect?status=\(status)&to=\(formEncoded(target))&page=3")
            let response = try await engine.send(HTTPRequest(url: start))
            #expect(response.status == 200)
            let received = try await elsewhere.requests()
            #expect(received.count == 1)
            #expect(received.first?.query == "page=2", "\(received)")
            #expect(!received.contains { $0.contains(Self.token) })
        }
    }

    @Test func onlyRepeatedValuesAreDropped() throws {
        let sent = try #require(URL(string: "https://a.example/x?access_token=T0K&key=LONG-VALUE-1&page=1"))
        let target = try #require(
            URL(string: "https://b.example/y?access_token=T0K&t=T0K&k=LONG-VALUE-1&page=2&x&n=1"))
        let safe = RedirectRules.withoutEchoedQuery(target, sent: sent)
        // `t=T0K` stays: a short value under another name is not taken for an echo.
        #expect(safe.absoluteString == "https://b.example/y?t=T0K&page=2&x&n=1")
        let untouched = try #require(URL(string: "https://b.example/y?q=1"))
        #expect(RedirectRules.withoutEchoedQuery(untouched, sent: sent) == untouched)
    }
}
