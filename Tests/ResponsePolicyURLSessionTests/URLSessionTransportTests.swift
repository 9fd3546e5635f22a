import Foundation
import ResponsePolicy
import TestGate
import Testing

@testable import ResponsePolicyURLSession

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif
#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// Integration tests of `URLSessionTransport` against `Fixtures/test_server.py`, one server process per test so
/// that tests can run in parallel without sharing scenario state.
@Suite(.loadGate(.realTime))
struct URLSessionTransportTests {
    // MARK: - Round trips

    /// `dispatch: auto` reads this: the configuration's connections per host, the control
    /// session's too (the refresh has a pool of its own with the same size).
    @Test func itReportsItsConnectionsPerHost() throws {
        #expect(
            URLSessionTransport().connectionsPerHost == URLSessionConfiguration.ephemeral.httpMaximumConnectionsPerHost)
        let configuration = URLSessionConfiguration.ephemeral
        configuration.httpMaximumConnectionsPerHost = 3
        let transport = URLSessionTransport(session: URLSession(configuration: configuration))
        #expect(transport.connectionsPerHost == 3)
        #expect(transport.sessionCallTransport.connectionsPerHost == 3)
        #expect(
            try Policy.load(yaml: "policy: 1\nname: d\n").dispatch.maxInFlightPerHost.resolved(
                connectionsPerHost: transport.connectionsPerHost) == 3)
    }

    /// A call's timeout is armed while it is on the wire and gone the moment it ends, however it
    /// ended: a timer kept for the whole timeout after each call (as a sleeping task did) holds
    /// memory in proportion to the request rate times the timeout.
    @Test func aCallsTimeoutLivesNoLongerThanTheCall() async throws {
        try await withTestServer { server in
            let transport = URLSessionTransport(timeout: .seconds(30))
            for _ in 0..<20 {
                #expect(try await transport.send(HTTPRequest(url: server.url("/echo"))).status == 200)
            }
            #expect(transport.armedTimeouts == 0, "answered calls")
            let cancellation = AttemptCancellation()
            let stalled = Task {
                try await transport.send(HTTPRequest(url: server.url("/stall?seconds=20")), cancellation: cancellation)
            }
            try await server.waitForCounter("stall_calls", toReach: 1)
            #expect(transport.armedTimeouts == 1, "the call on the wire")
            cancellation.cancel()
            await #expect(throws: CancellationError.self) { try await stalled.value }
            #expect(transport.armedTimeouts == 0, "a cancelled call")
            let short = URLSessionTransport(timeout: .milliseconds(200))
            await #expect(throws: TransportError.self) {
                try await short.send(HTTPRequest(url: server.url("/stall?seconds=20")))
            }
            #expect(short.armedTimeouts == 0, "a call that timed out")
        }
    }

    /// `dispatch: auto` over URLSession: the connections per host until an origin's task metrics
    /// say it answered over HTTP/2 or HTTP/3 (Apple's URLSession reports them; the delegate's
    /// handling is driven directly here, since FoundationNetworking never calls it), then 100 for
    /// that origin alone, and back when it answers over HTTP/1.1 again.
    @Test func anOriginThatAnsweredOverHTTP2GetsAStreamLimit() throws {
        let transport = URLSessionTransport()
        let api = try #require(URL(string: "https://api.example.com/v1/items?page=2"))
        let sameOrigin = try #require(URL(string: "https://api.example.com:443/other"))
        let other = try #require(URL(string: "https://auth.example.com/token"))
        let plain = try #require(URL(string: "http://api.example.com/v1"))
        let connections = transport.connectionsPerHost
        #expect(transport.inFlightLimit(for: api) == connections)
        transport.noteProtocol("h2", for: api)
        #expect(transport.inFlightLimit(for: api) == 100)
        #expect(
            transport.inFlightLimit(for: sameOrigin) == 100, "the origin, whatever the path, the default port named")
        #expect(transport.inFlightLimit(for: other) == connections, "another host")
        #expect(transport.inFlightLimit(for: plain) == connections, "another scheme")
        #expect(
            try Policy.load(yaml: "policy: 1\nname: d\n").dispatch.maxInFlightPerHost.resolved(
                connectionsPerHost: transport.inFlightLimit(for: api)) == 100)
        transport.noteProtocol("h3", for: other)
        #expect(transport.inFlightLimit(for: other) == 100)
        transport.noteProtocol("http/1.1", for: api)
        #expect(transport.inFlightLimit(for: api) == connections, "an origin that went back to HTTP/1.1")
    }

    @Test func echoPreservesMethodHeadersAndBody() async throws {
        try await withTestServer { server in
            let transport = URLSessionTransport(timeout: .seconds(10))
            let body = Data(#"{"name":"widget","count":3}"#.utf8)
            let request = HTTPRequest(
                method: "put",
                url: server.url("/echo?page=2"),
                headers: [
                    "Content-Type": "application/json",
                    "X-Trace-Id": "trace-1",
                    "Authorization": "Bearer access-0",
                    "Accept": "application/json",
                ],
                body: body
            )

            let response = try await transport.send(request)

            #expect(response.status == 200)
            #expect(response.headers["content-type"] == "application/json")
            let echo = try JSONDecoder().decode(Echo.self, from: response.body)
            #expect(echo.method == "PUT")
            #expect(echo.path == "/echo")
            #expect(echo.query["page"] == ["2"])
            #expect(echo.body == #"{"name":"widget","count":3}"#)
            #expect(echo.values("content-type") == ["application/json"])
            #expect(echo.values("x-trace-id") == ["trace-1"])
            #expect(echo.values("accept") == ["application/json"])
            #expect(echo.values("authorization") == ["Bearer access-0"], "sent exactly once")
            #expect(echo.values("content-length") == ["\(body.count)"])
            #expect(echo.values("cookie").isEmpty)
        }
    }

    @Test func postBodyRoundTripsEveryByte() async throws {
        try await withTestServer { server in
            let transport = URLSessionTransport(timeout: .seconds(10))
            // Every byte value, and large enough to take many writes.
            let body = Data(
                ((0...255).map { UInt8($0) } + Array("tail\r\n\0".utf8)) + Array(repeating: 0x61, count: 70_000))
            let request = HTTPRequest(
                method: "POST",
                url: server.url("/echo"),
                headers: ["Content-Type": "application/octet-stream"],
                body: body
            )

            let response = try await transport.send(request)

            let echo = try JSONDecoder().decode(Echo.self, from: response.body)
            #expect(echo.method == "POST")
            #expect(Data(base64Encoded: echo.bodyBase64) == body)
            #expect(echo.values("content-length") == ["\(body.count)"])
        }
    }

    @Test func emptyPostBodyIsSentWithZeroLength() async throws {
        try await withTestServer { server in
            let transport = URLSessionTransport(timeout: .seconds(10))
            let request = HTTPRequest(method: "POST", url: server.url("/echo"), body: Data())

            let echo = try JSONDecoder().decode(Echo.self, from: try await transport.send(request).body)

            #expect(echo.method == "POST")
            #expect(echo.body.isEmpty)
            #expect(echo.values("content-length") == ["0"])
        }
    }

    @Test func errorStatusesAreResponsesNotErrors() async throws {
        try await withTestServer { server in
            let transport = URLSessionTransport(timeout: .seconds(10))

            let response = try await transport.send(HTTPRequest(url: server.url("/flaky/503")))

            #expect(response.status == 503)
            #expect(response.headers["retry-after"] == "1")
        }
    }

    @Test func getWithBodyIsRejectedBeforeSending() async throws {
        try await withTestServer { server in
            let transport = URLSessionTransport(timeout: .seconds(10))
            let request = HTTPRequest(method: "GET", url: server.url("/echo"), body: Data("x".utf8))

            let error = try await #require(throws: TransportError.self) { try await transport.send(request) }

            #expect(error.errorClass == .connection)
            #expect(error.message.contains("GET request with a body"))
            #expect(try await server.stats().counters["echo_calls"] == 0)
        }
    }

    @Test func oneTransportServesConcurrentRequests() async throws {
        try await withTestServer { server in
            let transport = URLSessionTransport(timeout: .seconds(10))
            let requests = (0..<16).map { index in
                HTTPRequest(method: "POST", url: server.url("/echo"), body: Data("request-\(index)".utf8))
            }

            let bodies = try await withThrowingTaskGroup(of: String.self) { group in
                for request in requests {
                    group.addTask {
                        let response = try await transport.send(request)
                        return try JSONDecoder().decode(Echo.self, from: response.body).body
                    }
                }
                return try await group.reduce(into: Set<String>()) { $0.insert($1) }
            }

            #expect(bodies == Set((0..<16).map { "request-\($0)" }))
        }
    }

    // MARK: - Failures

    @Test func stallLongerThanTimeoutThrowsTimeout() async throws {
        try await withTestServer { server in
            let transport = URLSessionTransport(timeout: .milliseconds(300))
            let clock = ContinuousClock()
            let start = clock.now

            let error = try await #require(throws: TransportError.self) {
                try await transport.send(HTTPRequest(url: server.url("/stall?seconds=20")))
            }

            let elapsed = clock.now - start
            #expect(error.errorClass == .timeout)
            #expect(elapsed >= .milliseconds(250))
            // No upper bound on the time: the server answers the stall after 20 s, so a timeout
            // error (not that answer) already shows the transport's own timer ended the attempt,
            // and a bound would only measure how loaded the machine is.
        }
    }

    @Test func responseCutShortIsAConnectionError() async throws {
        try await withTestServer { server in
            let transport = URLSessionTransport(timeout: .seconds(10))

            let error = try await #require(throws: TransportError.self) {
                try await transport.send(HTTPRequest(url: server.url("/drop")))
            }
            #expect(error.errorClass == .connection)

            // drop_count defaults to 1: the next request gets the whole response.
            let response = try await transport.send(HTTPRequest(url: server.url("/drop")))
            #expect(response.status == 200)
        }
    }

    @Test func closedPortIsAConnectionError() async throws {
        let port = try closedPort()
        let transport = URLSessionTransport(timeout: .seconds(10))
        let url = try #require(URL(string: "http://127.0.0.1:\(port)/api/profile"))

        let error = try await #require(throws: TransportError.self) {
            try await transport.send(HTTPRequest(url: url))
        }

        #expect(error.errorClass == .connection)
    }

    @Test func cancellationDuringStallThrowsCancellationErrorPromptly() async throws {
        try await withTestServer { server in
            let transport = URLSessionTransport(timeout: .seconds(30))
            let url = server.url("/stall?seconds=120")
            let task = Task { try await transport.send(HTTPRequest(url: url)) }
            try await server.waitForCounter("stall_calls", toReach: 1)
            let clock = ContinuousClock()
            let start = clock.now

            task.cancel()
            let result = await task.result

            // Before the server's answer, 120 s after the request: a cancellation that waited for
            // the data task would end then. Not a speed bound, so a loaded machine does not fail it.
            #expect(clock.now - start < .seconds(120))
            #expect(throws: CancellationError.self) { try result.get() }
        }
    }

    @Test func alreadyCancelledTaskSendsNothing() async throws {
        try await withTestServer { server in
            let transport = URLSessionTransport(timeout: .seconds(30))
            let url = server.url("/echo")
            let task = Task {
                withUnsafeCurrentTask { $0?.cancel() }
                return try await transport.send(HTTPRequest(url: url))
            }

            let result = await task.result

            #expect(throws: CancellationError.self) { try result.get() }
            let stats = try await server.stats()
            #expect(stats.counters["echo_calls"] == 0)
        }
    }

    /// An attempt the engine cancelled after its gate (a logout decided meanwhile) but before the
    /// transport started it never reaches the server: the call is stopped before its task runs.
    @Test func anAttemptCancelledBeforeItStartsSendsNothing() async throws {
        try await withTestServer { server in
            let transport = URLSessionTransport(timeout: .seconds(30))
            let cancellation = AttemptCancellation()
            cancellation.cancel()

            await #expect(throws: CancellationError.self) {
                try await transport.send(HTTPRequest(url: server.url("/echo")), cancellation: cancellation)
            }
            let stats = try await server.stats()
            #expect(stats.counters["echo_calls"] == 0)
        }
    }

    @Test func errorMessagesCarryNoCredentials() async throws {
        try await withTestServer { server in
            let transport = URLSessionTransport(timeout: .seconds(10))
            var components = try #require(URLComponents(url: server.url("/drop"), resolvingAgainstBaseURL: false))
            components.user = "user-secret"
            components.password = "password-secret"
            components.query = "access_token=query-secret"
            let url = try #require(components.url)
            let request = HTTPRequest(url: url, headers: ["Authorization": "Bearer header-secret"])

            let error = try await #require(throws: TransportError.self) { try await transport.send(request) }

            let text = String(describing: error)
            #expect(text.contains("/drop"))
            for secret in ["user-secret", "password-secret", "query-secret", "header-secret", "access_token"] {
                #expect(!text.contains(secret), "\(secret) leaked into \(text)")
            }
        }
    }

    // MARK: - Classification

    struct ClassificationCase: Sendable, CustomTestStringConvertible {
        var code: URLError.Code
        var expected: TransportErrorClass?
        var testDescription: String { "URLError \(code.rawValue) → \(expected.map(\.rawValue) ?? "nil")" }
    }

    static let classificationCases: [ClassificationCase] = [
        .init(code: .timedOut, expected: .timeout),
        .init(code: .cannotFindHost, expected: .dns),
        .init(code: .dnsLookupFailed, expected: .dns),
        .init(code: .secureConnectionFailed, expected: .tls),
        .init(code: .serverCertificateHasBadDate, expected: .tls),
        .init(code: .serverCertificateUntrusted, expected: .tls),
        .init(code: .serverCertificateHasUnknownRoot, expected: .tls),
        .init(code: .serverCertificateNotYetValid, expected: .tls),
        .init(code: .clientCertificateRejected, expected: .tls),
        .init(code: .clientCertificateRequired, expected: .tls),
        .init(code: .cannotConnectToHost, expected: .connection),
        .init(code: .networkConnectionLost, expected: .connection),
        .init(code: .notConnectedToInternet, expected: .connection),
        .init(code: .badServerResponse, expected: .connection),
        .init(code: .cannotParseResponse, expected: .connection),
        .init(code: .zeroByteResource, expected: .connection),
        .init(code: .resourceUnavailable, expected: .connection),
        .init(code: .cannotDecodeRawData, expected: .connection),
        .init(code: .cannotDecodeContentData, expected: .connection),
        .init(code: .dataLengthExceedsMaximum, expected: .connection),
        .init(code: .httpTooManyRedirects, expected: .connection),
        .init(code: .redirectToNonExistentLocation, expected: .connection),
        .init(code: .internationalRoamingOff, expected: .connection),
        .init(code: .dataNotAllowed, expected: .connection),
        .init(code: .unknown, expected: .connection),
        .init(code: .cancelled, expected: nil),
        .init(code: .badURL, expected: nil),
        .init(code: .unsupportedURL, expected: nil),
        .init(code: .userAuthenticationRequired, expected: nil),
        .init(code: .fileDoesNotExist, expected: nil),
    ]

    @Test(arguments: classificationCases)
    func classifiesURLErrorCodes(_ testCase: ClassificationCase) {
        #expect(URLSessionTransport.classify(URLError(testCase.code)) == testCase.expected)
    }

    @Test(arguments: [
        ("SSL certificate problem: self-signed certificate", TransportErrorClass.tls),
        ("OpenSSL/3.0.19: error:0A00010B:SSL routines::wrong version number", .tls),
        ("transfer closed with 985 bytes remaining to read", .connection),
    ])
    func classifiesUnknownErrorsByLibcurlMessage(_ message: String, _ expected: TransportErrorClass) {
        let error = URLError(.unknown, userInfo: [NSLocalizedDescriptionKey: message])
        #expect(URLSessionTransport.classify(error) == expected)
    }

    // MARK: - The fixture server's scenarios

    @Test func tokenEndpointRotatesRefreshTokens() async throws {
        try await withTestServer { server in
            let transport = URLSessionTransport(timeout: .seconds(10))

            let first = try await transport.send(server.refreshRequest("refresh-0"))
            #expect(first.status == 200)
            let token = try JSONDecoder().decode(TokenResponse.self, from: first.body)
            #expect(token.accessToken == "access-1")
            #expect(token.refreshToken == "refresh-1")
            #expect(token.tokenType == "Bearer")
            #expect(token.expiresIn == 3600)

            let reused = try await transport.send(server.refreshRequest("refresh-0"))
            #expect(reused.status == 400)
            #expect(String(decoding: reused.body, as: UTF8.self).contains("invalid_grant"))

            let oldAccess = HTTPRequest(url: server.url("/api/profile"), headers: ["Authorization": "Bearer access-0"])
            #expect(try await transport.send(oldAccess).body == Data(#"{"status": 1401}"#.utf8))
            let newAccess = HTTPRequest(url: server.url("/api/profile"), headers: ["Authorization": "Bearer access-1"])
            #expect(try await transport.send(newAccess).body == Data(#"{"status": 0, "data": "ok"}"#.utf8))

            let stats = try await server.stats()
            #expect(stats.counters["token_calls"] == 2)
            #expect(stats.counters["token_ok"] == 1)
            #expect(stats.counters["api_expired"] == 1)
        }
    }

    @Test func concurrentRefreshesPileUpAndOnlyOneWins() async throws {
        try await withTestServer { server in
            let transport = URLSessionTransport(timeout: .seconds(10))
            try await server.control(["token_delay": 0.5])
            let request = server.refreshRequest("refresh-0")

            let statuses = try await withThrowingTaskGroup(of: Int.self) { group in
                for _ in 0..<3 {
                    group.addTask { try await transport.send(request).status }
                }
                return try await group.reduce(into: [Int]()) { $0.append($1) }
            }

            #expect(statuses.sorted() == [200, 400, 400], "the first rotates the refresh token the others used")
            let stats = try await server.stats()
            #expect(stats.counters["token_calls"] == 3)
            #expect(stats.counters["token_in_flight_max"] == 3)
            #expect(stats.refreshToken == "refresh-1")
        }
    }

    @Test func controlEndpointSwitchesScenarios() async throws {
        try await withTestServer { server in
            let transport = URLSessionTransport(timeout: .seconds(10))
            let expired = HTTPRequest(url: server.url("/api/profile"), headers: ["Authorization": "Bearer stale"])

            try await server.control(["expired_mode": "http401", "token_mode": "invalid_grant", "flaky_count": 2])
            let unauthorized = try await transport.send(expired)
            #expect(unauthorized.status == 401)
            #expect(unauthorized.headers["www-authenticate"]?.hasPrefix("Bearer") == true)
            #expect(try await transport.send(server.refreshRequest("refresh-0")).status == 400)
            #expect(try await transport.send(HTTPRequest(url: server.url("/flaky/503"))).status == 503)
            #expect(try await transport.send(HTTPRequest(url: server.url("/flaky/503"))).status == 503)
            #expect(try await transport.send(HTTPRequest(url: server.url("/flaky/503"))).status == 200)

            try await server.control(["api_mode": "logout"])
            #expect(try await transport.send(expired).body == Data(#"{"status": 202}"#.utf8))
            let logout = try await transport.send(HTTPRequest(method: "POST", url: server.url("/logout")))
            #expect(logout.status == 200)

            try await server.control(["reset": true])
            #expect(try await transport.send(expired).body == Data(#"{"status": 1401}"#.utf8))
            let stats = try await server.stats()
            #expect(stats.counters["api_calls"] == 1, "reset zeroes the counters")
            #expect(stats.counters["logout_calls"] == 0)

            await #expect(throws: TestServer.Failure.self) { try await server.control(["no_such_key": 1]) }
        }
    }
}

// MARK: - Helpers

private struct TokenResponse: Decodable {
    var accessToken: String
    var tokenType: String
    var expiresIn: Int
    var refreshToken: String

    enum CodingKeys: String, CodingKey {
        case accessToken = "access_token"
        case tokenType = "token_type"
        case expiresIn = "expires_in"
        case refreshToken = "refresh_token"
    }
}

/// A running `test_server.py`; stopped by `withTestServer` whatever the test's outcome.
final class TestServer: Sendable {
    typealias Failure = FixtureServer.Failure

    struct Stats: Decodable {
        var counters: [String: Int]
        var accessToken: String?
        var refreshToken: String?

        enum CodingKeys: String, CodingKey {
            case counters
            case accessToken = "access_token"
            case refreshToken = "refresh_token"
        }
    }

    private let fixture: FixtureServer
    var port: Int { fixture.port }

    fileprivate init(_ fixture: FixtureServer) { self.fixture = fixture }

    func url(_ pathAndQuery: String) -> URL { fixture.url(pathAndQuery) }

    func refreshRequest(_ refreshToken: String) -> HTTPRequest {
        HTTPRequest(
            method: "POST",
            url: url("/oauth/token"),
            headers: ["Content-Type": "application/x-www-form-urlencoded"],
            body: Data("grant_type=refresh_token&refresh_token=\(refreshToken)&client_id=app".utf8)
        )
    }

    /// Posts `settings` to `/_control`.
    func control(_ settings: [String: any Sendable]) async throws { try await fixture.control(settings) }

    func stats() async throws -> Stats { try await fixture.stats(Stats.self) }

    /// Polls `/_stats` until `counter` reaches `value`, for at most a minute: a wait on the
    /// server's signal, whose bound only says "never" on a machine the rest of the suite keeps busy.
    func waitForCounter(_ counter: String, toReach value: Int) async throws {
        let deadline = ContinuousClock.now + .seconds(60)
        while try await stats().counters[counter, default: 0] < value {
            guard ContinuousClock.now < deadline else {
                throw Failure(description: "\(counter) did not reach \(value)")
            }
            try await Task.sleep(for: .milliseconds(10))
        }
    }
}

/// Runs `body` with a fresh server and stops the server afterwards, also when `body` throws.
func withTestServer(_ body: (TestServer) async throws -> Void) async throws {
    try await withFixtureServer("test_server") { try await body(TestServer($0)) }
}

/// A local TCP port nothing listens on, and nothing else can take.
///
/// The socket stays bound, without listening, for the rest of the test run: a connection to it is
/// refused at once, and no server another test starts can be given the port. (Closing it, as this
/// did before, let a test server started meanwhile take the port, and a "closed" endpoint
/// answered 404.)
func closedPort() throws -> Int {
    #if canImport(Glibc)
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    #else
        let fd = socket(AF_INET, SOCK_STREAM, 0)
    #endif
    guard fd >= 0 else { throw TestServer.Failure(description: "socket() failed") }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_port = 0
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    let bound = withUnsafeMutablePointer(to: &address) { pointer in
        pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { socketAddress in
            bind(fd, socketAddress, length) == 0 && getsockname(fd, socketAddress, &length) == 0
        }
    }
    guard bound else {
        close(fd)
        throw TestServer.Failure(description: "bind() failed")
    }
    return Int(UInt16(bigEndian: address.sin_port))
}
