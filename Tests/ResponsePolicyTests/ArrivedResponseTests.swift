import Foundation
import Testing

@testable import ResponsePolicy

/// A response that has arrived is the server's answer: a logout decided while the engine is
/// still taking it in does not throw it away. Its rule decides (a `deliver` delivers it, a
/// `fail` fails it); what needs the session (a refresh, a retry) ends the request logged out.
/// `cancel-in-flight` still cancels every attempt whose response has not arrived.
struct ArrivedResponseTests {
    /// An inline transport: `/arrives` gets its answer, and in the instant between the answer
    /// and the engine reading it, the host logs out (the race a storm's 202 makes on a real
    /// connection); `/hangs` waits for its cancellation.
    final class LogoutOnArrival: CancellableTransport {
        let engine = Locked<PolicyEngine?>(nil)
        let answer: HTTPResponse
        private let onWire = Locked(0)

        init(answer: HTTPResponse) { self.answer = answer }

        var attemptsOnWire: Int { onWire.withLock { $0 } }

        func send(_ request: HTTPRequest) async throws -> HTTPResponse {
            try await send(request, cancellation: AttemptCancellation())
        }

        func send(_ request: HTTPRequest, cancellation: AttemptCancellation) async throws -> HTTPResponse {
            onWire.withLock { $0 += 1 }
            if request.url.path.hasSuffix("/hangs") {
                await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                    cancellation.onCancel { continuation.resume() }
                }
                throw CancellationError()
            }
            if request.url.path.hasSuffix("/arriving") {
                // Its status and headers are in, the body still coming, when the logout is decided:
                // the attempt is left to finish.
                cancellation.responseArriving()
                engine.withLock { $0 }?.logout(reason: "the user signed out")
                #expect(!cancellation.isCancelled, "a logout leaves an arriving response alone")
                return answer
            }
            // The answer is here; the logout is decided before the engine reads it.
            let arrived = answer
            engine.withLock { $0 }?.logout(reason: "the user signed out")
            #expect(cancellation.isCancelled, "cancel-in-flight reached the attempt")
            return arrived
        }
    }

    struct Case: Sendable, CustomTestStringConvertible {
        let status: Int
        let body: String
        let delivered: Bool
        var testDescription: String { "\(status) \(body)" }
    }

    @Test(arguments: [
        Case(status: 200, body: #"{"status":0}"#, delivered: true),  // no rule matches: delivered
        Case(status: 200, body: #"{"status":1401}"#, delivered: false),  // a refresh trigger: the session is over
        Case(status: 503, body: "{}", delivered: false),  // a retry: none during the cooldown
    ])
    func aResponseThatArrivedIsHandledByItsRuleWhenALogoutIsDecidedMeanwhile(_ example: Case) async throws {
        let policy =
            basePolicy + "\n  share-window: 0s\n"
            + "logout: { cancel-in-flight: true, cooldown: 10s }\n"
        let transport = LogoutOnArrival(answer: response(example.body, status: example.status))
        let refresh = CountingRefresh()
        let simulated = try SimulatedEngine(policy, transport: transport, refresh: refresh)
        transport.engine.withLock { $0 = simulated.engine }
        let base = URL(string: "https://api.example.com")
        let arrivesURL = try #require(base?.appendingPathComponent("arrives"))
        let hangsURL = try #require(base?.appendingPathComponent("hangs"))
        let (arrived, hung) = try await simulated.run { engine in
            // The hanging request is on the wire first; the other's answer arrives with the logout.
            async let hung = Self.outcome(engine, hangsURL)
            while transport.attemptsOnWire == 0 { await Task.yield() }
            let arrived = await Self.outcome(engine, arrivesURL)
            return (arrived, await hung)
        }
        if example.delivered {
            #expect(try arrived.get().body == Data(example.body.utf8))
        } else {
            guard case .failure(.loggedOut) = arrived else {
                Issue.record("expected logged out, got \(arrived)")
                return
            }
        }
        // The attempt still waiting for its answer was cancelled, as cancel-in-flight says.
        guard case .failure(.loggedOut) = hung else {
            Issue.record("expected the waiting attempt to be cancelled by the logout, got \(hung)")
            return
        }
        #expect(refresh.calls == 0, "no refresh once the session ended")
        #expect(transport.attemptsOnWire == 2, "nothing was sent again")
        let outcomes = simulated.events.events.filter { $0.kind == .outcome }.compactMap(\.result)
        #expect(outcomes.count == 2)
        #expect(outcomes.filter { $0 == .delivered }.count == (example.delivered ? 1 : 0))
    }

    /// A transport that says its response is arriving (as `URLSessionTransport` does once the
    /// headers are in) is not cancelled by a logout: the response is read and its rule decides.
    @Test func aResponseAlreadyArrivingIsNotCancelledByALogout() async throws {
        let transport = LogoutOnArrival(answer: response(#"{"status":0}"#))
        let simulated = try SimulatedEngine(basePolicy + "\nlogout: { cancel-in-flight: true }\n", transport: transport)
        transport.engine.withLock { $0 = simulated.engine }
        let url = try #require(URL(string: "https://api.example.com/arriving"))
        let result = try await simulated.run { engine in await Self.outcome(engine, url) }
        #expect(try result.get().status == 200)
        #expect(simulated.engine.isLoggedOut)
        // A request made now fails at once, without the network.
        let later = try await simulated.run { engine in await Self.outcome(engine, url) }
        guard case .failure(.loggedOut) = later else {
            Issue.record("expected logged out, got \(later)")
            return
        }
        #expect(transport.attemptsOnWire == 1)
    }

    static func outcome(_ engine: PolicyEngine, _ url: URL) async -> Result<HTTPResponse, PolicyEngineError> {
        do {
            return .success(try await engine.send(HTTPRequest(url: url)))
        } catch {
            return .failure(error)
        }
    }
}
