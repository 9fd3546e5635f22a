import Foundation
import ResponsePolicy
import ResponsePolicyCurl
import Synchronization
import TestGate
import Testing

@testable import ResponsePolicyURLSession

/// A POST survives a keep-alive connection that the server resets at the moment it is reused
/// (issue 20: a token POST went out without its body, stalled until `refresh.timeout` and logged
/// the session out).
///
/// `Fixtures/reset_server.py` with an idle limit of 0 s resets *every* reused connection when the
/// next request arrives on it, so each request after the first meets the reset: no timing, no
/// sleeping. The server answers with the body length announced and the bytes that arrived.
@Suite(.measuresRealTime(filter: "KeepAliveResetTests"), .loadGate(.realTime))
struct KeepAliveResetTests {
    struct Answer: Decodable, Equatable {
        var method: String
        var expected: Int
        var received: Int
    }

    struct Stats: Decodable {
        var resets: Int
        var requests: Int
        var short: Int
        var cut: Int
        var connections: Int
    }

    @Test(arguments: TransportKind.allCases, ["POST", "PUT"])
    func bodiesSurviveAResetAtReuse(_ kind: TransportKind, method: String) async throws {
        try await withFixtureServer("reset_server", arguments: ["0"]) { server in
            let transport = kind.make(timeout: .seconds(5))
            let body = Data(String(repeating: "grant_type=refresh_token&refresh_token=r", count: 3).utf8)
            for index in 0..<12 {
                let request = HTTPRequest(
                    method: method, url: server.url("/token"),
                    headers: ["Content-Type": "application/x-www-form-urlencoded"], body: body)
                let response = try await transport.send(request)
                #expect(response.status == 200, "request \(index)")
                let answer = try JSONDecoder().decode(Answer.self, from: response.body)
                #expect(
                    answer == Answer(method: method, expected: body.count, received: body.count), "request \(index)")
            }
            let stats = try await server.stats(Stats.self)
            // Every answer the client got was to its whole body (above). The server's own count
            // of requests it answered short is CurlTransport's alone: URLSessionTransport cuts a
            // body-less try off by cancelling its task, which waits for FoundationNetworking's
            // one work queue; under load (the conformance suite's endless bodies beside it) that
            // can take longer than the fixture's 1 s of patience, after which the fixture answers
            // what arrived. A real server waits for the Content-Length it was promised, and
            // nobody reads that answer.
            if kind == .curl { #expect(stats.short == 0) }
            // The bodies went on kept-alive connections and met resets, or the test proves
            // nothing: every request after the first is on a reused connection, or on a new
            // one after a reset (URLSessionTransport sends a lost body again on a connection of
            // its own, which then closes, so about every other request meets a reset).
            #expect(stats.resets >= 4, "\(stats.resets) resets")
            print("KeepAliveResetTests \(kind) \(method): \(stats)")
        }
    }

    /// Both transports send bodies on kept-alive connections: 100 sequential POSTs to a server
    /// that never resets open one connection (the goal: at most 1 per 100), and the token calls
    /// of the control transport reuse theirs too (URLSessionTransport's control transport is a
    /// session of its own: one more connection).
    @Test(arguments: TransportKind.allCases)
    func sequentialPostsShareOneConnection(_ kind: TransportKind) async throws {
        try await withFixtureServer("reset_server", arguments: ["600"]) { server in
            let transport = kind.make(timeout: .seconds(5))
            let body = Data(String(repeating: "b", count: 107).utf8)
            for _ in 0..<100 {
                let request = HTTPRequest(method: "POST", url: server.url("/token"), body: body)
                let response = try await transport.send(request)
                #expect(try JSONDecoder().decode(Answer.self, from: response.body).received == body.count)
            }
            let control = transport.sessionCallTransport
            for _ in 0..<10 {
                _ = try await control.send(HTTPRequest(method: "POST", url: server.url("/token"), body: body))
            }
            let stats = try await server.stats(Stats.self)
            // One for the requests, one for /_stats, and for URLSession one for the token calls.
            let most = kind == .curl ? 2 : 3
            #expect(stats.connections <= most, "\(stats.connections) connections for 110 POSTs")
            #expect(stats.short == 0)
        }
    }

    /// A request without a body, or with an empty one, has no body to lose: every one is
    /// answered on the shared connection, none sent again.
    @Test func requestsWithoutABodyAreNeverSentAgain() async throws {
        try await withFixtureServer("reset_server", arguments: ["600"]) { server in
            let transport = URLSessionTransport(timeout: .seconds(5))
            for (method, body) in [("POST", Data()), ("POST", nil), ("PUT", Data()), ("DELETE", nil), ("GET", nil)] {
                for _ in 0..<4 {
                    let response = try await transport.send(
                        HTTPRequest(method: method, url: server.url("/token"), body: body))
                    let answer = try JSONDecoder().decode(Answer.self, from: response.body)
                    #expect(answer == Answer(method: method, expected: 0, received: 0))
                }
            }
            #expect(transport.resentBodies.load(ordering: .relaxed) == 0)
            let stats = try await server.stats(Stats.self)
            #expect(stats.connections <= 2, "\(stats.connections) connections for 20 requests")
        }
    }

    /// The measurement behind the fix: the same 12 POSTs against a server that resets every
    /// reused connection, with the body as plain `httpBody` on kept-alive connections (what the
    /// transport did before issue 20, and does on Apple platforms), as a rewindable stream (sent
    /// chunked), on a fresh connection each (issue 20's fix), and kept-alive with a lost body
    /// sent again (what it does). The last two are asserted; the others are printed for the
    /// record (they are FoundationNetworking's behaviour, which a later toolchain may change).
    @Test func httpBodyAgainstStreamBody() async throws {
        var lines: [String] = []
        for mode in [URLSessionTransport.BodyMode.data, .stream, .freshConnection, .keptAlive] {
            try await withFixtureServer("reset_server", arguments: ["0"]) { server in
                let transport = URLSessionTransport(timeout: .seconds(5), bodyMode: mode)
                let body = Data(String(repeating: "b", count: 107).utf8)
                var whole = 0
                for _ in 0..<12 {
                    let request = HTTPRequest(method: "POST", url: server.url("/token"), body: body)
                    if let response = try? await transport.send(request),
                        let answer = try? JSONDecoder().decode(Answer.self, from: response.body),
                        answer.received == body.count
                    {
                        whole += 1
                    }
                }
                let stats = try await server.stats(Stats.self)
                let resent = transport.resentBodies.load(ordering: .relaxed)
                lines.append(
                    "\(mode): \(whole)/12 whole bodies, \(stats.short) short, \(stats.cut) cut off, \(stats.resets) resets,"
                        + " \(resent) sent again"
                )
                if mode == .freshConnection || mode == .keptAlive { #expect(whole == 12) }
                if mode == .keptAlive { #expect(stats.resets >= 4 && resent >= 1) }
            }
        }
        print("KeepAliveResetTests:", lines.joined(separator: "; "))
    }

    /// What a fresh connection per request with a body costs, printed for the record (no
    /// assertion on time): 100 sequential POSTs on kept-alive connections and on fresh ones, to a
    /// server that never resets. Both must deliver every body.
    @Test func theCostOfAFreshConnectionPerPost() async throws {
        var elapsed: [URLSessionTransport.BodyMode: Duration] = [:]
        try await withFixtureServer("reset_server", arguments: ["600"]) { server in
            for mode in [URLSessionTransport.BodyMode.data, .keptAlive, .freshConnection] {
                let transport = URLSessionTransport(timeout: .seconds(5), bodyMode: mode)
                let body = Data(String(repeating: "b", count: 107).utf8)
                let started = ContinuousClock.now
                for _ in 0..<100 {
                    let response = try await transport.send(
                        HTTPRequest(method: "POST", url: server.url("/token"), body: body))
                    let answer = try JSONDecoder().decode(Answer.self, from: response.body)
                    #expect(answer.received == body.count)
                }
                elapsed[mode] = ContinuousClock.now - started
            }
        }
        if let plain = elapsed[.data], let kept = elapsed[.keptAlive], let fresh = elapsed[.freshConnection] {
            print(
                "KeepAliveResetTests: 100 POSTs plain httpBody \(plain), kept-alive (the default) \(kept),"
                    + " fresh connections \(fresh)")
        }
    }

    /// The token call as the `oauth2` plugin makes it, through the control transport, with the
    /// connection reset before each: every call carries its whole form.
    @Test(arguments: TransportKind.allCases)
    func tokenCallsThroughTheControlTransport(_ kind: TransportKind) async throws {
        try await withFixtureServer("reset_server", arguments: ["0"]) { server in
            let transport = kind.make(timeout: .seconds(5)).sessionCallTransport
            let plugin = OAuth2Refresh(tokenURL: server.url("/token"), clientID: "app")
            for index in 0..<6 {
                // The fixture's answer is no token: the failure carries it, with what arrived.
                let context = RefreshContext(
                    credentials: Credentials(accessToken: "a", refreshToken: "refresh-\(index)"), transport: transport,
                    clock: SystemPolicyClock())
                let failure = await #expect(throws: RefreshFailure.self) { try await plugin.refresh(context) }
                let answer = try JSONDecoder().decode(Answer.self, from: failure?.response?.body ?? Data())
                #expect(answer.received == answer.expected && answer.expected > 0, "call \(index)")
            }
        }
    }
}
