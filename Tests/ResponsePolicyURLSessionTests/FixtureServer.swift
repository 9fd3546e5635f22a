import Foundation
import ResponsePolicy
import ResponsePolicyCurl
import Testing

@testable import ResponsePolicyURLSession

// The loopback servers every URLSession suite starts: a Python script from `Fixtures/` on a port of
// its own, stopped whatever the test's outcome. One way to start and stop them, which the
// fixtures with helpers of their own (`TestServer`, `CredentialServer`) wrap.

/// A Python fixture from `Fixtures/`, started with arguments: it prints `PORT <n>` first and exits
/// when its stdin closes.
final class FixtureServer: Sendable {
    struct Failure: Error, CustomStringConvertible {
        var description: String
    }

    let port: Int
    private let process: Process
    private let input: Pipe

    private init(port: Int, process: Process, input: Pipe) {
        self.port = port
        self.process = process
        self.input = input
    }

    static func start(_ name: String, python: String = "python3", arguments: [String] = []) async throws
        -> FixtureServer
    {
        try await withCheckedThrowingContinuation { continuation in
            Thread.detachNewThread {
                continuation.resume(with: Result { try startBlocking(name, python: python, arguments: arguments) })
            }
        }
    }

    private static func startBlocking(_ name: String, python: String, arguments: [String]) throws -> FixtureServer {
        guard let script = Bundle.module.url(forResource: name, withExtension: "py", subdirectory: "Fixtures") else {
            throw Failure(description: "Fixtures/\(name).py is missing from the test bundle")
        }
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = [python, "-u", script.path] + arguments
        let input = Pipe()
        let output = Pipe()
        process.standardInput = input
        process.standardOutput = output
        process.standardError = FileHandle.standardError
        try process.run()
        var line = Data()
        while !line.contains(UInt8(ascii: "\n")) {
            let chunk = output.fileHandleForReading.availableData
            if chunk.isEmpty { break }
            line.append(chunk)
        }
        let text = String(decoding: line, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
        guard text.hasPrefix("PORT "), let port = Int(text.dropFirst(5)) else {
            process.terminate()
            process.waitUntilExit()
            throw Failure(description: "\(name).py did not report its port; it said \(text.debugDescription)")
        }
        return FixtureServer(port: port, process: process, input: input)
    }

    func url(_ pathAndQuery: String) -> URL {
        URL(string: "http://127.0.0.1:\(port)\(pathAndQuery)") ?? URL(fileURLWithPath: "/invalid")
    }

    /// `GET /_stats` through the harness's transport (`HarnessTransport`), decoded.
    func stats<T: Decodable>(_ type: T.Type) async throws -> T {
        let response = try await HarnessTransport.shared.send(HTTPRequest(url: url("/_stats")))
        return try JSONDecoder().decode(T.self, from: response.body)
    }

    /// Posts `settings` to `/_control` (the fixtures that have one).
    func control(_ settings: [String: any Sendable]) async throws {
        let body = try JSONSerialization.data(withJSONObject: settings)
        let request = HTTPRequest(method: "POST", url: url("/_control"), body: body)
        let response = try await HarnessTransport.shared.send(request)
        guard response.status == 200 else {
            throw Failure(
                description: "/_control answered \(response.status): \(String(decoding: response.body, as: UTF8.self))")
        }
    }

    /// Closes its stdin, which makes it exit, and waits until it did, on a thread of its own: a
    /// blocked thread of the cooperative pool (two on a two-core machine) stalls every other test
    /// meanwhile, and a blocked thread of Dispatch's global queue stalls Dispatch's own event
    /// handling (timers, signal sources: a SIGHUP test once went unanswered for 20 s).
    func stop() async {
        await withCheckedContinuation { continuation in
            Thread.detachNewThread {
                try? self.input.fileHandleForWriting.close()
                if self.process.isRunning { self.process.terminate() }
                self.process.waitUntilExit()
                continuation.resume()
            }
        }
    }
}

/// The transport of the harness's own calls to fixtures and tools (`/_stats`, `/_control`, a
/// tool's page): one `CurlTransport` for the whole test run.
///
/// Not a `URLSessionTransport` made per call, as before: `waitForCounter` polls every 10 ms, so
/// a run made and dropped hundreds of URLSessions, and FoundationNetworking's teardown of a
/// session's sockets races libdispatch (a crash of the whole test process in
/// `_dispatch_event_loop_drain`, seen once in about 25 runs of CI's transport step under load:
/// the family of swift-corelibs-foundation#4791). Nor any URLSession: every URLSession of the
/// process waits while one response holds FoundationNetworking's work queue
/// (`TransportFloodTests`), and a harness call must not wait on what the test exercises.
enum HarnessTransport {
    static let shared = CurlTransport(timeout: .seconds(10))
}

/// Runs `body` with a fresh fixture server, and stops it afterwards, also when `body` throws.
func withFixtureServer(
    _ name: String, python: String = "python3", arguments: [String] = [], _ body: (FixtureServer) async throws -> Void
) async throws {
    let server = try await FixtureServer.start(name, python: python, arguments: arguments)
    do {
        try await body(server)
    } catch {
        await server.stop()
        throw error
    }
    await server.stop()
}
