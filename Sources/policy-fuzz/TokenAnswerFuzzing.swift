import Foundation
import ResponsePolicy
import ResponsePolicyTesting

/// Token answers of the fuzzer's choosing, handed to the built-in refresh plugins as their token
/// endpoint's answer (as a transport delivers it: decoded, whole), with a few statuses.
///
/// Oracles: a refresh ends with credentials or a `RefreshFailure`, never a crash or a hang; new
/// credentials have an access token; a failure's reason carries no token (neither the ones the
/// refresh presented nor any `access_token` or `refresh_token` in the answer) and no raw control
/// character.
enum TokenAnswerFuzzing {
    static let statuses = [200, 400, 401, 503]
    /// What the refresh presents: long enough that a reason echoing it is seen.
    static let presented = Credentials(
        accessToken: "fuzz-presented-access-0123456789", refreshToken: "fuzz-presented-refresh-0123456789")

    /// The plugins and options an answer is read by.
    static let plugins: [(name: String, options: [String: PluginOption])] = [
        ("oauth2", ["token-url": .string("https://auth.example.com/token"), "client-id": .string("fuzz")]),
        (
            "http",
            [
                "url": .string("https://auth.example.com/refresh"), "token": .string("body.data.token"),
                "refresh-token": .string("body.data.refresh"), "expires-in": .string("body.data.ttl"),
            ]
        ),
    ]

    static func exercise(_ body: Data) {
        // What no reason may show: the answer's token texts, wherever they are (the plugins' own
        // definition of which fields hold a token), and the credentials presented.
        let secrets = TokenAnswer.tokenTexts(in: body) + [presented.accessToken, presented.refreshToken ?? ""]
        for status in statuses {
            let answer = HTTPResponse(status: status, headers: ["Content-Type": "application/json"], body: body)
            for (name, options) in plugins {
                let transport = FixedAnswer(answer)
                guard let plugin = try? PluginRegistry().makeRefresh(name, options: options, transport: transport)
                else {
                    FuzzHarness.check(false, "the built-in '\(name)' refresh plugin could not be made")
                    return
                }
                switch run(plugin, transport: transport) {
                case .success(let credentials):
                    FuzzHarness.check(!credentials.accessToken.isEmpty, "\(name): a refresh gave an empty access token")
                case .failure(let reason):
                    // A token whose text is a standard error code (`invalid_grant`) is the one
                    // server text a reason repeats: as the code, never as the token.
                    for secret in secrets where secret.count >= 8 && !TokenEndpoint.knownErrorCodes.contains(secret) {
                        FuzzHarness.check(
                            !reason.contains(secret), "\(name): a failure's reason shows a token: \(reason)")
                    }
                    FuzzHarness.check(
                        !reason.unicodeScalars.contains { $0.value < 0x20 || $0.value == 0x7F },
                        "\(name): a failure's reason holds a control character: \(reason.debugDescription)")
                }
            }
        }
    }

    enum Outcome: Sendable {
        case success(Credentials)
        case failure(String)
    }

    /// Runs one refresh to its end on the calling thread, on a virtual clock (a
    /// ``SimulationScheduler``): never on the concurrency pool, which the tests that replay inputs
    /// run on (waiting there for a task on the pool deadlocked two cores).
    static func run(_ plugin: any RefreshPlugin, transport: any Transport) -> Outcome {
        let scheduler = SimulationScheduler(clock: VirtualClock(), externalWorkGracePeriod: .zero)
        do {
            let credentials = try scheduler.run {
                try await plugin.refresh(
                    RefreshContext(credentials: presented, transport: transport, clock: scheduler.clock, reason: "fuzz")
                )
            }
            return .success(credentials)
        } catch let failure as RefreshFailure {
            return .failure(failure.reason)
        } catch {
            return .failure("\(error)")
        }
    }
}

/// A token endpoint that answers every call with the same response.
struct FixedAnswer: Transport {
    let answer: HTTPResponse

    init(_ answer: HTTPResponse) { self.answer = answer }

    func send(_ request: HTTPRequest) async throws -> HTTPResponse { answer }
}
