import Foundation

/// A `policy simulate` script (SPEC §5): who sends what when, what the server answers to each
/// attempt, what each refresh call does, and when the policy is swapped.
package struct SimulationScript: Sendable {
    package struct Response: Sendable {
        package var status = 200
        package var body = ""
        package var headers: [(String, String)] = []
        /// Overrides the script's `latency` for this answer.
        package var latency: Duration?
        /// The attempt fails with this class instead of answering.
        package var error: TransportErrorClass?
    }

    package struct Request: Sendable {
        package var id: String
        package var at: Duration = .zero
        package var method = "GET"
        package var path = "/"
        package var headers: [(String, String)] = []
        package var body: String?
        package var responses: [Response] = []
    }

    package struct RefreshStep: Sendable {
        /// `ok`: new tokens. `fail`: a failed call, definitive unless its `status`/`body` answer
        /// is transient (a 5xx, 429, `temporarily_unavailable`; see `RefreshFailure.kind(of:)`)
        /// and no rule makes it definitive. `transient`: no answer at all (a reset connection).
        package enum Result: String, Sendable, CaseIterable { case ok, fail, transient }
        package var after: Duration = .milliseconds(100)
        package var result: Result = .ok
        /// A failed refresh's HTTP answer, classified by the policy's rules. With `ok`, `body` is
        /// the token endpoint's 2xx answer (status 200 unless given), read as the oauth2 plugin
        /// reads one: `{"access_token": …, "expires_in": …, "refresh_token": …, "token_type": …}`.
        package var status: Int?
        package var body: String?
        /// The new token's lifetime.
        package var expiresIn: Duration?
        /// The wait a failed call asks for (`Retry-After`).
        package var retryAfter: Duration?

        package init() {}
    }

    package struct Reload: Sendable {
        package var at: Duration
        package var policy: String
        package var range: SourceRange
    }

    /// A server that checks tokens (`tokens:`): it accepts the initial token (when `valid`), then
    /// only the newest token a refresh issued, until the next `expire` time. An attempt signed with
    /// any other token gets `rejected` and does not use up one of its request's responses.
    package struct Tokens: Sendable {
        package enum Initial: String, Sendable, CaseIterable { case valid, expired }
        package var initial: Initial = .valid
        /// `{ status: 401 }` by default.
        package var rejected = Response(status: 401)
        /// Virtual times at which the token current then stops being accepted.
        package var expire: [Duration] = []
    }

    package var latency: Duration = .milliseconds(50)
    package var requests: [Request] = []
    /// Without `tokens:` the server answers whatever token signed an attempt.
    package var tokens: Tokens?
    package var refresh: [RefreshStep] = [RefreshStep()]
    package var reload: [Reload] = []
    /// Several processes on one coordinator (`processes:`), instead of `requests:`; `nil` for a
    /// one-process script.
    package var fleet: FleetScript?
    /// The most requests a script may send, `repeat` and aliases included.
    package static let maxRequests = 100_000
    /// The most `reload:` steps a script may have: 100.
    package static let maxReloads = 100
    /// The most different policy files its `reload:` steps may name: 8.
    package static let maxReloadFiles = 8
    /// The largest policy file a `reload:` step loads: 1 MiB (a larger one is refused, as a
    /// policy failing lint is).
    package static let maxReloadPolicyBytes = 1 << 20

    /// Seeds jitter; `1` by default, so runs repeat.
    package var seed: UInt64 = 1

    /// Parses and checks a script; every problem is a positioned diagnostic.
    package static func parse(_ bytes: [UInt8], file: String?) -> (SimulationScript?, [Diagnostic]) {
        parse(Policy.parse(bytes: bytes, limits: .default), file: file)
    }

    /// Checks an already parsed script.
    package static func parse(_ parsed: Policy.Parsed, file: String?) -> (SimulationScript?, [Diagnostic]) {
        var diagnostics = parsed.diagnostics
        var script: SimulationScript?
        if let root = parsed.root {
            var decoder = PolicyDecoder(catalog: PluginCatalog())
            script = decoder.script(root)
            diagnostics += decoder.diagnostics
            // A warning here: `simulate FILE` runs the script with FILE all the same.
            if var mistake = versionInsteadOfPolicyPath(root, file: nil) {
                mistake.severity = .warning
                diagnostics.append(mistake)
            }
        } else if !diagnostics.hasErrors {
            diagnostics.append(.error("empty-file", "the script is empty; it needs 'requests:'", at: .fileStart))
        }
        let sorted = diagnostics.sortedByPosition().map { d -> Diagnostic in
            var copy = d
            copy.file = file
            return copy
        }
        return (sorted.hasErrors ? nil : script, sorted)
    }

    /// Whether a parsed document is a script rather than a policy: a top-level `requests:` (or
    /// `processes:`, a fleet script), and no `policy:` or one that names a file (a policy's
    /// `policy:` is the schema number). Lint tells them apart this way.
    package static func isScript(_ root: YAMLNode?) -> Bool {
        guard let pairs = root?.pairs else { return false }
        guard pairs.contains(where: { $0.key.scalar == "requests" || $0.key.scalar == "processes" }) else {
            return false
        }
        guard let version = pairs.first(where: { $0.key.scalar == "policy" })?.value else { return true }
        return !(version.isPlainScalar && version.scalar.map(PolicyDecoder.isInteger) == true)
    }

    /// Why a document with `requests:` is not a script: its `policy:` is the schema version of a
    /// policy file (`policy: 1`), where a script names the policy file to run. `nil` when that is
    /// not the case. Positioned at the `policy:` value.
    package static func versionInsteadOfPolicyPath(_ root: YAMLNode?, file: String?) -> Diagnostic? {
        guard let pairs = root?.pairs,
            pairs.contains(where: { $0.key.scalar == "requests" || $0.key.scalar == "processes" }),
            let version = pairs.first(where: { $0.key.scalar == "policy" })?.value, !isScript(root)
        else { return nil }
        var diagnostic = Diagnostic.error(
            "invalid-value",
            "this file has 'requests:' like a simulation script, but 'policy: \(version.scalar ?? "")' is a policy "
                + "file's schema version; in a script, 'policy:' names the policy file to run, like "
                + "policy: ../policies/default.yaml (or leave it out and pass the policy on the command line)",
            at: version.range)
        diagnostic.file = file
        return diagnostic
    }

    /// ``isScript(_:)`` on raw bytes (parses them).
    package static func looksLikeScript(_ bytes: [UInt8]) -> Bool {
        isScript(Policy.parse(bytes: bytes, limits: .default).root)
    }
}

extension PolicyDecoder {
    mutating func script(_ root: YAMLNode) -> SimulationScript? {
        guard
            let fields = mappingFields(
                root, "a simulation script",
                allowed: ["latency", "requests", "refresh", "reload", "seed", "tokens"]
                    + SimulationExpectations.scriptKeys + FleetScript.keys)
        else { return nil }
        var script = SimulationScript()
        if let latency = fields.first(where: { $0.key == "latency" }) {
            script.latency = duration(latency.value, "latency").flatMap { $0 } ?? script.latency
        }
        if let seed = fields.first(where: { $0.key == "seed" }),
            let value = integer(seed.value, "seed", in: 0...Int.max)
        {
            script.seed = UInt64(value)
        }
        let processes = fields.first(where: { $0.key == "processes" })
        let events = fields.first(where: { $0.key == "events" })
        if let processes {
            if let requests = fields.first(where: { $0.key == "requests" }) {
                report(
                    .error(
                        "invalid-value",
                        "a fleet script lists each process's requests under its 'processes:' entry, "
                            + "not in a top-level 'requests:'", at: requests.keyNode.range))
            }
            if let reload = fields.first(where: { $0.key == "reload" }) {
                report(.error("invalid-value", "a fleet script cannot 'reload:' yet", at: reload.keyNode.range))
            }
            var total = 0
            script.fleet = fleet(processes: processes.value, events: events?.value, totalRequests: &total)
        } else if let events {
            report(
                .error(
                    "invalid-value", "'events:' happen to a fleet: declare its 'processes:' (docs/commands.md)",
                    at: events.keyNode.range))
        }
        guard let requestsField = fields.first(where: { $0.key == "requests" }) else {
            if processes == nil {
                report(
                    .error("missing-key", "a script needs 'requests:', the list of requests to send", at: root.range))
                return nil
            }
            if let refresh = fields.first(where: { $0.key == "refresh" }) {
                let steps = (list(refresh.value, "refresh") ?? []).compactMap { refreshStep($0) }
                if !steps.isEmpty { script.refresh = steps }
            }
            if let tokens = fields.first(where: { $0.key == "tokens" }) {
                script.tokens = scriptTokens(tokens.value)
            }
            return script
        }
        var ids = Set<String>()
        for item in requestsField.value.items ?? [] {
            guard let expanded = scriptRequest(item) else { continue }
            // `repeat` and aliases multiply; the whole script is bounded, not each request.
            if script.requests.count + expanded.count > SimulationScript.maxRequests {
                report(
                    .error(
                        "too-many-requests",
                        "the script sends more than \(SimulationScript.maxRequests) requests; simulate fewer",
                        at: item.range))
                return nil
            }
            for request in expanded {
                if !ids.insert(request.id).inserted {
                    report(
                        .error(
                            "duplicate-id", "request id '\(request.id.truncatedForMessage)' is used twice",
                            at: item.range))
                }
                script.requests.append(request)
            }
        }
        if requestsField.value.items == nil {
            report(
                .error(
                    "invalid-type", "'requests' must be a list, not \(requestsField.value.kindDescription)",
                    at: requestsField.value.range))
        }
        if let refresh = fields.first(where: { $0.key == "refresh" }) {
            let steps = (list(refresh.value, "refresh") ?? []).compactMap { refreshStep($0) }
            if !steps.isEmpty { script.refresh = steps }
        }
        if let tokens = fields.first(where: { $0.key == "tokens" }) {
            script.tokens = scriptTokens(tokens.value)
        }
        if let reload = fields.first(where: { $0.key == "reload" }) {
            for item in list(reload.value, "reload") ?? [] {
                guard let stepFields = mappingFields(item, "a reload step", allowed: ["at", "policy"]) else { continue }
                var at: Duration?
                var policy: String?
                for (key, _, value) in stepFields {
                    if key == "at" { at = duration(value, key).flatMap { $0 } }
                    if key == "policy" { policy = string(value, key) }
                }
                guard let at, let policy else {
                    report(.error("missing-key", "a reload step needs 'at:' and 'policy:'", at: item.range))
                    continue
                }
                // Each reload compiles a policy: bounded in count and in distinct files (each file
                // is compiled once), so a script cannot buy minutes of work.
                if script.reload.count == SimulationScript.maxReloads {
                    report(
                        .error(
                            "too-many-reloads",
                            "the script reloads more than \(SimulationScript.maxReloads) times; reload less often",
                            at: item.range))
                    break
                }
                let files = Set(script.reload.map(\.policy))
                if !files.contains(policy), files.count == SimulationScript.maxReloadFiles {
                    report(
                        .error(
                            "too-many-reloads",
                            "the script reloads more than \(SimulationScript.maxReloadFiles) different policy files",
                            at: item.range))
                    break
                }
                script.reload.append(.init(at: at, policy: policy, range: item.range))
            }
        }
        return script
    }

    mutating func scriptRequest(_ node: YAMLNode) -> [SimulationScript.Request]? {
        let keys =
            ["id", "at", "method", "path", "headers", "body", "repeat", "responses"]
            + SimulationExpectations.requestKeys
        guard let fields = mappingFields(node, "a request", allowed: keys) else { return nil }
        var request = SimulationScript.Request(id: "")
        var count = 1
        var hasRepeat = false
        for (key, _, value) in fields {
            switch key {
            case "id": request.id = string(value, key) ?? ""
            case "at": request.at = duration(value, key).flatMap { $0 } ?? .zero
            case "method": request.method = (string(value, key) ?? "GET").uppercased()
            case "path": request.path = string(value, key) ?? "/"
            case "headers": request.headers = stringPairs(value, key)
            case "body": request.body = bodyText(value, key)
            case "repeat":
                count = integer(value, key, in: 1...100_000) ?? 1
                hasRepeat = true
            case "responses":
                request.responses = (list(value, key) ?? []).compactMap { scriptResponse($0) }
            default: break
            }
        }
        if request.id.isEmpty {
            report(.error("missing-key", "a request needs an 'id:' to name it in events", at: node.range))
            return nil
        }
        if request.responses.isEmpty {
            report(
                .error(
                    "missing-key",
                    "request '\(request.id)' needs 'responses:', what the server answers to each attempt",
                    at: node.range))
            return nil
        }
        guard hasRepeat else { return [request] }
        return (1...count).map { index in
            var copy = request
            copy.id = "\(request.id)-\(index)"
            return copy
        }
    }

    /// A `body:` is the text sent or answered, as written. A body written as a YAML mapping
    /// (`body: { status: 1401 }`) is a common slip, so the error gives the JSON text to write.
    mutating func bodyText(_ node: YAMLNode, _ key: String) -> String? {
        guard node.pairs != nil || node.items != nil else { return string(node, key) }
        let json = Self.json(node, budget: 100)
        let example = json.map { "body: '\($0)'" } ?? "body: '{\"status\":1401}'"
        report(
            .error(
                "invalid-type",
                "'\(key)' is the body's text, not \(node.kindDescription); write its JSON in quotes: \(example)",
                at: node.range))
        return nil
    }

    /// A small YAML value as one line of JSON (plain numbers, booleans and null unquoted), or
    /// `nil` when it would be longer than `budget` characters.
    static func json(_ node: YAMLNode, budget: Int) -> String? {
        var out = ""
        func write(_ node: YAMLNode) -> Bool {
            guard out.count <= budget else { return false }
            if let pairs = node.pairs {
                out += "{"
                for (index, pair) in pairs.enumerated() {
                    if index > 0 { out += "," }
                    out += PolicyEvent.quote(pair.key.scalar ?? "")
                    out += ":"
                    guard write(pair.value) else { return false }
                }
                out += "}"
            } else if let items = node.items {
                out += "["
                for (index, item) in items.enumerated() {
                    if index > 0 { out += "," }
                    guard write(item) else { return false }
                }
                out += "]"
            } else if let text = node.scalar {
                let bare =
                    node.isPlainScalar
                    && (Double(text) != nil || ["true", "false", "null"].contains(text))
                out += bare ? text : PolicyEvent.quote(text)
            }
            return out.count <= budget
        }
        return write(node) ? out : nil
    }

    mutating func scriptResponse(_ node: YAMLNode) -> SimulationScript.Response? {
        guard
            let fields = mappingFields(node, "a response", allowed: ["status", "body", "headers", "latency", "error"])
        else { return nil }
        var response = SimulationScript.Response()
        for (key, _, value) in fields {
            switch key {
            case "status": response.status = integer(value, key, in: 100...599) ?? 200
            case "body": response.body = bodyText(value, key) ?? ""
            case "headers": response.headers = stringPairs(value, key)
            case "latency": response.latency = duration(value, key).flatMap { $0 }
            case "error": response.error = choice(value, key, TransportErrorClass.self)
            default: break
            }
        }
        return response
    }

    mutating func scriptTokens(_ node: YAMLNode) -> SimulationScript.Tokens? {
        guard let fields = mappingFields(node, "'tokens'", allowed: ["initial", "rejected", "expire"]) else {
            return nil
        }
        var tokens = SimulationScript.Tokens()
        for (key, _, value) in fields {
            switch key {
            case "initial": tokens.initial = choice(value, key, SimulationScript.Tokens.Initial.self) ?? tokens.initial
            case "rejected": tokens.rejected = scriptResponse(value) ?? tokens.rejected
            case "expire":
                tokens.expire = (list(value, key) ?? []).compactMap { duration($0, key).flatMap { $0 } }.sorted()
            default: break
            }
        }
        return tokens
    }

    mutating func refreshStep(_ node: YAMLNode) -> SimulationScript.RefreshStep? {
        guard
            let fields = mappingFields(
                node, "a refresh step", allowed: ["after", "result", "status", "body", "expires-in", "retry-after"])
        else { return nil }
        var step = SimulationScript.RefreshStep()
        for (key, _, value) in fields {
            switch key {
            case "after": step.after = duration(value, key).flatMap { $0 } ?? step.after
            case "result": step.result = choice(value, key, SimulationScript.RefreshStep.Result.self) ?? step.result
            case "status": step.status = integer(value, key, in: 100...599)
            case "body": step.body = bodyText(value, key)
            case "expires-in": step.expiresIn = duration(value, key).flatMap { $0 }
            case "retry-after": step.retryAfter = duration(value, key).flatMap { $0 }
            default: break
            }
        }
        return step
    }

    mutating func stringPairs(_ node: YAMLNode, _ key: String) -> [(String, String)] {
        guard let pairs = node.pairs else {
            report(.error("invalid-type", "'\(key)' must map names to values", at: node.range))
            return []
        }
        return pairs.compactMap { pair in
            guard let name = pair.key.scalar, let value = string(pair.value, name) else { return nil }
            return (name, value)
        }
    }
}
