/// The fleet part of a simulation script (docs/commands.md, "Fleet scripts"): several processes,
/// each with its own requests and its own starting credentials, sharing one in-memory
/// coordination store and one token server on the one virtual clock, and the things that happen
/// to a fleet: a restart, a kill or a freeze (SIGSTOP), a store outage, pause or slow answers, a
/// store that forgets (a flush, an eviction, a restart with no persistence).
///
/// Why in the script format: a fleet's failures (a refresh token presented twice, a logout from
/// coordination trouble) come from timing between processes; a script pins that timing, so the
/// behaviour is shown and tested the same way every run.
///
/// ```yaml
/// policy: policy.yaml
/// tokens: { initial: valid, expire: [1s] }
/// refresh: [{ after: 100ms, result: ok, expires-in: 1h }]
/// processes:
///   - id: web
///     repeat: 4                     # web-1 … web-4
///     requests: [{ id: r, at: 1s, repeat: 20, responses: [{ status: 200 }], expect: delivered }]
/// events:
///   - { at: 900ms, store: down, for: 500ms }
/// expect:
///   summary: { token-calls: 1, reuses: 0, logouts: 0 }
/// ```
package struct FleetScript: Sendable {
    /// What a process starts with in its credentials file.
    package enum StartingCredentials: Sendable, Equatable {
        /// The pair refresh call n issued (`0`: the initial pair every fleet starts with).
        case pair(Int)
        /// The newest pair the token server has issued when the process starts.
        case latest
        /// No credentials at all.
        case none
    }

    package struct Process: Sendable {
        package var id: String
        package var start: Duration = .zero
        package var credentials: StartingCredentials = .pair(0)
        package var requests: [SimulationScript.Request] = []
        package var range: SourceRange

        package init(id: String, range: SourceRange) {
            self.id = id
            self.range = range
        }
    }

    package struct Event: Sendable {
        package enum Kind: Sendable, Equatable {
            /// Every call to the store answers `unavailable` (for `span`, or until `store: up`).
            case storeDown(span: Duration?)
            case storeUp
            /// Every call to the store waits (Redis `CLIENT PAUSE`) for `span`; a call's client gives up
            /// at `connect-timeout` (the call is then never run), a publication waits it out.
            case storePause(span: Duration)
            /// The store runs every call at once but answers `span` late: a client gives up at
            /// `connect-timeout`, after the store ran what it asked (a publication waits for it).
            case storeSlow(span: Duration)
            /// The store forgets: everything (FLUSHALL, `allkeys-*` eviction), or the keys with a time
            /// to live (`volatile-*` eviction: the cooldown, the `refresh.limit` grants).
            case storeForget(everything: Bool)
            /// The store restarts with no persistence: it forgets everything, every connection drops,
            /// and it is down for `span` (0 by default).
            case storeRestart(span: Duration)
            /// The process dies at once (`kill -9`): nothing it holds is released.
            case kill(target: Target)
            /// The process dies and a fresh one starts at once, joining the shared session.
            case restart(target: Target, credentials: StartingCredentials?)
            /// The process stops (SIGSTOP, a VM pause) for `span`, then goes on (SIGCONT): nothing it
            /// does runs meanwhile, and what it receives waits for it.
            case freeze(target: Target, span: Duration)
        }

        /// Which process an event hits.
        package enum Target: Sendable, Equatable {
            case process(String)
            /// Whichever process holds the refresh lease then.
            case leaseHolder
        }

        package var at: Duration
        package var kind: Kind
        package var range: SourceRange

        package init(at: Duration, kind: Kind, range: SourceRange) {
            self.at = at
            self.kind = kind
            self.range = range
        }
    }

    package var processes: [Process] = []
    package var events: [Event] = []

    package init() {}

    /// The most processes a fleet script may declare, `repeat` included: 64.
    package static let maxProcesses = 64
    /// The most events a fleet script may list: 1,000.
    package static let maxEvents = 1_000
    /// The top-level keys a fleet script has beyond a one-process script's.
    package static let keys = ["processes", "events"]
}

extension PolicyDecoder {
    /// Reads `processes:` and `events:`; every problem is a positioned diagnostic.
    mutating func fleet(processes node: YAMLNode, events: YAMLNode?, totalRequests: inout Int) -> FleetScript {
        var fleet = FleetScript()
        var ids = Set<String>()
        for item in list(node, "processes") ?? [] {
            for process in fleetProcess(item) {
                if fleet.processes.count == FleetScript.maxProcesses {
                    report(
                        .error(
                            "too-many-processes",
                            "the script declares more than \(FleetScript.maxProcesses) processes; simulate fewer",
                            at: item.range))
                    return fleet
                }
                if !ids.insert(process.id).inserted {
                    report(
                        .error(
                            "duplicate-id", "process id '\(process.id.truncatedForMessage)' is used twice",
                            at: item.range))
                }
                totalRequests += process.requests.count
                if totalRequests > SimulationScript.maxRequests {
                    report(
                        .error(
                            "too-many-requests",
                            "the script sends more than \(SimulationScript.maxRequests) requests; simulate fewer",
                            at: item.range))
                    return fleet
                }
                fleet.processes.append(process)
            }
        }
        if fleet.processes.isEmpty, node.items?.isEmpty == true {
            report(.error("missing-key", "'processes' needs at least one process", at: node.range))
        }
        guard let events else { return fleet }
        for item in list(events, "events") ?? [] {
            if fleet.events.count == FleetScript.maxEvents {
                report(
                    .error(
                        "too-many-events", "the script lists more than \(FleetScript.maxEvents) events",
                        at: item.range))
                break
            }
            if let event = fleetEvent(item, processes: fleet.processes) { fleet.events.append(event) }
        }
        return fleet
    }

    /// One `processes:` item: with `repeat: N`, N copies named `ID-1` … `ID-N`.
    mutating func fleetProcess(_ node: YAMLNode) -> [FleetScript.Process] {
        let allowed = ["id", "start", "credentials", "repeat", "requests", "expect"]
        guard let fields = mappingFields(node, "a process", allowed: allowed) else { return [] }
        var process = FleetScript.Process(id: "", range: node.range)
        var copies: Int?
        var requestsNode: YAMLNode?
        for (key, _, value) in fields {
            switch key {
            case "id":
                process.id = string(value, key) ?? ""
                if process.id.contains("/") {
                    report(
                        .error(
                            "invalid-value",
                            "a process id cannot contain '/': events name a request as 'process/request'",
                            at: value.range))
                }
            case "start": process.start = duration(value, key).flatMap { $0 } ?? .zero
            case "credentials": process.credentials = startingCredentials(value, key) ?? process.credentials
            case "repeat": copies = integer(value, key, in: 1...FleetScript.maxProcesses)
            case "requests": requestsNode = value
            default: break
            }
        }
        if process.id.isEmpty {
            report(.error("missing-key", "a process needs an 'id:' to name it in events", at: node.range))
            return []
        }
        guard let requestsNode else {
            report(
                .error(
                    "missing-key", "process '\(process.id)' needs 'requests:', the requests it sends", at: node.range)
            )
            return []
        }
        var requestIds = Set<String>()
        for item in list(requestsNode, "requests") ?? [] {
            guard let expanded = scriptRequest(item) else { continue }
            if process.requests.count + expanded.count > SimulationScript.maxRequests {
                report(
                    .error(
                        "too-many-requests",
                        "the script sends more than \(SimulationScript.maxRequests) requests; simulate fewer",
                        at: item.range))
                return []
            }
            for request in expanded {
                if !requestIds.insert(request.id).inserted {
                    report(
                        .error(
                            "duplicate-id",
                            "request id '\(request.id.truncatedForMessage)' is used twice in process '\(process.id)'",
                            at: item.range))
                }
                if request.at < process.start {
                    report(
                        .error(
                            "invalid-value",
                            "request '\(request.id)' is sent at \(request.at.policyText), before process "
                                + "'\(process.id)' starts at \(process.start.policyText)",
                            at: item.range))
                }
            }
            process.requests += expanded
        }
        guard let copies else { return [process] }
        return (1...copies).map { index in
            var copy = process
            copy.id = "\(process.id)-\(index)"
            return copy
        }
    }

    /// `initial` (the pair every fleet starts with), `latest`, `none`, or the number of the
    /// refresh call whose pair the credentials file holds.
    mutating func startingCredentials(_ node: YAMLNode, _ key: String) -> FleetScript.StartingCredentials? {
        if node.isPlainScalar, let text = node.scalar, PolicyDecoder.isInteger(text) {
            return integer(node, key, in: 0...SimulationScript.maxRequests).map { .pair($0) }
        }
        guard let text = string(node, key) else { return nil }
        switch text {
        case "initial": return .pair(0)
        case "latest": return .latest
        case "none": return FleetScript.StartingCredentials.none
        default:
            let hint = Suggestion.closest(to: text, in: ["initial", "latest", "none"]).map {
                "did you mean '\($0)'? or "
            }
            report(
                .error(
                    "invalid-value",
                    "'\(key)' cannot be '\(text.truncatedForMessage)'; \(hint ?? "")use 'initial', 'latest', 'none' "
                        + "or the number of the refresh call whose pair the credentials file holds", at: node.range))
            return nil
        }
    }

    /// One `events:` item: `{ at, store: down | up | pause | slow | flush | evict | restart, for }`,
    /// `{ at, kill: ID | lease-holder }`, `{ at, restart: ID | lease-holder, credentials }` or
    /// `{ at, freeze: ID | lease-holder, for }`.
    mutating func fleetEvent(_ node: YAMLNode, processes: [FleetScript.Process]) -> FleetScript.Event? {
        let allowed = ["at", "store", "for", "kill", "restart", "credentials", "freeze"]
        guard let fields = mappingFields(node, "a fleet event", allowed: allowed) else { return nil }
        var at: Duration?
        var span: Duration?
        var spanNode: YAMLNode?
        var credentials: FleetScript.StartingCredentials?
        var credentialsNode: YAMLNode?
        var kinds: [(String, YAMLNode)] = []
        for (key, _, value) in fields {
            switch key {
            case "at": at = duration(value, key).flatMap { $0 }
            case "for":
                span = duration(value, key).flatMap { $0 }
                spanNode = value
            case "credentials":
                credentials = startingCredentials(value, key)
                credentialsNode = value
            default: kinds.append((key, value))
            }
        }
        guard let at else {
            report(.error("missing-key", "a fleet event needs 'at:', when it happens", at: node.range))
            return nil
        }
        guard kinds.count == 1, let (what, value) = kinds.first else {
            report(
                .error(
                    kinds.isEmpty ? "missing-key" : "invalid-value",
                    "a fleet event does one thing: 'store:', 'kill:', 'restart:' or 'freeze:'", at: node.range))
            return nil
        }
        if let credentialsNode, what != "restart" {
            report(.error("invalid-value", "'credentials' goes with 'restart:' only", at: credentialsNode.range))
        }
        if let spanNode, what != "store", what != "freeze" {
            report(.error("invalid-value", "'for' goes with 'store:' and 'freeze:' only", at: spanNode.range))
        }
        func target(_ value: YAMLNode, _ key: String) -> FleetScript.Event.Target? {
            guard let name = string(value, key) else { return nil }
            if name == "lease-holder" { return .leaseHolder }
            guard processes.contains(where: { $0.id == name }) else {
                report(
                    Self.unknownValue(
                        name, of: key, among: processes.map(\.id) + ["lease-holder"], at: value.range))
                return nil
            }
            return .process(name)
        }
        let kind: FleetScript.Event.Kind
        switch what {
        case "store":
            guard let state = string(value, what) else { return nil }
            switch state {
            case "down": kind = .storeDown(span: span)
            case "up", "flush", "evict":
                if let spanNode {
                    report(
                        .error(
                            "invalid-value", "'for' goes with 'store: down', 'pause', 'slow' or 'restart'",
                            at: spanNode.range))
                }
                kind = state == "up" ? .storeUp : .storeForget(everything: state == "flush")
            case "pause", "slow":
                guard let span else {
                    let what = state == "pause" ? "how long calls wait" : "how late the store answers"
                    report(.error("missing-key", "'store: \(state)' needs 'for:', \(what)", at: node.range))
                    return nil
                }
                kind = state == "pause" ? .storePause(span: span) : .storeSlow(span: span)
            case "restart":
                kind = .storeRestart(span: span ?? .zero)
            default:
                report(
                    Self.unknownValue(
                        state, of: what, among: ["down", "up", "pause", "slow", "flush", "evict", "restart"],
                        at: value.range))
                return nil
            }
        case "kill":
            guard let target = target(value, what) else { return nil }
            kind = .kill(target: target)
        case "freeze":
            guard let target = target(value, what) else { return nil }
            guard let span else {
                report(.error("missing-key", "'freeze:' needs 'for:', how long the process is stopped", at: node.range))
                return nil
            }
            kind = .freeze(target: target, span: span)
        default:
            guard let target = target(value, what) else { return nil }
            kind = .restart(target: target, credentials: credentials)
        }
        return FleetScript.Event(at: at, kind: kind, range: node.range)
    }
}
