import Foundation
import TestGate
import Testing

@testable import ResponsePolicy

/// The engine on the real concurrency pool and the real clock, as production runs it. No test
/// here waits on time: they assert on counts, which must hold under any interleaving. These are
/// the tests `.ci/run` repeats under the thread sanitizer.
@Suite(.loadGate(.saturating))
struct EngineConcurrencyTests {
    /// Answers 1401 to every token but `token-1`, the first refreshed one.
    struct TokenTransport: Transport {
        func send(_ request: HTTPRequest) async throws -> HTTPResponse {
            await Task.yield()
            let fresh = request.headers["Authorization"] == "Bearer token-1"
            return HTTPResponse(status: 200, body: Data((fresh ? "{\"status\":0}" : "{\"status\":1401}").utf8))
        }
    }

    /// The base policy without its clocks: no attempt timeout, no deadline and an hour for the
    /// refresh. These tests count outcomes; under ThreadSanitizer a 10,000-task storm takes longer
    /// than the default 10 s timeouts, and timers fire on time even while the pool is saturated.
    static let untimedPolicy = basePolicy + "\n  timeout: 1h\nretry: { attempt-timeout: none, deadline: none }\n"

    func engine(refresh: CountingRefresh, policy: String = untimedPolicy) throws -> PolicyEngine {
        var options = PolicyEngine.Options()
        options.refreshPlugin = refresh
        return PolicyEngine(
            policy: try Policy.load(yaml: policy), transport: TokenTransport(),
            credentials: MemoryCredentialStore(Credentials(accessToken: "token-0")), options: options)
    }

    @Test func tenThousandConcurrentTriggersMakeOneRefreshOnTheRealPool() async throws {
        let refresh = CountingRefresh { for _ in 0..<10 { await Task.yield() } }
        let engine = try engine(refresh: refresh)
        let delivered = await withTaskGroup(of: Int.self) { group in
            for index in 0..<10_000 {
                group.addTask {
                    let result = try? await engine.send(HTTPRequest(url: testURL, id: "s\(index)"))
                    return result?.body == Data("{\"status\":0}".utf8) ? 1 : 0
                }
            }
            return await group.reduce(0, +)
        }
        #expect(delivered == 10_000)
        #expect(refresh.calls == 1)
        #expect(engine.debugSnapshot.leftovers == 0 && !engine.debugSnapshot.refreshing)
    }

    @Test func cancellingHalfTheCallersStillEndsEverySendOnce() async throws {
        let refresh = CountingRefresh { for _ in 0..<50 { await Task.yield() } }
        let engine = try engine(refresh: refresh)
        let ended = Counter()
        await withTaskGroup(of: Void.self) { group in
            for index in 0..<2_000 {
                let task = Task {
                    _ = try? await engine.send(HTTPRequest(url: testURL, id: "c\(index)"))
                    ended.increment()
                }
                if index % 2 == 0 { task.cancel() }
                group.addTask { await task.value }
            }
        }
        #expect(ended.value == 2_000)
        #expect(refresh.calls <= 1)
        #expect(engine.debugSnapshot.leftovers == 0 && !engine.debugSnapshot.refreshing)
    }

    @Test func logoutDuringAStormEndsEveryRequest() async throws {
        struct LogoutTransport: Transport {
            func send(_ request: HTTPRequest) async throws -> HTTPResponse {
                await Task.yield()
                let body = request.id == "l500" ? "{\"status\":202}" : "{\"status\":1401}"
                return HTTPResponse(status: 200, body: Data(body.utf8))
            }
        }
        let refresh = CountingRefresh { for _ in 0..<200 { await Task.yield() } }
        var options = PolicyEngine.Options()
        options.refreshPlugin = refresh
        let engine = PolicyEngine(
            // A cooldown far longer than the storm: on the real clock, a starved CI machine once took
            // 82 s, and the default cooldown ran out before `isLoggedOut` was asked.
            policy: try Policy.load(
                yaml: basePolicy + "\n  on-failure: fail\n  max-per-request: 3\nlogout: { cooldown: 1h }\n"),
            transport: LogoutTransport(), credentials: MemoryCredentialStore(Credentials(accessToken: "token-0")),
            options: options)
        let count = await withTaskGroup(of: Int.self) { group in
            for index in 0..<1_000 {
                group.addTask {
                    do {
                        _ = try await engine.send(HTTPRequest(url: testURL, id: "l\(index)"))
                        return 1
                    } catch {
                        return 1
                    }
                }
            }
            return await group.reduce(0, +)
        }
        #expect(count == 1_000)
        #expect(engine.isLoggedOut)
        #expect(engine.debugSnapshot.leftovers == 0)
    }
}

final class Counter: Sendable {
    private let count = Locked(0)
    func increment() { count.withLock { $0 += 1 } }
    var value: Int { count.withLock { $0 } }
}
