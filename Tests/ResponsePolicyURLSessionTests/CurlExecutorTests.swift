import Foundation
import ResponsePolicy
import ResponsePolicyCurl
import Synchronization
import TestGate
import Testing

/// `CurlTransport.executor`: code run under it runs on the transport's own thread, and requests,
/// cancellation, timeouts and the engine behave as without it.
@Suite(.measuresRealTime(filter: "CurlExecutorTests"), .loadGate(.realTime))
struct CurlExecutorTests {
    struct Echo: Decodable {
        var body: String
    }

    /// The thread a task runs on right now.
    static func thread() -> UInt { UInt(pthread_self()) }

    /// The threads seen, from any task.
    final class Threads: Sendable {
        private let seen = Mutex<Set<UInt>>([])
        func note() { seen.withLock { _ = $0.insert(CurlExecutorTests.thread()) } }
        var count: Int { seen.withLock { $0.count } }
    }

    @Test func requestsUnderTheExecutorRunOnTheTransportsThread() async throws {
        try await withTestServer { server in
            let transport = CurlTransport(timeout: .seconds(10))
            let executor = try #require(transport.executor)
            let threads = Threads()
            let echo = server.url("/echo")
            let bodies = try await withTaskExecutorPreference(executor) {
                var bodies: [String] = []
                for index in 0..<50 {
                    let request = HTTPRequest(
                        method: "POST", url: echo, body: Data("sequential-\(index)".utf8))
                    let response = try await transport.send(request)
                    threads.note()
                    bodies.append(try JSONDecoder().decode(Echo.self, from: response.body).body)
                }
                // A task group's children inherit the preference.
                let concurrent = try await withThrowingTaskGroup(of: String.self) { group in
                    for index in 0..<16 {
                        group.addTask {
                            let request = HTTPRequest(
                                method: "POST", url: echo, body: Data("concurrent-\(index)".utf8))
                            let response = try await transport.send(request)
                            threads.note()
                            return try JSONDecoder().decode(Echo.self, from: response.body).body
                        }
                    }
                    return try await group.reduce(into: [String]()) { $0.append($1) }
                }
                return bodies + concurrent.sorted()
            }
            #expect(bodies.prefix(50) == ArraySlice((0..<50).map { "sequential-\($0)" }))
            #expect(Set(bodies.dropFirst(50)) == Set((0..<16).map { "concurrent-\($0)" }))
            // Every resumption on one thread: the transport's (not the cooperative pool's two).
            #expect(threads.count == 1)
        }
    }

    @Test func cancellationAndTimeoutsUnderTheExecutor() async throws {
        try await withTestServer { server in
            let transport = CurlTransport(timeout: .seconds(30))
            let executor = try #require(transport.executor)
            let url = server.url("/stall?seconds=20")
            let task = Task(executorPreference: executor) { try await transport.send(HTTPRequest(url: url)) }
            try await expectPromptCancellation(of: task, stalledBy: server)

            let short = CurlTransport(timeout: .milliseconds(300))
            let shortExecutor = try #require(short.executor)
            let error = await withTaskExecutorPreference(shortExecutor) {
                await #expect(throws: TransportError.self) { try await short.send(HTTPRequest(url: url)) }
            }
            #expect(error?.errorClass == .timeout)
        }
    }

    /// The engine itself under the executor: 64 requests at once, through `dispatch: auto`.
    @Test func theEngineUnderTheExecutor() async throws {
        try await withTestServer { server in
            let transport = CurlTransport(timeout: .seconds(10))
            let executor = try #require(transport.executor)
            let policy = try Policy.load(yaml: "policy: 1\nname: executor\n", file: "executor.yaml")
            let engine = PolicyEngine(
                policy: policy, transport: transport, credentials: MemoryCredentialStore(Credentials(accessToken: "t")))
            let urls = (0..<64).map { server.url("/echo?i=\($0)") }
            let statuses = try await withThrowingTaskGroup(of: Int.self) { group in
                for url in urls {
                    group.addTask(executorPreference: executor) {
                        try await engine.send(HTTPRequest(url: url)).status
                    }
                }
                return try await group.reduce(into: [Int]()) { $0.append($1) }
            }
            #expect(statuses == Array(repeating: 200, count: 64))
        }
    }

    /// A task that still prefers the executor once its transport is gone (and its thread ended)
    /// runs on: its jobs go to Dispatch.
    @Test func aTaskOutlivingItsTransportRunsOn() async throws {
        var transport: CurlTransport? = CurlTransport(timeout: .seconds(10))
        let executor = try #require(transport?.executor)
        transport = nil
        let value = try await withTaskExecutorPreference(executor) {
            var sum = 0
            for step in 1...20 {
                try await Task.sleep(for: .milliseconds(5))
                sum += step
            }
            return sum
        }
        #expect(value == 210)
    }
}
