import Foundation
import Synchronization
import Testing

@testable import ResponsePolicy

struct EngineTests {
    let unauthorizedPolicy = """
        policy: 1
        name: test
        rules:
          - { name: unauthorized, when: { status: [401] }, then: refresh }
        refresh: { use: oauth2, with: { token-url: "https://auth.example.com/token", client-id: app } }
        """

    @Test func aRefreshedRequestIsReSignedWithTheOldHeaderReplaced() async throws {
        let transport = RecordingTransport { request, _ in
            request.headers["Authorization"] == "Bearer token-1" ? response("ok") : response("expired", status: 401)
        }
        let refresh = CountingRefresh()
        let sim = try SimulatedEngine(unauthorizedPolicy, transport: transport, refresh: refresh)
        let delivered = try await sim.run { engine in
            try await engine.send(
                HTTPRequest(url: testURL, headers: ["Authorization": "Bearer stale", "Accept": "*/*"]))
        }
        #expect(delivered.status == 200)
        #expect(refresh.calls == 1)
        let sent = transport.requests
        #expect(sent.count == 2)
        #expect(
            sent.map { $0.headers.fields.filter { $0.name == "Authorization" }.map(\.value) } == [
                ["Bearer token-0"], ["Bearer token-1"],
            ])
        #expect(sent[1].headers["Accept"] == "*/*")
    }

    /// A refresh that ends before its timeout takes the timeout's timer off the heap (it held
    /// the plugin's task until the deadline), as every attempt does with its attempt timeout.
    @Test func noTimerOutlivesTheWorkItTimes() async throws {
        let transport = RecordingTransport { request, _ in
            request.headers["Authorization"] == "Bearer token-1" ? response("ok") : response("expired", status: 401)
        }
        let sim = try SimulatedEngine(unauthorizedPolicy, transport: transport, refresh: CountingRefresh())
        let timersLeft = try await sim.run { engine in
            _ = try await engine.send(HTTPRequest(url: testURL))
            return engine.debugSnapshot.timers
        }
        #expect(timersLeft == 0)
    }

    @Test func headerAndQueryAuthorizersReplaceTheirEarlierValue() {
        var request = HTTPRequest(url: URL(string: "https://api.example.com/a?x=1&access_token=old")!)
        QueryAuthorizer(name: "access_token").authorize(&request, with: Credentials(accessToken: "new"))
        #expect(request.url.absoluteString == "https://api.example.com/a?x=1&access_token=new")
        HeaderAuthorizer(name: "auth_token").authorize(&request, with: Credentials(accessToken: "t1"))
        HeaderAuthorizer(name: "auth_token").authorize(&request, with: Credentials(accessToken: "t2"))
        #expect(request.headers.fields == [.init(name: "auth_token", value: "t2")])
    }

    @Test func oneGeneratedIdempotencyKeyIsSentOnEveryAttempt() async throws {
        let transport = RecordingTransport { _, count in count < 3 ? response("", status: 503) : response("ok") }
        let sim = try SimulatedEngine(
            "policy: 1\nname: t\nretry: { methods: [POST], backoff: constant, initial: 1s }\nrules: [{ when: { status: [503] }, then: retry }]\n",
            transport: transport)
        _ = try await sim.run { engine in
            try await engine.send(HTTPRequest(method: "POST", url: testURL, body: Data("{}".utf8)))
        }
        let keys = transport.requests.map { $0.headers["Idempotency-Key"] }
        #expect(keys.count == 3)
        #expect(Set(keys).count == 1)
        #expect(keys[0]?.count == 32)
        #expect(transport.requests.allSatisfy { $0.body == Data("{}".utf8) })
    }

    @Test func aCallersIdempotencyKeyIsKept() async throws {
        let transport = RecordingTransport { _, count in count < 2 ? response("", status: 503) : response("ok") }
        let sim = try SimulatedEngine(
            "policy: 1\nname: t\nretry: { backoff: constant }\nrules: [{ when: { status: [503] }, then: retry }]\n",
            transport: transport)
        _ = try await sim.run { engine in
            try await engine.send(HTTPRequest(method: "POST", url: testURL, headers: ["Idempotency-Key": "mine"]))
        }
        #expect(transport.requests.map { $0.headers["Idempotency-Key"] } == ["mine", "mine"])
    }

    @Test func cancellingTheCallerCancelsTheWaitAndEndsTheRequestOnce() async throws {
        let transport = RecordingTransport { _, _ in response("", status: 503) }
        let sim = try SimulatedEngine(
            "policy: 1\nname: t\nretry: { backoff: constant, initial: 10s }\nrules: [{ when: { status: [503] }, then: retry }]\n",
            transport: transport)
        let clock = sim.clock
        let scheduler = sim.scheduler
        let outcome = try await sim.run { engine -> String in
            let task = Task(executorPreference: scheduler) { () -> Result<HTTPResponse, PolicyEngineError> in
                do throws(PolicyEngineError) {
                    return .success(try await engine.send(HTTPRequest(url: testURL)))
                } catch {
                    return .failure(error)
                }
            }
            try await clock.sleep(until: .seconds(2))
            task.cancel()
            let result = await task.value
            return "\(result)@\(clock.now)"
        }
        #expect(outcome == "failure(the request was cancelled)@2.0 seconds")
        #expect(transport.requests.count == 1)
        let kinds = sim.events.events.map(\.kind.rawValue)
        #expect(kinds == ["send", "response", "wait", "cancel", "outcome"])
    }

    @Test func signingInEndsTheCooldownEarly() async throws {
        let transport = RecordingTransport { request, _ in
            request.headers["Authorization"] == "Bearer fresh"
                ? response("{\"status\":0}") : response("{\"status\":202}")
        }
        let sim = try SimulatedEngine(basePolicy, transport: transport)
        let results = try await sim.run { engine -> [String] in
            var out: [String] = []
            do { _ = try await engine.send(HTTPRequest(url: testURL)) } catch {
                out.append("\(error)".prefix(10).description)
            }
            do { _ = try await engine.send(HTTPRequest(url: testURL)) } catch { out.append("refused") }
            engine.signIn(Credentials(accessToken: "fresh"))
            let delivered = try await engine.send(HTTPRequest(url: testURL))
            out.append("\(delivered.status)")
            return out
        }
        #expect(results == ["logged out", "refused", "200"])
        // The refused request never reached the transport.
        #expect(transport.requests.count == 2)
    }

    @Test func everySendEndsWithExactlyOneOutcomeUnderRandomInterleavings() async throws {
        let random = SeededRandomSource(seed: 2026)
        let clock = VirtualClock()
        let transport = RecordingTransport { request, _ in
            let roll = random.nextBits() % 100
            let latency = Duration.milliseconds(Int64(random.nextBits() % 300))
            try await clock.sleep(until: clock.now + latency)
            switch roll {
            case 0..<3: return response("{\"status\":202}")
            case 3..<25: return response("{\"status\":1401}")
            case 25..<40: return response("", status: 503, headers: ["Retry-After": "1"])
            case 40..<48: throw TransportError(.connection, "reset")
            case 48..<52: throw TransportError(.dns, "nxdomain")
            default: return response("{\"status\":0}")
            }
        }
        let refresh = CountingRefresh()
        let sim = try SimulatedEngine(
            basePolicy + "\nlogout: { cooldown: 2s }\n", transport: transport, refresh: refresh, clock: clock)
        let scheduler = sim.scheduler
        let count = 400
        let outcomes = try await sim.run { engine -> Int in
            await withTaskGroup(of: Int.self) { group in
                for index in 0..<count {
                    group.addTask {
                        try? await clock.sleep(until: .milliseconds(Int64(index * 25)))
                        // 1 when delivered, 0 when `send` threw: compared with the outcome events.
                        let task = Task(executorPreference: scheduler) { () -> Int in
                            do {
                                _ = try await engine.send(HTTPRequest(url: testURL, id: "q\(index)"))
                                return 1
                            } catch {
                                return 0
                            }
                        }
                        if index % 7 == 0 {
                            try? await clock.sleep(until: clock.now + .milliseconds(Int64(index % 500)))
                            task.cancel()
                        }
                        return await task.value
                    }
                }
                return await group.reduce(0, +)
            }
        }
        let outcomeEvents = sim.events.events.filter { $0.kind == .outcome }
        #expect(outcomeEvents.count == count)
        // What each caller got is what its outcome event says: delivered exactly when `send`
        // returned a response (the storm has both).
        #expect(outcomeEvents.filter { $0.result == .delivered }.count == outcomes)
        #expect(outcomes > 0 && outcomes < count)
        #expect(Set(outcomeEvents.compactMap(\.request)).count == count)
        #expect(refresh.calls >= 1)
    }
}
