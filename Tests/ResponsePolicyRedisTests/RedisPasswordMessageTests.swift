import Foundation
import ResponsePolicy
import ResponsePolicyRedis
import TestSupport
import Testing

/// Issue 32: a Redis with a password, reached without one, answered the first script call with
/// "ERR Protocol error: unauthenticated multibulk length"; the connection now says what is missing.
@Suite(.enabled(if: RedisServerFixture.isInstalled, "needs redis-server (apt-get install redis-server)"))
struct RedisPasswordMessageTests {
    @Test func aServerWithAPasswordReachedWithoutOneSaysSo() throws {
        let server = try RedisServerFixture(password: "fixture-password-1")
        let endpoint = try RedisEndpoint.parse(server.url).get()
        let expected = RedisError(
            message: "\(endpoint) asks for a password: name the environment variable that holds it with 'password-env'")
        #expect(throws: expected) { try RedisConnection(endpoint, password: nil, timeout: .seconds(2)) }
        // With the password it connects, and a wrong one is named as such.
        _ = try RedisConnection(endpoint, password: "fixture-password-1", timeout: .seconds(2))
        #expect(throws: RedisError.self) { try RedisConnection(endpoint, password: "wrong", timeout: .seconds(2)) }
    }

    @Test func theCoordinatorSaysWhatIsMissingAsAProblem() async throws {
        let server = try RedisServerFixture(password: "fixture-password-2")
        let coordinator = try RedisSessionCoordinator(.init(url: server.url, key: "pw", connectTimeout: .seconds(2)))
        defer { coordinator.stop() }
        let problems = Locked<[String]>([])
        _ = await coordinator.start(local: nil) { update in
            if case .problem(let reason) = update { problems.withLock { $0.append(reason) } }
        }
        let said = problems.withLock { $0 }
        #expect(said.contains { $0.contains("asks for a password") }, "\(said)")
        #expect(!said.contains { $0.contains("multibulk") }, "\(said)")
    }
}
