// Service: ResponsePolicy wired into a long-running service, as a separate package depends on it.
//
//     swift run --package-path examples/service Service                 # checks the policy, sends nothing
//     swift run --package-path examples/service Service --export-plugin-schemas > plugins.yaml
//     BILLING_URL=https://api.example.com/invoices swift run --package-path examples/service Service
//
// What it shows: loading and reading diagnostics from Swift, `policy.warnings`, refusing to start
// when a plugin cannot be made, the host's own logout plugin, a PolicyObserver → swift-log bridge,
// exporting host plugin schemas for CI, and PolicyWatcher reloading on edit and on SIGHUP.

import Foundation
import ResponsePolicy
import ResponsePolicyURLSession

// MARK: - The swift-log bridge

// With swift-log, add `.package(url: "https://github.com/apple/swift-log.git", from: "1.5.0")`,
// `import Logging`, and delete the stand-in `Logger` at the end of this file: the bridge below is
// written against swift-log's API and stays as it is.

/// Hands every engine event to a swift-log `Logger`, at the event's level, with its fields as
/// metadata. Events carry no tokens, headers, bodies or queries.
// snippet: swift-log-bridge
struct SwiftLogObserver: PolicyObserver {
    let logger: Logger

    func observe(_ event: PolicyEvent) {
        let level: Logger.Level =
            switch event.level {
            case .debug: .debug
            case .info: .info
            case .warning: .warning
            case .error: .error
            }
        var metadata: Logger.Metadata = ["t": "\(event.time)"]
        for (key, value) in [
            ("request", event.request), ("method", event.method), ("path", event.path), ("rule", event.rule),
            ("status", event.status.map(String.init)), ("result", event.result?.rawValue), ("reason", event.reason),
        ] {
            if let value { metadata[key] = .string(value) }
        }
        logger.log(level: level, "\(event.kind.rawValue)", metadata: metadata)
    }
}
// snippet end

// MARK: - The host's logout

/// What the service does when the policy ends the session: here, drop cached data and alert.
/// The engine calls it once per logout, in the background; requests already fail fast.
struct HostSignOut: LogoutPlugin {
    let logger: Logger

    func logout(_ context: LogoutContext) async {
        logger.log(level: .critical, "session ended by '\(context.reason)'", metadata: nil)
    }
}

// MARK: - Start-up

let logger = Logger(label: "billing.http")
let arguments = Set(CommandLine.arguments.dropFirst())

var registry = PluginRegistry()
registry.register(logout: "host-signout", schema: PluginSchema([])) { _ in HostSignOut(logger: logger) }

if arguments.contains("--export-plugin-schemas") {
    // CI lints with the same schemas: `policy lint --plugins plugins.yaml policy.yaml`.
    print(registry.exportSchemas(), terminator: "")
    exit(0)
}

let policyURL = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
    .deletingLastPathComponent().appendingPathComponent("policy.yaml")

let policy: Policy
do {
    policy = try Policy.load(contentsOf: policyURL, plugins: registry.catalog)
} catch {
    // Every finding, positioned: `range.start` is what `policy lint --format json` calls line/column.
    for diagnostic in error.diagnostics where diagnostic.severity == .error {
        let start = diagnostic.range.start
        print("\(policyURL.path):\(start.line):\(start.column): \(diagnostic.message) [\(diagnostic.rule)]")
    }
    if error.diagnostics.isEmpty { print(error) }
    exit(1)
}
for warning in policy.warnings {
    print("warning: line \(warning.range.start.line): \(warning.message) [\(warning.rule)]")
}

var options = PolicyEngine.Options()
options.observers = [SwiftLogObserver(logger: logger)]

// Refuse to start when a plugin cannot be made (an unset variable, an unreadable secret file):
// better a failed deploy than a service whose first refresh fails.
let engine: PolicyEngine
do {
    engine = try PolicyEngine(
        checking: policy, transport: URLSessionTransport(timeout: .seconds(15)), plugins: registry, options: options)
} catch {
    for diagnostic in error.diagnostics { print("cannot start: \(diagnostic.message)") }
    // Here the example's secret file does not exist; a real service would exit(1).
    exit(arguments.contains("--strict") ? 1 : 0)
}

// Reload the policy when ops edit it (write a new file and rename it over the old one) or send
// SIGHUP. A file with errors, or whose plugins cannot be made, is refused; the running one stays.
let watcher = PolicyWatcher(engine: engine, url: policyURL)
watcher.start()

if let target = ProcessInfo.processInfo.environment["BILLING_URL"].flatMap(URL.init(string:)) {
    do {
        let response = try await engine.send(HTTPRequest(url: target))
        print("HTTP \(response.status)")
    } catch PolicyEngineError.loggedOut(let until, let reason) {
        // Name the type: `catch .loggedOut` compiles only while `send` is the block's only `try`.
        print("logged out until \(until): \(reason)")
    } catch {
        print("failed: \(error)")
    }
}
watcher.stop()

// MARK: - Stand-in for swift-log

/// The part of swift-log's `Logger` the bridge uses, so this example builds without fetching it.
/// Delete it when you depend on swift-log.
struct Logger: Sendable {
    enum Level: String, Sendable { case trace, debug, info, notice, warning, error, critical }

    enum MetadataValue: Sendable, ExpressibleByStringInterpolation, CustomStringConvertible {
        case string(String)
        init(stringLiteral value: String) { self = .string(value) }
        var description: String {
            switch self {
            case .string(let text): text
            }
        }
    }

    typealias Metadata = [String: MetadataValue]

    let label: String

    func log(level: Level, _ message: @autoclosure () -> String, metadata: @autoclosure () -> Metadata? = nil) {
        let fields = (metadata() ?? [:]).sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }
        print(([level.rawValue, label, message()] + fields).joined(separator: " "))
    }
}
