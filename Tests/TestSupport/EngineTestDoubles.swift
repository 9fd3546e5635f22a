import Foundation
import ResponsePolicy
import Synchronization

// The engine doubles every test target shares (the core's, the Redis store's): one copy here,
// where each target can import it, instead of one copy per target.

/// The policy most engine tests start from: the business-code scheme plus transient retries.
public let basePolicy = """
    policy: 1
    name: test
    classify: { code: body.status }
    rules:
      - { name: token-expired, when: { code: [1401] }, then: refresh }
      - { name: forced-logout, when: { code: [202] }, then: logout }
      - { name: transient, when: { status: [503], error: [timeout, connection] }, then: retry }
    refresh:
      use: oauth2
      with: { token-url: "https://auth.example.com/token", client-id: app }
    """

/// Collects events from any thread.
///
/// Behind the engine's own `Locked` (a pthread mutex), not `Synchronization.Mutex`: on Linux the
/// latter waits on futexes ThreadSanitizer does not see, so the TSan step reported every
/// observation from two threads as an access race.
public final class EventLog: PolicyObserver {
    private let stored = Locked<[PolicyEvent]>([])
    public init() {}
    public func observe(_ event: PolicyEvent) { stored.withLock { $0.append(event) } }
    public var events: [PolicyEvent] { stored.withLock { $0 } }
    /// The reasons of the `problem` events.
    public var problems: [String] { events.filter { $0.kind == .problem }.compactMap(\.reason) }
}

/// A transport that records every request and answers through a handler (given the request and
/// its number, from 1, in the order the transport was called).
public final class RecordingTransport: Transport {
    public let handler: @Sendable (HTTPRequest, Int) async throws -> HTTPResponse
    /// `Locked`, not `Mutex`, for ThreadSanitizer (see ``EventLog``).
    private let log = Locked<[HTTPRequest]>([])

    public init(_ handler: @escaping @Sendable (HTTPRequest, Int) async throws -> HTTPResponse) {
        self.handler = handler
    }

    public var requests: [HTTPRequest] { log.withLock { $0 } }

    public func send(_ request: HTTPRequest) async throws -> HTTPResponse {
        let count = log.withLock { log in
            log.append(request)
            return log.count
        }
        return try await handler(request, count)
    }
}

public func response(_ body: String, status: Int = 200, headers: HTTPHeaders = [:]) -> HTTPResponse {
    HTTPResponse(status: status, headers: headers, body: Data(body.utf8))
}

public let testURL = URL(fileURLWithPath: "/").appendingPathComponent("profile")
