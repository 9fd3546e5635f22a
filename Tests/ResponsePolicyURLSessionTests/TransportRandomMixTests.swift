import Foundation
import ResponsePolicy
import ResponsePolicyTesting
import TestGate
import Testing

@testable import ResponsePolicyURLSession

/// Both transports under a seeded random mix of everything a call can meet, 16 at once on one
/// transport: answers, bodies, a 307 that keeps the body, answers cut short, bodies over the
/// limit, stalls cancelled at a random point, stalls that time out, and calls cancelled while
/// they may still be answered. Each feature has its own test in `TransportConformanceTests`;
/// here they meet (a cancelled call beside a redirect beside a timeout, all sharing the
/// transport's admission per origin), and the invariants are checked on every call:
/// - each call ends once, with an outcome its kind allows (a body that comes back is the one sent);
/// - no request with a body reaches the server twice, and one that was answered reached it once
///   (the transport's rule for a token call: its refresh token is presented once);
/// - afterwards, 32 calls at once are all answered: no call of the mix kept a place in the
///   transport's admission, a connection or a handle.
@Suite(.measuresRealTime(filter: "TransportRandomMixTests"), .loadGate(.realTime))
struct TransportRandomMixTests {
    enum Kind: CaseIterable {
        case get, post, redirect307, cutShort, tooLarge, stallCancelled, postCancelled, stallTimedOut
    }

    enum Outcome: Equatable, CustomStringConvertible {
        case answered(String)
        case failed(TransportErrorClass)
        case cancelled
        case other(String)

        var description: String {
            switch self {
            case .answered(let body): "answered \(body.prefix(40))"
            case .failed(let errorClass): "failed \(errorClass)"
            case .cancelled: "cancelled"
            case .other(let text): "other \(text)"
            }
        }
    }

    typealias Call = MixCall<Kind>

    static func pick(_ random: SeededRandomSource) -> Kind {
        // Weights: mostly answers, some of each failure.
        let roll = Int(random.nextBits() % 100)
        switch roll {
        case 0..<24: return .get
        case 24..<48: return .post
        case 48..<58: return .redirect307
        case 58..<66: return .cutShort
        case 66..<74: return .tooLarge
        case 74..<84: return .stallCancelled
        case 84..<97: return .postCancelled
        default: return .stallTimedOut
        }
    }

    static func call(_ id: String, _ kind: Kind, _ random: SeededRandomSource, _ server: TestServer) -> Call {
        let body = Data(("p-\(id)-" + String(repeating: "x", count: Int(random.nextBits() % 2_000))).utf8)
        let yields = Int(random.nextBits() % 6)
        let pause = random.nextBits() % 2 == 0 ? Duration.milliseconds(Int(random.nextBits() % 30)) : nil
        let request: HTTPRequest
        switch kind {
        case .get: request = HTTPRequest(url: server.url("/echo?id=\(id)"))
        case .post, .postCancelled:
            request = HTTPRequest(method: "POST", url: server.url("/echo?id=\(id)"), body: body)
        case .redirect307:
            request = HTTPRequest(
                method: "POST", url: server.url("/redirect?status=307&to=%2Fecho%3Fid%3D\(id)"), body: body)
        case .cutShort: request = HTTPRequest(url: server.url("/drop?id=\(id)"))
        case .tooLarge:
            var big = HTTPRequest(url: server.url("/big?bytes=300000&id=\(id)"))
            big.maxResponseBytes = 1_000
            request = big
        case .stallCancelled, .stallTimedOut: request = HTTPRequest(url: server.url("/stall?seconds=20&id=\(id)"))
        }
        return Call(id: id, kind: kind, request: request, yields: yields, pause: pause)
    }

    static func run(_ call: Call, on transport: any CancellableTransport) async -> Outcome {
        let task = Task { try await transport.send(call.request) }
        if call.kind == .stallCancelled || call.kind == .postCancelled {
            await cancel(task, after: call.pause, yields: call.yields)
        }
        do {
            let response = try await task.value
            guard response.status == 200 else { return .other("status \(response.status)") }
            guard let echo = try? JSONDecoder().decode(Echo.self, from: response.body) else { return .other("no echo") }
            return .answered(echo.method + " " + (echo.query["id"]?.first ?? "") + " " + echo.body)
        } catch let error as TransportError {
            return .failed(error.errorClass)
        } catch is CancellationError {
            return .cancelled
        } catch {
            return .other("\(error)")
        }
    }

    /// The outcomes `call` may end with.
    static func allowed(_ call: Call, _ outcome: Outcome) -> Bool {
        let body = String(decoding: call.request.body ?? Data(), as: UTF8.self)
        switch call.kind {
        case .get: return outcome == .answered("GET \(call.id) ")
        case .post, .redirect307: return outcome == .answered("POST \(call.id) \(body)")
        case .postCancelled: return outcome == .answered("POST \(call.id) \(body)") || outcome == .cancelled
        case .cutShort: return outcome == .failed(.connection)
        case .tooLarge: return outcome == .failed(.tooLarge)
        case .stallCancelled: return outcome == .cancelled
        case .stallTimedOut: return outcome == .failed(.timeout)
        }
    }

    @Test(arguments: TransportKind.allCases, [UInt64(33), 34])
    func everyCallEndsOnceAndNoBodyArrivesTwice(_ kind: TransportKind, _ seed: UInt64) async throws {
        try await withTestServer { server in
            try await server.control(["drop_count": 100_000])
            let transport = kind.make(timeout: .seconds(5))
            let random = SeededRandomSource(seed: seed)
            // At most 3 calls that stall until the timeout: each holds a connection for 5 s, and
            // more at once than the transport's connections per host (6) would make the calls
            // queued behind them time out too.
            var calls: [[Call]] = []
            var timingOut = 0
            for worker in 0..<16 {
                var sequence: [Call] = []
                for index in 0..<15 {
                    var kind = Self.pick(random)
                    if kind == .stallTimedOut {
                        timingOut += 1
                        if timingOut > 3 { kind = .get }
                    }
                    sequence.append(Self.call("\(seed)-\(worker)-\(index)", kind, random, server))
                }
                calls.append(sequence)
            }
            let sequences = calls
            let outcomes = await runSequences(sequences) { call in await Self.run(call, on: transport) }
            #expect(outcomes.count == 16 * 15)
            expectAllowed(outcomes, label: "\(kind)") { Self.allowed($0, $1) }

            // What reached the server: each body at most once, once when it was answered.
            let received = try await server.requests().filter { $0.path == "/echo" && $0.method == "POST" }
            let arrivals = received.reduce(into: [String: Int]()) { $0[$1.query, default: 0] += 1 }
            for (call, outcome) in outcomes where call.request.body != nil {
                let times = arrivals["id=\(call.id)", default: 0]
                #expect(times <= 1, "\(kind) \(call.id) \(call.kind) reached the server \(times) times")
                if case .answered = outcome { #expect(times == 1, "\(kind) \(call.id) answered, received \(times)") }
            }

            // Nothing of the mix holds a place: 32 at once, all answered.
            let after = await succeedingAtOnce(32) { index in
                let request = HTTPRequest(url: server.url("/echo?id=after-\(index)"))
                return (try? await transport.send(request))?.status == 200
            }
            #expect(after == 32)
        }
    }
}
