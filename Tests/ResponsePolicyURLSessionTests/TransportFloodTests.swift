import Foundation
import ResponsePolicy
import ResponsePolicyCurl
import TestGate
import Testing

@testable import ResponsePolicyURLSession

/// The conformance tests whose responses hold FoundationNetworking's work queue: 10,000 header
/// fields (FoundationNetworking parses the whole head before the transport can count it), a gzip
/// and a deflate bomb decoded up to `maxBody`, and a body at full loopback speed (libcurl's read
/// loop keeps the queue until the delegate's cancel at `maxBody` gets its turn). FoundationNetworking
/// on Linux runs every URLSession of the process on that one serial queue, so while they run,
/// every URLSession call in the process waits. Measured with a probe that creates a data task every
/// 50 ms: alone, the header flood held it 1.0 s and each bomb 0.7–0.9 s; beside the rest of CI's
/// transport step, the floods held it up to 3.0 s and the full-speed body 4.6 s, and on CI's
/// machine over 5 s, which timed out calls of `TransportRandomMixTests`, `EngineTransportMixTests`
/// and `KeepAliveResetTests` (their calls time out at 5 s). So these run apart from the tests that
/// time their calls (`.saturating`), against both transports like the rest of the contract in
/// `TransportConformanceTests`.
@Suite(.measuresRealTime(filter: "TransportFloodTests"), .loadGate(.saturating))
struct TransportFloodTests {
    /// A compressed body is counted after decoding: 1 GiB of zeros is about 1 MiB of gzip, and
    /// must end at the limit, not after inflating it all.
    @Test(arguments: TransportKind.allCases)
    func aCompressionBombEndsAtTheLimitAfterDecoding(_ kind: TransportKind) async throws {
        try await withTestServer { server in
            let transport = kind.make(timeout: .seconds(60), maxBody: 1 << 20)
            let small = try await transport.send(HTTPRequest(url: server.url("/bomb?bytes=1000")))
            #expect(small.body == Data(count: 1000), "decoded")
            for encoding in ["gzip", "deflate"] {
                let error = try await #require(throws: TransportError.self) {
                    try await transport.send(
                        HTTPRequest(url: server.url("/bomb?bytes=\(256 << 20)&encoding=\(encoding)")))
                }
                #expect(error.errorClass == .tooLarge, "\(encoding)")
            }
        }
    }

    @Test(arguments: TransportKind.allCases)
    func tooManyHeaderFieldsAreTooLarge(_ kind: TransportKind) async throws {
        try await withTestServer { server in
            let transport = kind.make(maxHeaders: 50)
            #expect(try await transport.send(HTTPRequest(url: server.url("/headers?count=40"))).status == 200)
            let error = try await #require(throws: TransportError.self) {
                try await transport.send(HTTPRequest(url: server.url("/headers?count=2000")))
            }
            #expect(error.errorClass == .tooLarge)
            #expect(error.message.hasSuffix("the response has more than 50 header fields (max-headers)"))

            // 10,000 small fields at the default limit: printed for the record (the time is
            // policy-bench's business); curl stops at the 501st, FoundationNetworking parses all.
            let start = ContinuousClock.now
            let flood = try await #require(throws: TransportError.self) {
                try await kind.make().send(HTTPRequest(url: server.url("/headers?count=10000")))
            }
            #expect(flood.errorClass == .tooLarge)
            print("TransportFloodTests: 10,000 header fields over \(kind): \(ContinuousClock.now - start)")
        }
    }

    /// A body that never stops, at loopback speed, can keep FoundationNetworking's one work queue
    /// (every URLSession of the process) busy for as long as it flows. The caller still has its
    /// answer at max-body, and the rest of the process runs on: found in CI, where calls waiting
    /// for that queue held both threads of the cooperative pool and every task of the process
    /// stopped for the endless body's 60 s.
    @Test func aFirehoseBodyThroughURLSessionStallsNothingElse() async throws {
        try await withTestServer { server in
            let start = ContinuousClock.now
            let firehose = Task {
                do {
                    _ = try await URLSessionTransport(timeout: .seconds(50), maxBody: 4 << 20).send(
                        HTTPRequest(url: server.url("/endless?pace=0")))
                    return "answered"
                } catch let error as TransportError {
                    return "\(error.errorClass)"
                } catch {
                    return "\(error)"
                }
            }
            // More URLSession calls than the pool has threads, each waiting for that queue.
            let other = URLSessionTransport(timeout: .seconds(50))
            let waiting = (0..<8).map { _ in Task { _ = try? await other.send(HTTPRequest(url: server.url("/echo"))) } }
            defer { for task in waiting { task.cancel() } }
            // Meanwhile the cooperative pool runs other work: a call through libcurl, a timer.
            let curl = try await CurlTransport(timeout: .seconds(20)).send(HTTPRequest(url: server.url("/echo")))
            try await Task.sleep(for: .milliseconds(10))
            #expect(curl.status == 200)
            #expect(ContinuousClock.now - start < .seconds(10), "the process stalled: \(ContinuousClock.now - start)")
            #expect(await firehose.value == "tooLarge")
            #expect(
                ContinuousClock.now - start < .seconds(15), "max-body answered late: \(ContinuousClock.now - start)")
        }
    }
}
