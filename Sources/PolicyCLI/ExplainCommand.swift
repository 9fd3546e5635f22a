import Foundation
import ResponsePolicy

/// `policy explain FILE`: the policy in plain sentences, with the worst case.
enum ExplainCommand {
    static let plugin = Option.plugin()

    static let spec = CommandSpec(
        name: "explain",
        summary: "Describe what a policy does in plain sentences, with the worst-case attempts and total wait.",
        arguments: [.init(name: "FILE", help: "The policy file.")],
        options: [plugin.declaration],
        exitCodes: policyFileExitCodes(done: "the explanation was printed"))

    static func run(_ arguments: ParsedArguments, output: CommandOutput) throws(UsageError) -> Int32 {
        let path = try singleFile(arguments)
        let (loaded, code) = loadPolicy(path, catalog: try catalog(from: arguments[plugin]), output: output)
        guard let policy = loaded else { return code }
        // The terminal's width, 80 when the output is not a terminal (a pipe, a file, a CI log).
        let width = output.isTerminal ? TerminalText.terminalWidth() ?? 80 : 80
        output.stdout(PolicyExplainer.explain(policy, width: width))
        return ExitCode.success
    }
}

/// Writes a policy as sentences an ops engineer can check against what they meant.
package enum PolicyExplainer {
    /// The explanation, each line wrapped at `width` columns (`nil`: not wrapped): a list item's
    /// next lines hang under its text, a paragraph's keep its indentation, and a word longer than
    /// the line (a URL) stands alone on its line.
    package static func explain(_ policy: Policy, width: Int? = 80) -> String {
        let text = explainUnwrapped(policy)
        guard let width else { return text }
        // On UTF-8 bytes (a column is a byte that is not a continuation byte): Characters made
        // wrapping 100,000 routes' explanation most of its time.
        var out: [UInt8] = []
        out.reserveCapacity(text.utf8.count + text.utf8.count / 16)
        var unwrapped = text
        unwrapped.withUTF8 { bytes in
            var start = 0
            while start < bytes.count {
                var end = start
                while end < bytes.count, bytes[end] != 0x0A { end += 1 }
                wrap(UnsafeBufferPointer(rebasing: bytes[start..<end]), width: width, into: &out)
                start = end + 1
            }
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// Appends the UTF-8 `line` to `out` as lines of at most `width` columns, each with a newline.
    static func wrap(_ line: UnsafeBufferPointer<UInt8>, width: Int, into out: inout [UInt8]) {
        @inline(__always) func columns(_ range: Range<Int>) -> Int {
            var count = 0
            for index in range where line[index] & 0xC0 != 0x80 { count += 1 }
            return count
        }
        guard columns(0..<line.count) > width else {
            out.append(contentsOf: line)
            out.append(0x0A)
            return
        }
        var indent = 0
        while indent < line.count, line[indent] == 0x20 { indent += 1 }
        var hanging = indent
        // `1. name: …`: the next lines start under the text, after the number.
        var digits = indent
        while digits < line.count, line[digits] >= 0x30, line[digits] <= 0x39 { digits += 1 }
        if digits > indent, digits + 1 < line.count, line[digits] == 0x2E, line[digits + 1] == 0x20 {
            hanging += digits - indent + 2
        }
        out.append(contentsOf: repeatElement(0x20, count: indent))
        var length = indent
        var lineStart = true
        var index = indent
        while index < line.count {
            while index < line.count, line[index] == 0x20 { index += 1 }
            guard index < line.count else { break }
            var end = index
            while end < line.count, line[end] != 0x20 { end += 1 }
            let word = columns(index..<end)
            if !lineStart, length + 1 + word > width {
                out.append(0x0A)
                out.append(contentsOf: repeatElement(0x20, count: hanging))
                length = hanging
                lineStart = true
            }
            if !lineStart {
                out.append(0x20)
                length += 1
            }
            out.append(contentsOf: UnsafeBufferPointer(rebasing: line[index..<end]))
            length += word
            lineStart = false
            index = end
        }
        out.append(0x0A)
    }

    static func explainUnwrapped(_ policy: Policy) -> String {
        var out = "Policy '\(policy.name)'" + (policy.file.map { " (\($0))" } ?? "") + "\n"
        for scope in policy.graph.scopes {
            out += "\n"
            if let route = scope.route {
                out +=
                    "\(scope.summary.prefix(1).uppercased() + scope.summary.dropFirst()) (route at line \(route.range.start.line)):\n"
                if route.rules == nil {
                    out += "  They use the top-level rules with this route's settings.\n"
                } else if !policy.rules.isEmpty {
                    // A route's rules replace the top-level ones; say which it drops.
                    // Sets, not a scan of the route's rules per top-level rule (quadratic in rules).
                    let own = route.rules ?? []
                    let ownNames = Set(own.map(\.name))
                    let ownRules = Set(own.map { OwnRule(action: $0.action, when: $0.when) })
                    let dropped = policy.rules.filter { rule in
                        !ownNames.contains(rule.name)
                            && !ownRules.contains(OwnRule(action: rule.action, when: rule.when))
                    }
                    if !dropped.isEmpty {
                        out +=
                            "  Its own rules replace the top-level rules, so these do not apply here: "
                            + dropped.map { "'\($0.name)' (\($0.action.rawValue))" }.joined(separator: ", ") + ".\n"
                    }
                }
            } else {
                out += policy.graph.scopes.count > 1 ? "All other requests:\n" : "All requests:\n"
            }
            out += describe(scope).map { "  " + $0 + "\n" }.joined()
        }
        out += "\nDispatch (max-in-flight-per-host: \(policy.dispatch.maxInFlightPerHost)):\n  "
        out += dispatchSummary(policy.dispatch.maxInFlightPerHost) + "\n"
        if let shared = policy.coordinationSummary {
            out += "\nShared session (coordination: \(policy.coordination.name)):\n  \(shared)\n"
        }
        for warning in policy.warnings {
            out += "\nWarning (line \(warning.range.start.line)): \(warning.message)."
        }
        if !policy.warnings.isEmpty { out += "\n" }
        return out
    }

    /// What `dispatch.max-in-flight-per-host` does, in one paragraph.
    static func dispatchSummary(_ limit: DispatchSettings.Limit) -> String {
        let held =
            "the others wait in the engine in arrival order (those sent before first), are signed when they leave, "
            + "wait for a refresh in flight, and end at once on a logout."
        switch limit {
        case .auto:
            return "At most as many requests per host are on the wire as the transport has connections per host "
                + "(URLSessionTransport: its configuration's httpMaximumConnectionsPerHost, 6 by default; "
                + "a transport that does not say is not limited); " + held
        case .unlimited:
            return "Every request goes out as soon as it is made; requests beyond the transport's connections "
                + "per host wait inside the transport, where they cannot be held for a refresh, re-signed "
                + "or cancelled by a logout."
        case .perHost(let count):
            return "At most \(count) request\(count == 1 ? "" : "s") per host \(count == 1 ? "is" : "are") on the "
                + "wire; " + held
        }
    }

    /// Where tokens come from: the plugin, and for the built-in network plugins the grant, the
    /// endpoint (without query or credentials), client authentication and whether the first
    /// request waits for a sign-in. Never a secret: only the names of the variables or files.
    static func credentialSource(_ refresh: RefreshSettings) -> String? {
        guard let plugin = refresh.plugin else { return nil }
        let options = plugin.options
        func option(_ key: String) -> String? { options[key]?.string }
        func endpoint(_ key: String) -> String {
            guard let text = option(key), let url = URL(string: text) else { return "its endpoint" }
            guard var parts = URLComponents(url: url, resolvingAgainstBaseURL: false) else { return "its endpoint" }
            (parts.query, parts.fragment, parts.user, parts.password) = (nil, nil, nil, nil)
            return parts.string ?? "its endpoint"
        }
        switch plugin.name {
        case "oauth2":
            let grant = option("grant") ?? "refresh_token"
            var text =
                "Credentials: the OAuth 2.0 \(grant) grant at \(endpoint("token-url")) as client '\(option("client-id") ?? "?")'"
            if let file = option("client-secret-file") {
                text += ", secret from the file '\(file)'"
            } else if let variable = option("client-secret-env") {
                text += ", secret from $\(variable)"
            }
            let hasSecret = option("client-secret-file") != nil || option("client-secret-env") != nil
            if hasSecret {
                let auth = option("client-auth") ?? "client_secret_basic"
                text += ", sent by \(auth)"
                if auth == "client_secret_basic" {
                    text +=
                        option("client-auth-encoding") == "raw"
                        ? " (raw, not form-encoded)" : " (form-encoded first, RFC 6749 §2.3.1)"
                }
            } else {
                text += " (a public client: no secret)"
            }
            text +=
                grant == "refresh_token"
                ? "; the stored refresh token is used, and a rotated one replaces it."
                : "; with nothing stored, the first request waits for a sign-in (one call however many start together)."
            return text
                + " Token requests say User-Agent '\(ResponsePolicyVersion.userAgent)' ('\(PolicyCommand.userAgent)' from policy fetch)."
        case "http":
            return "Credentials: POST to \(endpoint("url")), the new token read at '\(option("token") ?? "?")'."
        case "exec":
            return "Credentials: a credential command (exec) prints them"
                + (option("timeout").map { ", within \($0)" } ?? "") + "."
        default:
            return "Credentials: the host plugin '\(plugin.name)'."
        }
    }

    static func describe(_ scope: RuleGraph.Scope) -> [String] {
        var lines: [String] = []
        switch scope.classify {
        case .body(let path)?: lines.append("The business code is read from the JSON body at '\(path)'.")
        case .header(let name)?: lines.append("The business code is read from the '\(name)' header.")
        case .plugin(let plugin)?: lines.append("The business code is extracted by the plugin '\(plugin.name)'.")
        case nil: lines.append("Responses have no business code; rules look at status, headers and errors.")
        }
        lines.append("Requests are signed by '\(scope.authorize.name)'\(authorizeDetail(scope.authorize)).")
        if scope.rules.isEmpty {
            // Said of responses only: a refresh before sending (ahead of expiry, or to sign in) and
            // its failure's logout still apply, and are said below when the flow has them.
            lines.append(
                "There are no rules: every response is delivered as it is, and no response leads to a retry, a "
                    + "refresh or a logout.")
        } else {
            lines.append("Rules, first match wins:")
            for flow in scope.compiled {
                lines.append(
                    "  \(flow.index + 1). \(flow.rule.name): when \(condition(flow.rule.when)), \(action(flow, scope))."
                )
            }
            lines.append("Any other response is delivered; any other failed attempt fails the request.")
        }
        let reachable = scope.reachableActions
        // What the rules lead to, read off their compiled edges: the rest of `reachable` is the
        // scope's own refresh before sending and where its failure leads.
        let byRules = actionsReachedByRules(scope)
        if reachable.contains(.refresh) || scope.refresh.plugin != nil {
            if let source = credentialSource(scope.refresh) { lines.append(source) }
        }
        if reachable.contains(.refresh), !byRules.contains(.refresh), let failure = scope.beforeSendingFailure {
            let r = scope.refresh
            var text = "Before sending: "
            text +=
                r.ahead.map {
                    "a token expiring within \($0.policyText) (never sooner than half its lifetime as issued) is refreshed first, "
                        + "and so is a missing one (signing in); "
                } ?? "with no token stored, the request waits for a sign-in; "
            text += "one refresh at a time, shared with the other requests. When that refresh fails definitively, "
            text +=
                escalation(failure)
                + "; transient trouble past refresh.timeout (\(r.timeout.policyText)) fails the request."
            lines.append(text)
        }
        if byRules.contains(.refresh) {
            let r = scope.refresh
            var text = "Refresh: one refresh at a time (single flight) by '\(r.plugin?.name ?? "no plugin")'; "
            text += "requests that hit a trigger wait for it and are re-sent with the new token. "
            text +=
                "A request refused with an older token than the current one (a refresh or the fleet has replaced it) is re-sent with the current one at once, without refreshing and without counting against max-per-request, which counts the refreshes a request waited for. "
            if r.shareWindow > .zero {
                text +=
                    "Triggers on the current token within \(r.shareWindow.policyText) of a refresh are re-sent unchanged without refreshing (share-window, for token propagation delay); each counts against max-per-request. "
            }
            if let transient = r.transient {
                text +=
                    "Transient token-endpoint trouble (\(TokenAnswer.transientSummary)) is retried after \(transient.initial.policyText), doubling up to \(transient.maxDelay.policyText)"
                    + (transient.honorRetryAfter
                        ? ", or after the Retry-After the server asks for (obeyed in full, by every request: no token call before it ends)"
                        : "")
                    + ", within refresh.timeout (\(r.timeout.policyText)) while the waiting requests stay parked; trouble that outlasts it fails those requests and the session goes on. "
            } else {
                text +=
                    "Transient token-endpoint trouble (\(TokenAnswer.transientSummary)) fails the waiting requests at once (transient: none); the session goes on. "
            }
            text +=
                "A token call still out at refresh.timeout runs on for one more timeout, and a pair it brings is kept (no second call presents the same refresh token meanwhile). "
            text +=
                "Only a definitive answer (\(TokenAnswer.definitiveSummary), or an answer a refresh, fail or logout rule matches) is a failed refresh: then \(outcome(r.onFailure)), and that answer is given to every refresh of the same credentials for \(r.timeout.policyText) without asking again, four times longer for each further one (up to 1h). "
            text +=
                "A 2xx answer with an access token is a pair kept, whatever else is odd in it; a token that cannot be sent (control characters, over 16 KiB) or of a type the authorizer does not send fails the refresh, and its refresh token is kept. "
            if let limit = r.limit {
                text +=
                    "After \(limit.count) refreshes in \(limit.per.policyText) whose new tokens the server refused before accepting any (a loop), further refreshes fail the requests without a call until the window allows; the session goes on (refresh.limit never logs out). Healthy rotations, the initial token, failed refreshes and tokens adopted from other processes are never counted. "
            }
            if let ahead = r.ahead {
                text +=
                    "Tokens expiring within \(ahead.policyText), and never sooner than half their lifetime as issued, are refreshed before sending; a token the last refresh just issued is never refreshed ahead."
            }
            if r.holdNewRequests {
                text +=
                    " A request about to go out (a first attempt, a retry or a re-send) while a refresh is in flight waits for it (a `held` event) and is signed with the new token; when that refresh fails into a logout, it is never sent."
            }
            lines.append(text.trimmingCharacters(in: .whitespaces))
        }
        if reachable.contains(.logout) {
            let l = scope.logout
            lines.append(
                "Logout: \(l.cancelInFlight ? "every request in flight or waiting is cancelled (a response that has already arrived is still handled by its rule)" : "requests in flight finish"), "
                    + "the logout plugin '\(l.plugin.name)' is called once, and for \(l.cooldown.policyText) new requests fail at once "
                    + "without touching the network; refreshes and retries are suppressed.")
        }
        if reachable.contains(.retry) {
            let r = scope.retry
            // Which requests are retried, from the rules that retry: their own methods and key
            // when they set them (the section's, which no rule may use, said only when one does).
            var sets: [(methods: [String], key: String?)] = []
            for flow in scope.compiled where flow.canRetry {
                let set = (methods: flow.retry.methods, key: flow.retry.idempotencyKey)
                if !sets.contains(where: { $0.methods == set.methods && $0.key == set.key }) { sets.append(set) }
            }
            var text: String
            if sets.count > 1 {
                text = "Which requests are retried depends on the rule (each rule above says)."
            } else {
                let set = sets.first ?? (r.methods, r.idempotencyKey)
                text = "Retries apply to \(set.methods.joined(separator: ", ")) requests"
                if let key = set.key {
                    text += " and to any request carrying an '\(key)' header (kept the same on every attempt)"
                }
                text += "."
            }
            if let timeout = r.attemptTimeout {
                text +=
                    " Each attempt times out after \(timeout.policyText)."
                    + " The time counts from the moment the attempt leaves the engine: waiting for a dispatch slot"
                    + " or a refresh counts against the deadline only."
            }
            if let budget = r.budget {
                text +=
                    " Retries may add at most \(budget.min) + \(formatNumber(budget.ratio * 100))% of requests in a sliding 10s window; a retry the budget refuses goes where the rule's retries run out."
            }
            lines.append(text)
        }
        let worst = scope.worstCase
        var text = "Worst case: \(worst.attempts) attempt\(worst.attempts == 1 ? "" : "s")"
        var parts: [String] = []
        if worst.retries > 0 { parts.append("\(worst.retries) retr\(worst.retries == 1 ? "y" : "ies")") }
        if worst.refreshResends > 0 {
            parts.append("\(worst.refreshResends) re-send\(worst.refreshResends == 1 ? "" : "s") after a refresh")
        }
        if !parts.isEmpty { text += " (1 + " + parts.joined(separator: " + ") + ")" }
        if scope.compiled.contains(where: { $0.action == .refresh }) {
            // The generation rule's re-sends are not counted above: how many there are depends on how
            // many refreshes other requests make meanwhile, which only the deadline bounds. Any
            // refresh rule makes them, `max-per-request: 0` too (they do not count against it).
            // Nor is the re-send after a pair read past refresh.timeout (a frozen process:
            // `FlightResult.late`).
            text +=
                ", plus one re-send each time another request's refresh replaced the token an attempt"
                + " carried, or a refresh's answer was read past refresh.timeout (the deadline bounds those)"
        }
        if worst.retries > 0 {
            // Per retry: the longest wait of any rule that can retry that many times.
            let each = worst.waits.count > 1 ? " (" + worst.waits.map(\.policyText).joined(separator: " + ") + ")" : ""
            text += ", waiting at most \(worst.totalWait.policyText) in total\(each)"
        }
        if worst.heldWaits > 0 {
            text +=
                "; each attempt may first wait up to \(worst.heldWait.policyText) for a refresh (held while one is in flight, or refreshing before sending)"
        }
        if let total = worst.total {
            text += "; with every attempt and refresh timing out, \(total.policyText)"
        }
        if worst.honorsRetryAfter {
            if let stretched = worst.totalWithRetryAfter {
                text += " (\(stretched.policyText) if the server's Retry-After asks for the longest waits)"
            } else {
                text += " (without limit if the server's Retry-After asks for it: max-delay is none)"
            }
        }
        if let deadline = scope.retry.deadline {
            if let total = worst.total, total > deadline {
                text += "; the deadline of \(deadline.policyText) ends the request before that"
            } else {
                text += "; the deadline is \(deadline.policyText)"
            }
        }
        lines.append(text + ".")
        return lines
    }

    static func authorizeDetail(_ plugin: PluginReference) -> String {
        switch plugin.name {
        case "bearer": return " (Authorization: Bearer <token>)"
        case "header":
            return
                " (\(plugin.options["name"]?.string ?? "a header"): \(plugin.options["prefix"]?.string ?? "")<token>)"
        case "query": return " (query parameter \(plugin.options["name"]?.string ?? "?")=<token>)"
        default: return ""
        }
    }

    static func condition(_ when: Condition) -> String {
        var response: [String] = []
        let codes = (when.codes ?? []) + (when.codeRanges ?? []).map(\.description)
        if !codes.isEmpty { response.append("the business code is " + list(codes)) }
        if let statuses = when.statuses { response.append("the status is " + list(statuses.map(\.description))) }
        if let headers = when.headers {
            response += headers.map { "the '\($0.name)' header matches '\($0.value.pattern)'" }
        }
        var alternatives: [String] = []
        if !response.isEmpty { alternatives.append(response.joined(separator: " and ")) }
        if let errors = when.errors {
            alternatives.append(
                errors.contains(.any)
                    ? "the attempt fails without a response"
                    : "the attempt fails with a " + list(errors.map(\.rawValue)) + " error")
        }
        var text = alternatives.isEmpty ? "any response arrives" : alternatives.joined(separator: ", or ")
        if let methods = when.methods { text += " for " + list(methods) + " requests" }
        if let path = when.path { text += " to '\(path.pattern)'" }
        return text
    }

    /// What a rule does, read off its compiled flow: effective settings and escalation edges.
    static func action(_ flow: RuleGraph.CompiledRule, _ scope: RuleGraph.Scope) -> String {
        switch flow.action {
        case .deliver: return "deliver the response"
        case .fail: return "fail the request"
        case .logout:
            return "log out (cooldown \(flow.logout.cooldown.policyText))"
        case .refresh:
            let r = flow.refresh
            var text =
                "refresh the token and send the request again, at most \(r.maxPerRequest) time\(r.maxPerRequest == 1 ? "" : "s") per request; after that \(escalation(flow.onExhausted))"
            if let failure = flow.onFailure, failure.action != r.onFailure || r.onFailure != scope.refresh.onFailure {
                text += "; when the refresh fails, \(escalation(failure))"
            }
            return text
        case .retry:
            let r = flow.retry
            guard r.maxRetries > 0 else {
                return "do not retry (max-retries is 0); \(escalation(flow.onExhausted))"
            }
            guard flow.canRetry else {
                // Every method the rule sees is outside retry.methods and no key can help.
                let methods = flow.neverRetried
                return
                    "not retried: \(list(methods)) \(methods.count == 1 ? "is" : "are") not in retry.methods (and idempotency-key is none); \(escalation(flow.onExhausted))"
            }
            let waits = (1...min(r.maxRetries, 6)).map { r.longestWait(forRetry: $0).policyText }.joined(
                separator: ", ")
            var text =
                "retry up to \(r.maxRetries) time\(r.maxRetries == 1 ? "" : "s"), waiting \(r.jitter == .none ? "" : "at most ")\(waits)\(r.maxRetries > 6 ? ", …" : "")"
            text += " (\(r.backoff.rawValue)"
            if let cap = r.maxDelay {
                text += ", capped at \(cap.policyText)\(r.jitter == .none ? "" : " after jitter")"
            }
            text += r.jitter == .none ? ", no jitter" : ", jitter \(r.jitter)"
            if !r.honorRetryAfter {
                text += ", Retry-After ignored"
            } else if r.maxDelay == nil {
                // The engine honours what the policy says; say plainly what that allows.
                text += ", Retry-After honoured without limit: max-delay is none, so a server can make a request "
                text += "wait as long as it asks, an HTTP-date years away included"
            } else {
                text += ", Retry-After honoured"
            }
            if let budget = r.budget {
                text += ", within the retry budget of \(budget.min) + \(formatNumber(budget.ratio * 100))% per 10s"
            }
            text += ")"
            if let methods = flow.methods {
                let retried = methods.filter { r.methods.contains($0) }
                let others = methods.filter { !r.methods.contains($0) }
                if !others.isEmpty {
                    let key = r.idempotencyKey.map { " unless they carry an '\($0)' header" } ?? ""
                    text += "; \(list(others)) requests are not retried\(key)"
                    if retried.isEmpty, r.idempotencyKey != nil {
                        text = text.replacingOccurrences(of: "retry up to", with: "retry (only with the header) up to")
                    }
                }
            } else if flow.notRetryable != nil {
                // The methods this rule retries (its own, or the section's), named: "retry.methods"
                // said the section's when the rule had its own.
                text += "; a request whose method is not \(list(r.methods))"
                if let key = r.idempotencyKey { text += " and that carries no '\(key)' header" }
                text += " is not retried"
            }
            if flow.methods != nil,
                r.methods != scope.retry.methods || r.idempotencyKey != scope.retry.idempotencyKey
            {
                // The rule's own methods and key, where they differ from the section's.
                text += "; this rule retries \(list(r.methods)) requests"
                text +=
                    r.idempotencyKey.map { " and any request carrying an '\($0)' header" }
                    ?? " (idempotency-key none: no other request)"
            }
            text += "; when retries run out, \(escalation(flow.onExhausted))"
            return text
        }
    }

    /// A route's rule as the top-level rule it stands for: same action, same condition.
    struct OwnRule: Hashable {
        var action: ActionKind
        var when: Condition
    }

    /// The actions a scope's rules lead to, off their compiled edges: each rule's own action and
    /// where every escalation edge of it leads.
    static func actionsReachedByRules(_ scope: RuleGraph.Scope) -> Set<ActionKind> {
        var actions = Set<ActionKind>()
        for flow in scope.compiled {
            actions.insert(flow.action)
            for edge in [
                flow.onExhausted, flow.onFailure, flow.refreshAnswer, flow.onTransient, flow.budget,
                flow.notRetryable, flow.deadline,
            ] {
                if let edge { actions.insert(edge.action) }
            }
        }
        return actions
    }

    /// Where an escalation edge leads, in words.
    static func escalation(_ edge: RuleGraph.Escalation?) -> String {
        guard let edge else { return "the request fails" }
        switch edge.action {
        case .logout: return "the session is logged out (cooldown \(edge.logout.cooldown.policyText))"
        default: return outcome(edge.action)
        }
    }

    static func outcome(_ action: ActionKind) -> String {
        switch action {
        case .deliver: return "the last response is delivered"
        case .fail: return "the request fails"
        case .logout: return "the session is logged out"
        case .retry: return "it retries (this loops; see lint)"
        case .refresh: return "it refreshes (this loops; see lint)"
        }
    }

    static func list(_ items: [String]) -> String {
        guard items.count > 1, let last = items.last else { return items.first ?? "" }
        return items.dropLast().joined(separator: ", ") + " or " + last
    }
}
