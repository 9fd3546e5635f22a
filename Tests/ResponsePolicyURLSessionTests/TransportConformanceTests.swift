import Foundation
import ResponsePolicy
import ResponsePolicyCurl
import TestGate
import Testing

@testable import ResponsePolicyURLSession

/// The transports a service can choose, and one way to make each for a test.
enum TransportKind: String, CaseIterable, Sendable, CustomTestStringConvertible {
    case urlsession, curl

    var testDescription: String { rawValue }

    func make(
        timeout: Duration = .seconds(10), maxBody: Int? = 64 << 20, maxHeaders: Int = 500
    ) -> any CancellableTransport {
        switch self {
        case .urlsession: URLSessionTransport(timeout: timeout, maxBody: maxBody, maxHeaders: maxHeaders)
        case .curl: CurlTransport(timeout: timeout, maxBody: maxBody, maxHeaders: maxHeaders)
        }
    }
}

/// One contract, both transports: every test here runs against `URLSessionTransport` and
/// `CurlTransport` alike (`Fixtures/test_server.py` on loopback, a server per test). A step of
/// its own in CI (`.ci/run`): the endless body keeps a core busy for seconds. The floods that
/// hold FoundationNetworking's work queue are in `TransportFloodTests`.
@Suite(.measuresRealTime(filter: "TransportConformanceTests"), .loadGate(.realTime))
struct TransportConformanceTests {
    // MARK: - Round trips

    @Test(arguments: TransportKind.allCases)
    func methodHeadersAndBodyGoOutAsGiven(_ kind: TransportKind) async throws {
        try await withTestServer { server in
            let transport = kind.make()
            let body = Data(#"{"name":"widget","count":3}"#.utf8)
            let request = HTTPRequest(
                method: "PUT", url: server.url("/echo?page=2"),
                headers: ["Content-Type": "application/json", "X-Trace-Id": "trace-1", "Authorization": "Bearer a-0"],
                body: body)
            let response = try await transport.send(request)
            #expect(response.status == 200)
            #expect(response.headers["content-type"] == "application/json")
            let echo = try JSONDecoder().decode(Echo.self, from: response.body)
            #expect(echo.method == "PUT")
            #expect(echo.query["page"] == ["2"])
            #expect(echo.body == #"{"name":"widget","count":3}"#)
            #expect(echo.values("x-trace-id") == ["trace-1"])
            #expect(echo.values("authorization") == ["Bearer a-0"], "sent exactly once")
            #expect(echo.values("content-length") == ["\(body.count)"])
            #expect(echo.values("transfer-encoding").isEmpty)
            #expect(echo.values("cookie").isEmpty)
        }
    }

    @Test(arguments: TransportKind.allCases)
    func everyByteOfABodyArrivesWithMethodsThatCarryOne(_ kind: TransportKind) async throws {
        try await withTestServer { server in
            let transport = kind.make()
            let body = Data(
                ((0...255).map { UInt8($0) } + Array("tail\r\n\0".utf8)) + Array(repeating: 0x61, count: 70_000))
            for method in ["POST", "PUT", "PATCH", "DELETE"] {
                let response = try await transport.send(
                    HTTPRequest(method: method, url: server.url("/echo"), headers: ["Content-Type": "x/y"], body: body))
                let echo = try JSONDecoder().decode(Echo.self, from: response.body)
                #expect(echo.method == method)
                #expect(Data(base64Encoded: echo.bodyBase64) == body, "\(method)")
                #expect(echo.values("content-length") == ["\(body.count)"])
            }
            let empty = try await transport.send(HTTPRequest(method: "POST", url: server.url("/echo"), body: Data()))
            let echo = try JSONDecoder().decode(Echo.self, from: empty.body)
            #expect(echo.values("content-length") == ["0"])
        }
    }

    /// One request after another on one transport, in a seeded random order of methods, bodies
    /// and headers: each goes out exactly as given, whatever came before it (`CurlTransport`
    /// hands one libcurl handle from transfer to transfer: a method, a body or a header of one
    /// must never carry over to the next).
    @Test(arguments: TransportKind.allCases)
    func nothingOfOneRequestCarriesOverToTheNext(_ kind: TransportKind) async throws {
        try await withTestServer { server in
            let transport = kind.make()
            let random = SeededRandomSource(seed: 33)
            let methods = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
            var sent: [HTTPRequest] = []
            for index in 0..<60 {
                let method = methods[Int(random.nextBits() % UInt64(methods.count))]
                let bits = random.nextBits()
                var headers: HTTPHeaders = ["X-Seq": "\(index)"]
                if bits & 1 == 0 { headers.add("Content-Type", "application/x-\(index)") }
                if bits & 2 == 0 { headers.add("X-Only-\(index)", "yes") }
                // A body for the methods that carry one, now and then an empty one; none for
                // GET and HEAD.
                let text = bits & 8 == 0 ? "body-\(index)-" + String(repeating: "x", count: Int((bits >> 8) % 300)) : ""
                let body = ["GET", "HEAD"].contains(method) || bits & 4 == 0 ? nil : Data(text.utf8)
                let request = HTTPRequest(
                    method: method, url: server.url("/echo?n=\(index)"), headers: headers, body: body)
                let response = try await transport.send(request)
                #expect(response.status == 200, "\(index) \(method)")
                if method == "HEAD" {
                    #expect(response.body.isEmpty, "\(index)")
                } else {
                    let echo = try JSONDecoder().decode(Echo.self, from: response.body)
                    #expect(echo.method == method, "\(index)")
                    #expect(echo.query["n"] == ["\(index)"])
                    #expect(echo.body == String(decoding: body ?? Data(), as: UTF8.self), "\(index) \(method)")
                }
                sent.append(request)
            }
            // What the server received, in order (HEAD included): the method, the body, and each
            // request's own headers and no other's.
            let received = try await server.requests()
            try #require(received.count == sent.count)
            for (index, (request, got)) in zip(sent, received).enumerated() {
                #expect(got.method == request.method, "\(index)")
                #expect(got.body == String(decoding: request.body ?? Data(), as: UTF8.self), "\(index)")
                #expect(headerValues(got.headers, "x-seq") == ["\(index)"])
                // Only the request's own type; URLSession on Linux adds its documented form type
                // to a body that has none.
                let type = headerValues(got.headers, "content-type")
                if let given = request.headers["Content-Type"] {
                    #expect(type == [given], "\(index)")
                } else if kind == .urlsession, request.body?.isEmpty == false {
                    #expect(type.isEmpty || type == ["application/x-www-form-urlencoded"], "\(index)")
                } else {
                    #expect(type.isEmpty, "\(index) \(request.method)")
                }
                let only = got.headers.compactMap { $0.first?.lowercased() }.filter { $0.hasPrefix("x-only-") }
                #expect(only == (request.headers["X-Only-\(index)"] == nil ? [] : ["x-only-\(index)"]), "\(index)")
                #expect(headerValues(got.headers, "expect").isEmpty)
            }
        }
    }

    @Test(arguments: TransportKind.allCases)
    func statusesAreResponsesAndHEADHasNoBody(_ kind: TransportKind) async throws {
        try await withTestServer { server in
            let transport = kind.make(maxBody: 1_000)
            let flaky = try await transport.send(HTTPRequest(url: server.url("/flaky/503")))
            #expect(flaky.status == 503)
            #expect(flaky.headers["retry-after"] == "1")
            let head = try await transport.send(HTTPRequest(method: "HEAD", url: server.url("/big?bytes=5000")))
            #expect(head.status == 200)
            #expect(head.headers["Content-Length"] == "5000")
            #expect(head.body.isEmpty)
        }
    }

    @Test(arguments: TransportKind.allCases)
    func oneTransportServesConcurrentRequests(_ kind: TransportKind) async throws {
        try await withTestServer { server in
            let transport = kind.make()
            let bodies = try await withThrowingTaskGroup(of: String.self) { group in
                for index in 0..<16 {
                    let request = HTTPRequest(
                        method: "POST", url: server.url("/echo"), body: Data("request-\(index)".utf8))
                    group.addTask {
                        try JSONDecoder().decode(Echo.self, from: try await transport.send(request).body).body
                    }
                }
                return try await group.reduce(into: Set<String>()) { $0.insert($1) }
            }
            #expect(bodies == Set((0..<16).map { "request-\($0)" }))
        }
    }

    /// Many more requests at once than connections: they wait inside the transport and all end,
    /// the cancelled ones too (a storm once left `CurlTransport`'s transfers parked on idle
    /// connections for good).
    @Test(arguments: TransportKind.allCases)
    func aStormBeyondTheConnectionsEndsWithEveryRequestAnswered(_ kind: TransportKind) async throws {
        try await withTestServer { server in
            let transport = kind.make(timeout: .seconds(60))
            let statuses = await withTaskGroup(of: Int.self) { group in
                for index in 0..<300 {
                    let request = HTTPRequest(
                        method: index % 3 == 0 ? "POST" : "GET", url: server.url("/echo?i=\(index)"),
                        body: index % 3 == 0 ? Data("b-\(index)".utf8) : nil)
                    group.addTask {
                        if index % 10 == 0 {
                            // Cancelled while it waits for a connection (or on the wire).
                            let task = Task { try await transport.send(request) }
                            task.cancel()
                            return (try? await task.value)?.status ?? -1
                        }
                        return (try? await transport.send(request))?.status ?? 0
                    }
                }
                return await group.reduce(into: [Int: Int]()) { $0[$1, default: 0] += 1 }
            }
            #expect(statuses[0] == nil, "every request not cancelled was answered: \(statuses)")
            #expect(statuses[200, default: 0] >= 270)
        }
    }

    // MARK: - Failures

    @Test(arguments: TransportKind.allCases)
    func aStallLongerThanTheTimeoutIsATimeout(_ kind: TransportKind) async throws {
        try await withTestServer { server in
            let transport = kind.make(timeout: .milliseconds(300))
            let start = ContinuousClock.now
            let error = try await #require(throws: TransportError.self) {
                try await transport.send(HTTPRequest(url: server.url("/stall?seconds=20")))
            }
            #expect(error.errorClass == .timeout)
            #expect(ContinuousClock.now - start < .seconds(10), "the transport's own timer ended the attempt")
        }
    }

    @Test(arguments: TransportKind.allCases)
    func aCutShortAnswerAndAClosedPortAreConnectionErrors(_ kind: TransportKind) async throws {
        try await withTestServer { server in
            let transport = kind.make()
            let cut = try await #require(throws: TransportError.self) {
                try await transport.send(HTTPRequest(url: server.url("/drop?access_token=query-secret")))
            }
            #expect(cut.errorClass == .connection)
            #expect(!cut.message.contains("query-secret"))
            #expect(try await transport.send(HTTPRequest(url: server.url("/drop"))).status == 200)
        }
        let port = try closedPort()
        let url = try #require(URL(string: "http://127.0.0.1:\(port)/api"))
        let refused = try await #require(throws: TransportError.self) {
            try await kind.make().send(HTTPRequest(url: url))
        }
        #expect(refused.errorClass == .connection)
    }

    @Test(arguments: TransportKind.allCases)
    func cancellationEndsAStalledCallPromptly(_ kind: TransportKind) async throws {
        try await withTestServer { server in
            let transport = kind.make(timeout: .seconds(30))
            let url = server.url("/stall?seconds=20")
            let task = Task { try await transport.send(HTTPRequest(url: url)) }
            try await expectPromptCancellation(of: task, stalledBy: server)

            // The engine's own cancellation, on the wire and before the start.
            let cancellation = AttemptCancellation()
            let attempt = Task { try await transport.send(HTTPRequest(url: url), cancellation: cancellation) }
            try await server.waitForCounter("stall_calls", toReach: 2)
            cancellation.cancel()
            await #expect(throws: CancellationError.self) { try await attempt.value }
            let early = AttemptCancellation()
            early.cancel()
            await #expect(throws: CancellationError.self) {
                try await transport.send(HTTPRequest(url: server.url("/echo")), cancellation: early)
            }
            let cancelled = Task {
                withUnsafeCurrentTask { $0?.cancel() }
                return try await transport.send(HTTPRequest(url: server.url("/echo")))
            }
            await #expect(throws: CancellationError.self) { try await cancelled.value }
            #expect(try await server.stats().counters["echo_calls"] == 0)
        }
    }

    // MARK: - Redirects

    @Test(arguments: TransportKind.allCases)
    func redirectsChangeMethodsAndDropCredentialsAcrossOrigins(_ kind: TransportKind) async throws {
        try await withTwoServers { home, elsewhere in
            let transport = kind.make()
            for status in RedirectTests.statuses {
                let request = HTTPRequest(
                    method: "POST", url: home.url("/redirect?status=\(status)&to=/echo"),
                    headers: ["Authorization": "Bearer tok-SECRET"], body: Data("x=1".utf8))
                let response = try await transport.send(request)
                #expect(response.status == 200)
                #expect(String(decoding: response.body, as: UTF8.self).contains("tok-SECRET"), "same origin keeps it")
            }
            let echoed = try await home.requests().filter { $0.path == "/echo" }
            #expect(echoed.map(\.method) == ["GET", "GET", "GET", "POST", "POST"])
            #expect(echoed.map(\.body) == ["", "", "", "x=1", "x=1"])

            let target = formEncoded(elsewhere.url("/echo?token=query-SECRET-1").absoluteString)
            for status in RedirectTests.statuses {
                let request = HTTPRequest(
                    url: home.url("/redirect?status=\(status)&to=\(target)&token=query-SECRET-1"),
                    headers: ["Authorization": "Bearer tok-SECRET", "X-Api-Key": "key-SECRET", "Accept": "a/b"])
                #expect(try await transport.send(request).status == 200)
            }
            let received = try await elsewhere.requests()
            #expect(received.count == RedirectTests.statuses.count)
            for request in received {
                #expect(!request.contains("SECRET"), "\(request.description)")
                #expect(request.header("Accept") == "a/b")
            }
            var notFollowed = HTTPRequest(url: home.url("/redirect?status=302&to=\(target)"))
            notFollowed.redirects = .sameOrigin
            #expect(try await transport.send(notFollowed).status == 302)
            let loop = try await #require(throws: TransportError.self) {
                try await transport.send(HTTPRequest(url: home.url("/redirect?status=302&loop=1")))
            }
            #expect(loop.message.contains("more than 10 redirects"))
        }
    }

    // MARK: - Memory bounded by settings

    @Test(arguments: TransportKind.allCases)
    func aBodyIsCountedAsItArrivesAnnouncedOrNot(_ kind: TransportKind) async throws {
        try await withTestServer { server in
            let transport = kind.make(maxBody: 100_000)
            for length in ["", "&length=0"] {
                #expect(
                    try await transport.send(HTTPRequest(url: server.url("/big?bytes=100000\(length)"))).body.count
                        == 100_000)
                let error = try await #require(throws: TransportError.self) {
                    try await transport.send(HTTPRequest(url: server.url("/big?bytes=100001\(length)")))
                }
                #expect(error.errorClass == .tooLarge)
                #expect(error.message.hasSuffix("larger than 100000 bytes (max-body)"))
            }
            var capped = HTTPRequest(url: server.url("/big?bytes=2000"))
            capped.maxResponseBytes = 1_000
            #expect(
                try await #require(throws: TransportError.self) { try await transport.send(capped) }.errorClass
                    == .tooLarge)
        }
    }

    @Test(arguments: TransportKind.allCases)
    func anEndlessChunkedBodyEndsAtTheLimit(_ kind: TransportKind) async throws {
        try await withTestServer { server in
            let transport = kind.make(timeout: .seconds(60), maxBody: 4 << 20)
            let error = try await #require(throws: TransportError.self) {
                try await transport.send(HTTPRequest(url: server.url("/endless")))
            }
            #expect(error.errorClass == .tooLarge)
        }
    }

    @Test func theDefaultsAre64MiBAnd500Headers() {
        #expect(URLSessionTransport().maxBody == 64 << 20)
        #expect(CurlTransport().maxBody == 64 << 20)
        #expect(URLSessionTransport().maxHeaders == 500)
        #expect(CurlTransport().maxHeaders == 500)
    }
}

// MARK: - Helpers

/// The JSON `/echo` answers with.
struct Echo: Decodable {
    var method: String
    var path: String
    var query: [String: [String]]
    var headers: [[String]]
    var body: String
    var bodyBase64: String

    enum CodingKeys: String, CodingKey {
        case method, path, query, headers, body
        case bodyBase64 = "body_base64"
    }

    /// Every value of the header `name`, compared without regard to case, in the order received.
    func values(_ name: String) -> [String] { headerValues(headers, name) }
}

/// Every value of the header `name` in the server's `[name, value]` pairs, compared without
/// regard to case, in the order received.
func headerValues(_ headers: [[String]], _ name: String) -> [String] {
    headers.compactMap { pair in
        guard pair.count == 2, pair[0].lowercased() == name.lowercased() else { return nil }
        return pair[1]
    }
}

/// `dispatch: auto` asks the transport per request's origin (``Transport/inFlightLimit(for:)``):
/// over HTTP/2 an origin carries many streams on one connection, over HTTP/1.1 one request per
/// connection.
struct DispatchPerOriginTests {
    /// Holds every request until released; counts them per host and says when each arrives.
    final class HoldingTransport: Transport, @unchecked Sendable {
        // Guarded by `state`'s lock; `arrivals` is itself Sendable.
        private struct State {
            var inFlight: [String: Int] = [:]
            var maximum: [String: Int] = [:]
            var held: [CheckedContinuation<Void, Never>] = []
        }

        private let state = Locked(State())
        let arrivals: AsyncStream<Void>
        private let arrived: AsyncStream<Void>.Continuation

        init() {
            (arrivals, arrived) = AsyncStream.makeStream()
        }

        func inFlightLimit(for url: URL) -> Int? { url.host == "h2.example" ? 5 : 2 }

        func send(_ request: HTTPRequest) async throws -> HTTPResponse {
            let host = request.url.host ?? ""
            await withCheckedContinuation { continuation in
                state.withLock { state in
                    state.inFlight[host, default: 0] += 1
                    state.maximum[host] = max(state.maximum[host] ?? 0, state.inFlight[host] ?? 0)
                    state.held.append(continuation)
                }
                arrived.yield()
            }
            state.withLock { $0.inFlight[host, default: 1] -= 1 }
            return HTTPResponse(status: 200)
        }

        var inFlight: [String: Int] { state.withLock { $0.inFlight } }
        var maximum: [String: Int] { state.withLock { $0.maximum } }

        /// Lets every request held now go on.
        func releaseAll() {
            let held = state.withLock { state in
                defer { state.held = [] }
                return state.held
            }
            for continuation in held { continuation.resume() }
        }
    }

    @Test func theLimitIsTheTransportsForEachOrigin() async throws {
        // No attempt timeout to speak of: the requests are held for as long as the test takes.
        let policy = try Policy.load(yaml: "policy: 1\nname: d\nretry: { attempt-timeout: 1h }\n", file: "d.yaml")
        let transport = HoldingTransport()
        let engine = PolicyEngine(policy: policy, transport: transport)
        try await withThrowingTaskGroup(of: Void.self) { group in
            for host in ["h1.example", "h2.example"] {
                for index in 0..<12 {
                    let url = try #require(URL(string: "https://\(host)/r/\(index)"))
                    group.addTask { _ = try await engine.send(HTTPRequest(url: url)) }
                }
            }
            // Each host's limit arrives (the rest wait in the engine's queue); then release the
            // held ones at every arrival until all 24 went through.
            var arrived = 0
            for await _ in transport.arrivals {
                arrived += 1
                if arrived == 7 { #expect(transport.inFlight == ["h1.example": 2, "h2.example": 5]) }
                if arrived >= 7 { transport.releaseAll() }
                if arrived == 24 { break }
            }
            transport.releaseAll()
            try await group.waitForAll()
        }
        #expect(transport.maximum == ["h1.example": 2, "h2.example": 5])
    }

    @Test func curlSaysSixPerHTTP1HostBeforeAnOriginAnsweredInHTTP2() throws {
        let transport = CurlTransport()
        let url = try #require(URL(string: "https://api.example.com/x"))
        #expect(transport.inFlightLimit(for: url) == 6)
        #expect(CurlTransport(connectionsPerHost: 3).inFlightLimit(for: url) == 3)
        #expect(URLSessionTransport().inFlightLimit(for: url) == URLSessionTransport().connectionsPerHost)
    }
}

/// Cancels `task`, a call `server` stalls (`/stall`), once the server holds it, and expects it to
/// end within seconds with `CancellationError` (the stall is 20 s, the transport's timeout 30 s).
func expectPromptCancellation(
    of task: Task<HTTPResponse, any Error>, stalledBy server: TestServer
) async throws {
    try await server.waitForCounter("stall_calls", toReach: 1)
    let start = ContinuousClock.now
    task.cancel()
    let result = await task.result
    #expect(ContinuousClock.now - start < .seconds(10))
    #expect(throws: CancellationError.self) { try result.get() }
}
