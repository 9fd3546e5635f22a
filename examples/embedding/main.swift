// embedding-example: ResponsePolicy embedded in a service.
//
//     swift run embedding-example                       # print what it would do, send nothing
//     swift run embedding-example https://api.example.com/profile
//     swift run embedding-example --policy my.yaml https://api.example.com/profile
//     swift run embedding-example --export-plugin-schemas > examples/embedding/plugins.yaml
//
// What it shows:
//   1. a refresh plugin written in Swift by the host (`my-sso`), registered by name with an option
//      schema, so the policy file can say `refresh: { use: my-sso, with: { realm: staff } }`;
//   2. the policy loaded from a YAML file at run time (ops change it without a rebuild);
//   3. requests sent through the engine and URLSessionTransport, with the engine's events observed.

import Foundation
import ResponsePolicy
import ResponsePolicyURLSession

// MARK: - The host's SSO client and its refresh plugin

/// Stands in for your single-sign-on SDK. A real one would call your identity provider; this one
/// mints numbered demo tokens so the example runs anywhere.
actor DemoSSOClient {
    private var issued = 0

    /// A new access token for `realm` and its lifetime in seconds.
    func newAccessToken(realm: String, refreshToken: String?) async throws -> (token: String, lifetime: TimeInterval) {
        try await Task.sleep(for: .milliseconds(50))  // the round trip to the identity provider
        issued += 1
        return ("\(realm)-demo-token-\(issued)", 900)
    }
}

/// The `my-sso` refresh plugin: asks the host's SSO client for a new token.
///
/// Host plugins are plain Swift values. The engine calls `refresh` at most once at a time (single
/// flight), cancels it after `refresh.timeout`, and turns a thrown `RefreshFailure` into the
/// policy's `on-failure` action. Never put a token into a failure's reason.
struct MySSORefresh: RefreshPlugin {
    let realm: String
    let sso: DemoSSOClient

    func refresh(_ context: RefreshContext) async throws -> Credentials {
        do {
            let (token, lifetime) = try await sso.newAccessToken(
                realm: realm, refreshToken: context.credentials?.refreshToken)
            return Credentials(
                accessToken: token, refreshToken: context.credentials?.refreshToken,
                expiresAt: context.clock.date.addingTimeInterval(lifetime))
        } catch is CancellationError {
            throw CancellationError()
        } catch {
            throw RefreshFailure("the SSO client failed (\(type(of: error)))")
        }
    }
}

/// Prints the engine's events; events carry no tokens, headers or bodies.
struct PrintingObserver: PolicyObserver {
    func observe(_ event: PolicyEvent) {
        print("  event \(event.jsonLine)")
    }
}

// MARK: - Command line

var arguments = Array(CommandLine.arguments.dropFirst())
var policyPath = "examples/embedding/policy.yaml"
if let index = arguments.firstIndex(of: "--policy"), index + 1 < arguments.count {
    policyPath = arguments[index + 1]
    arguments.removeSubrange(index...(index + 1))
} else if !FileManager.default.fileExists(atPath: policyPath) {
    // Run from elsewhere than the repository root: use the file next to this source.
    policyPath = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("policy.yaml").path
}
let target = arguments.first.flatMap { URL(string: $0) }

// MARK: - Registry, policy, engine

let sso = DemoSSOClient()
var registry = PluginRegistry()
registry.register(
    refresh: "my-sso",
    schema: PluginSchema([.init("realm", .string, required: true, "the SSO realm to get tokens for")])
) { configuration in
    guard let realm = configuration.string("realm") else {
        throw PluginError(kind: .refresh, name: configuration.name, reason: "the option 'realm' is missing")
    }
    return MySSORefresh(realm: realm, sso: sso)
}

if arguments.contains("--export-plugin-schemas") {
    // Committed as examples/embedding/plugins.yaml, beside the policy, where `policy lint
    // examples/` finds it (CI checks the two agree).
    print(registry.exportSchemas(), terminator: "")
    exit(0)
}

let policy: Policy
do {
    // Passing the registry's catalog makes `use: my-sso` and its options valid for lint.
    policy = try Policy.load(contentsOf: URL(fileURLWithPath: policyPath), plugins: registry.catalog)
} catch {
    // The description lists the file's errors with their lines and columns.
    FileHandle.standardError.write(Data("embedding-example: \(error)\n".utf8))
    exit(1)
}

print(
    "policy '\(policy.name)' from \(policyPath): \(policy.rules.count) rules, "
        + "refresh by '\(policy.refresh.plugin?.name ?? "none")'"
)
guard let target else {
    print("no URL given: would send 3 GET requests through URLSessionTransport, signed with the token from 'my-sso'")
    print("usage: embedding-example [--policy FILE] URL")
    exit(0)
}

var options = PolicyEngine.Options()
options.observers = [PrintingObserver()]
// Start with a token that expired a minute ago, so `refresh.ahead` fetches a fresh one from `my-sso`
// before the first request goes out.
let engine = PolicyEngine(
    policy: policy, transport: URLSessionTransport(timeout: .seconds(15)), plugins: registry,
    credentials: MemoryCredentialStore(
        Credentials(accessToken: "expired", refreshToken: "demo-refresh", expiresAt: Date().addingTimeInterval(-60))),
    options: options)

// MARK: - Sending

let outcomes = await withTaskGroup(of: (line: String, delivered: Bool).self) { group in
    for index in 1...3 {
        group.addTask {
            do {
                let response = try await engine.send(HTTPRequest(url: target, id: "demo-\(index)"))
                return ("demo-\(index): delivered HTTP \(response.status), \(response.body.count) bytes", true)
            } catch {
                // One typed error per way a request can end: logged out, retries exhausted, …
                return ("demo-\(index): \(error)", false)
            }
        }
    }
    var outcomes: [(line: String, delivered: Bool)] = []
    for await outcome in group { outcomes.append(outcome) }
    return outcomes.sorted { $0.line < $1.line }
}
for outcome in outcomes { print(outcome.line) }
exit(outcomes.allSatisfy(\.delivered) ? 0 : 1)
