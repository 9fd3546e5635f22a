import Foundation
import ResponsePolicy
import Testing

@testable import ResponsePolicyURLSession

/// `max-body`: memory is bounded by settings, not by what a server sends.
struct MaxBodyTests {
    @Test(arguments: [true, false])
    func aBodyOverTheLimitFailsTheAttemptAsTooLarge(_ announced: Bool) async throws {
        try await withTestServer { server in
            let transport = URLSessionTransport(timeout: .seconds(10), maxBody: 100_000)
            let length = announced ? "" : "&length=0"
            let ok = try await transport.send(HTTPRequest(url: server.url("/big?bytes=100000\(length)")))
            #expect(ok.body.count == 100_000)
            let error = await #expect(throws: TransportError.self) {
                try await transport.send(HTTPRequest(url: server.url("/big?bytes=100001\(length)")))
            }
            #expect(error?.errorClass == .tooLarge)
            #expect(
                error?.message
                    == "GET http://127.0.0.1:\(server.port)/big: the response body is larger than 100000 bytes (max-body)"
            )
        }
    }

    @Test func aHugeBodyIsCutOffEarlyNotReadToItsEnd() async throws {
        try await withTestServer { server in
            let transport = URLSessionTransport(timeout: .seconds(30), maxBody: 1 << 20)
            // 512 MiB without Content-Length: read to its end, this would take seconds and the memory.
            let error = await #expect(throws: TransportError.self) {
                try await transport.send(HTTPRequest(url: server.url("/big?bytes=\(512 << 20)&length=0")))
            }
            #expect(error?.errorClass == .tooLarge)
            #expect(error?.message.hasSuffix("larger than 1 MiB (max-body)") == true)
        }
    }

    @Test func aHEADAnswerAnnouncingALargeBodyIsNotTooLarge() async throws {
        try await withTestServer { server in
            let transport = URLSessionTransport(timeout: .seconds(10), maxBody: 1_000)
            let response = try await transport.send(HTTPRequest(method: "HEAD", url: server.url("/big?bytes=5000")))
            #expect(response.status == 200)
            #expect(response.headers["Content-Length"] == "5000")
        }
    }

    @Test func theDefaultLimitIs64MiB() {
        #expect(URLSessionTransport().maxBody == 64 << 20)
        #expect(URLSessionTransport(maxBody: nil).maxBody == nil)
    }

    @Test func aRuleMatchesTooLargeWithWhenError() async throws {
        try await withTestServer { server in
            let policy = try Policy.load(
                yaml: """
                    policy: 1
                    name: big
                    rules:
                      - { name: huge, when: { error: [too-large] }, then: fail }
                    """, file: "big.yaml")
            let events = Recorder()
            var options = PolicyEngine.Options()
            options.observers = [events]
            let engine = PolicyEngine(
                policy: policy, transport: URLSessionTransport(timeout: .seconds(10), maxBody: 1000), options: options)
            await #expect(throws: PolicyEngineError.self) {
                try await engine.send(HTTPRequest(url: server.url("/big?bytes=5000")))
            }
            let matched = events.all.filter { $0.rule == "huge" }
            #expect(matched.count == 1)
            #expect(matched.first?.error == .tooLarge)
        }
    }

    @Test func aTokenEndpointAnswerIsCappedAt1MiB() async throws {
        try await withTestServer { server in
            // The refresh POSTs; /big answers GET only, so go through a same-origin 303 (POST → GET).
            var redirected = OAuth2Refresh(
                tokenURL: server.url("/redirect?status=303&to=\(formEncoded("/big?bytes=\((1 << 20) + 1)"))"),
                clientID: "app")
            redirected.followRedirects = .sameOrigin
            do {
                _ = try await redirected.refresh(
                    RefreshContext(
                        credentials: Credentials(accessToken: "a", refreshToken: "r"),
                        transport: URLSessionTransport(timeout: .seconds(10)), clock: SystemPolicyClock()))
                Issue.record("the refresh succeeded")
            } catch let failure as RefreshFailure {
                #expect(failure.reason.contains("too-large error"))
                #expect(failure.reason.contains("larger than 1 MiB"))
            }
        }
    }
}

/// `too-large` is definitive (issue 32): the same request gets the same answer, so neither a
/// request nor a refresh is tried again for it, whichever transport carries them.
struct TooLargeIsDefinitiveTests {
    @Test(arguments: TransportKind.allCases)
    func aRetryRuleMatchingTooLargeDoesNotRetryIt(_ kind: TransportKind) async throws {
        try await withTestServer { server in
            let policy = try Policy.load(
                yaml: """
                    policy: 1
                    name: big
                    rules:
                      - { name: anything, when: { error: [any] }, then: retry }
                    retry: { max-retries: 3, backoff: constant, initial: 10ms, attempt-timeout: 5m }
                    """, file: "big.yaml")
            let events = Recorder()
            var options = PolicyEngine.Options()
            options.observers = [events]
            let engine = PolicyEngine(policy: policy, transport: kind.make(maxBody: 1000), options: options)
            let error = await #expect(throws: PolicyEngineError.self) {
                try await engine.send(HTTPRequest(url: server.url("/big?bytes=5000")))
            }
            #expect(String(describing: error).contains("too-large"))
            #expect(events.all.filter { $0.kind == .send }.count == 1)
            #expect(try await server.stats().counters["big_calls"] == 1)
        }
    }

    /// A token endpoint answering a compression bomb: one call, cut at 1 MiB decoded, the refresh
    /// fails at once (not retried for all of `refresh.timeout`), and the session stays.
    @Test(arguments: TransportKind.allCases)
    func aTokenAnswerOverItsCapEndsTheRefreshAtOnceAndKeepsTheSession(_ kind: TransportKind) async throws {
        try await withTestServer { server in
            try await server.control(["expired_mode": "http401"])
            let token = formEncoded("/bomb?bytes=\(64 << 20)")
            let policy = try Policy.load(
                yaml: """
                    policy: 1
                    name: bomb
                    rules:
                      - { name: unauthorized, when: { status: [401] }, then: refresh }
                    refresh:
                      use: oauth2
                      with:
                        token-url: "http://127.0.0.1:\(server.port)/redirect?status=303&to=\(token)"
                        client-id: app
                        follow-redirects: same-origin
                      timeout: 10s
                    """, file: "bomb.yaml")
            let events = Recorder()
            var options = PolicyEngine.Options()
            options.observers = [events]
            let engine = PolicyEngine(
                policy: policy, transport: kind.make(timeout: .seconds(20)),
                credentials: MemoryCredentialStore(Credentials(accessToken: "stale", refreshToken: "r")),
                options: options)
            await #expect(throws: PolicyEngineError.self) {
                try await engine.send(HTTPRequest(url: server.url("/api/profile")))
            }
            let ended = events.all.filter { $0.kind == .refreshEnd }
            #expect(ended.count == 1)
            #expect(ended.first?.reason?.contains("too-large") == true)
            #expect(events.all.filter { $0.kind == .refreshRetry }.isEmpty)
            #expect(events.all.filter { $0.kind == .logout }.isEmpty, "the session stays")
            #expect(try await server.stats().counters["redirect_calls"] == 1, "one token call")
        }
    }
}

private final class Recorder: PolicyObserver {
    private let events = Locked<[PolicyEvent]>([])
    func observe(_ event: PolicyEvent) { events.withLock { $0.append(event) } }
    var all: [PolicyEvent] { events.withLock { $0 } }
}
