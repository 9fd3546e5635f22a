import Foundation

@testable import ResponsePolicy

// The few engine doubles the Redis suites use; the core's own (EngineTestDoubles.swift,
// SimulationSupport.swift) are internal to ResponsePolicyTests, a target this one cannot import.

/// The business-code scheme with a refresh and a logout rule.
let basePolicy = """
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

/// A transport that records every request and answers through a handler.
final class RecordingTransport: Transport {
    let handler: @Sendable (HTTPRequest, Int) async throws -> HTTPResponse
    private let log = Locked<[HTTPRequest]>([])

    init(_ handler: @escaping @Sendable (HTTPRequest, Int) async throws -> HTTPResponse) {
        self.handler = handler
    }

    var requests: [HTTPRequest] { log.withLock { $0 } }

    func send(_ request: HTTPRequest) async throws -> HTTPResponse {
        let count = log.withLock { log in
            log.append(request)
            return log.count
        }
        return try await handler(request, count)
    }
}

func response(_ body: String, status: Int = 200, headers: HTTPHeaders = [:]) -> HTTPResponse {
    HTTPResponse(status: status, headers: headers, body: Data(body.utf8))
}

let testURL = URL(fileURLWithPath: "/").appendingPathComponent("profile")
