import Foundation

/// Counts what the engine does, from its events, and renders it for Prometheus: requests by
/// scope and outcome, attempts, retries by rule, refreshes by result with their duration and lag,
/// logouts by cause, time in cooldown, held and queued requests with their waits, problems and
/// reloads; with an engine attached, what it holds right now (requests in flight, the refresh and
/// its waiters, dispatch slots, the cooldown left) and the policy it runs.
///
/// Why: the events say what happened to one request; an operator watching a fleet needs rates and
/// distributions (how many refreshes a minute, how long requests wait behind them), which is what
/// Prometheus scrapes and Grafana draws. Names follow Prometheus' conventions: the
/// `response_policy_` prefix, base units (`_seconds`), `_total` on counters. Labels come from the
/// policy (scope ids, rule names) or from fixed sets (results, reasons); never a path, a token or
/// a free-text reason, so the number of series stays bounded. A label past 500 distinct values
/// (rule names gathered over many reloads) counts as `other`.
///
/// ```swift
/// let metrics = PolicyMetrics()
/// var options = PolicyEngine.Options()
/// options.observers = [metrics]
/// let engine = PolicyEngine(policy: policy, transport: URLSessionTransport(), options: options)
/// metrics.attach(engine)
/// // On GET /metrics: the format the scraper asks for.
/// let format = PolicyMetrics.Format(accept: acceptHeader)
/// let body = metrics.exposition(format)   // served with format.contentType
/// ```
///
/// Concurrency contract: ``observe(_:)`` is called by the engine on its request's path from any
/// thread; it takes one lock for a few counter updates and never blocks otherwise. ``exposition(_:)``
/// may be called from any thread at any time (a scrape): it copies the counters under the same
/// lock, reads the attached engine's gauges under the engine's lock, and renders outside both.
public final class PolicyMetrics: PolicyObserver, Sendable {
    /// The two formats a Prometheus server scrapes.
    public enum Format: String, Sendable, CaseIterable {
        /// The Prometheus text exposition format, version 0.0.4.
        case prometheus
        /// OpenMetrics 1.0 text.
        case openMetrics = "openmetrics"

        /// The `Content-Type` to serve it with.
        public var contentType: String {
            switch self {
            case .prometheus: return "text/plain; version=0.0.4; charset=utf-8"
            case .openMetrics: return "application/openmetrics-text; version=1.0.0; charset=utf-8"
            }
        }

        /// The format a scraper's `Accept` header asks for: OpenMetrics when it names
        /// `application/openmetrics-text`, Prometheus' text format otherwise (also for no header).
        public init(accept: String?) {
            self = accept?.lowercased().contains("application/openmetrics-text") == true ? .openMetrics : .prometheus
        }
    }

    /// The default histogram buckets, in seconds: 5 ms to 2 minutes, for waits and refreshes
    /// alike (a refresh takes tens of milliseconds, a `Retry-After` wait may take a minute).
    public static let defaultBuckets: [Double] = [
        0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120,
    ]

    /// The most distinct label sets one metric keeps (`500`); past it, new values count as `other`.
    package static let maxSeriesPerMetric = 500

    private let state: Locked<State>
    private let buckets: [Double]
    private let engine = Locked<Weak>(Weak())
    private let policy: Locked<PolicyInfo?>

    /// - Parameters:
    ///   - policy: the policy whose name the info metric shows until an engine is attached;
    ///     `nil` by default.
    ///   - buckets: the upper bounds of every histogram's buckets, in seconds;
    ///     ``defaultBuckets`` by default.
    public init(policy: Policy? = nil, buckets: [Double] = PolicyMetrics.defaultBuckets) {
        let bounds = Array(Set(buckets.filter { $0.isFinite && $0 > 0 })).sorted()
        self.buckets = bounds
        state = Locked(State(bounds: bounds.count))
        self.policy = Locked(policy.map(PolicyInfo.init))
    }

    /// Reads `engine`'s gauges and policy at each ``exposition(_:)`` (held weakly: the metrics
    /// do not keep an engine alive).
    public func attach(_ engine: PolicyEngine) {
        self.engine.withLock { $0.engine = engine }
    }

    // MARK: - Observing

    /// Counts the event; called by the engine for every event.
    public func observe(_ event: PolicyEvent) {
        state.withLock { state in state.observe(event, bounds: buckets) }
    }

    // MARK: - Rendering

    /// The metrics now, in `format` (Prometheus' text format by default).
    public func exposition(_ format: Format = .prometheus) -> String {
        MetricsExposition.render(families(), openMetrics: format == .openMetrics)
    }

    /// The metric families now: the counters and histograms, then the attached engine's gauges.
    package func families() -> [MetricsExposition.Family] {
        let counted = state.withLock { $0 }
        let attached = engine.withLock { $0.engine }
        let gauges = attached?.gauges
        let info = attached.map { PolicyInfo($0.policy) } ?? policy.withLock { $0 }
        return Self.families(counted, bounds: buckets, gauges: gauges, info: info)
    }

    struct Weak {
        weak var engine: PolicyEngine?
    }

    struct PolicyInfo: Sendable {
        var name: String

        init(_ policy: Policy) { name = policy.name }
    }
}

// MARK: - State

extension PolicyMetrics {
    /// The request results, in the order of ``State/requests``' counts.
    static let results: [PolicyEvent.Result] = [.delivered, .failed, .loggedOut, .cancelled]

    /// Two label values, the key of a two-label counter.
    struct Pair: Hashable, Sendable {
        var first: String
        var second: String
    }

    /// A histogram's counts per bucket (not cumulative; the last is past every bound).
    struct Histogram: Sendable {
        var counts: [UInt64]
        var sum = 0.0
        var count: UInt64 = 0

        init(bounds: Int) { counts = Array(repeating: 0, count: bounds + 1) }

        mutating func observe(_ value: Double, bounds: [Double]) {
            let value = max(0, value)
            var index = 0
            while index < bounds.count, value > bounds[index] { index += 1 }
            counts[index] += 1
            sum += value
            count += 1
        }

        func exposed(_ bounds: [Double]) -> MetricsExposition.Buckets {
            var running: UInt64 = 0
            var cumulative: [UInt64] = []
            for index in bounds.indices {
                running += counts[index]
                cumulative.append(running)
            }
            return MetricsExposition.Buckets(bounds: bounds, cumulative: cumulative, sum: sum, count: count)
        }
    }

    /// Everything counted, one value behind one lock.
    struct State: Sendable {
        /// Per scope: delivered, failed, logged out, cancelled.
        var requests: [String: [UInt64]] = [:]
        var failures: [Pair: UInt64] = [:]
        var attempts: UInt64 = 0
        var attemptErrors: [String: UInt64] = [:]
        var ruleMatches: [Pair: UInt64] = [:]
        var retries: [String: UInt64] = [:]
        var budgetRefusals: [String: UInt64] = [:]
        var escalations: [Pair: UInt64] = [:]
        var retryWait: Histogram
        var refreshes: [String: UInt64] = [:]
        var tokenCalls: UInt64 = 0
        var refreshRetries: UInt64 = 0
        var refreshRetryWait = 0.0
        var refreshDuration: Histogram
        var refreshLag: Histogram
        /// When each refresh in flight started, by the request that started it.
        var flightStarts: [String: Duration] = [:]
        /// The first refresh trigger since the last new token.
        var lagStart: Duration?
        var logouts: [Pair: UInt64] = [:]
        var cooldownSeconds = 0.0
        var held: UInt64 = 0
        var queued: UInt64 = 0
        var heldWait: Histogram
        var queuedWait: Histogram
        /// Requests held or queued now: since when, and which (held: true).
        var waiting: [String: (since: Duration, held: Bool)] = [:]
        var cancellations: UInt64 = 0
        var problems: [String: UInt64] = [:]
        var reloads: [String: UInt64] = [:]

        init(bounds: Int) {
            retryWait = Histogram(bounds: bounds)
            refreshDuration = Histogram(bounds: bounds)
            refreshLag = Histogram(bounds: bounds)
            heldWait = Histogram(bounds: bounds)
            queuedWait = Histogram(bounds: bounds)
        }

        mutating func observe(_ event: PolicyEvent, bounds: [Double]) {
            switch event.kind {
            case .send:
                attempts += 1
                if !waiting.isEmpty, let request = event.request { endWait(request, at: event.time, bounds) }
            case .response:
                if let error = event.error { Self.bump(&attemptErrors, error.rawValue) }
                guard let rule = event.rule else { return }
                if let action = event.action { Self.bump(&ruleMatches, Pair(first: rule, second: action.rawValue)) }
                if let reason = event.reason {
                    Self.bump(&escalations, Pair(first: rule, second: reason))
                    if reason == "budget" { Self.bump(&budgetRefusals, rule) }
                } else if event.action == .retry {
                    Self.bump(&retries, rule)
                }
            case .wait:
                if let delay = event.delay { retryWait.observe(delay.seconds, bounds: bounds) }
            case .outcome:
                let scope = event.scope ?? "default"
                if let result = event.result, let index = PolicyMetrics.results.firstIndex(of: result) {
                    if requests[scope] == nil, requests.count >= PolicyMetrics.maxSeriesPerMetric {
                        requests["other", default: [0, 0, 0, 0]][index] += 1
                    } else {
                        requests[scope, default: [0, 0, 0, 0]][index] += 1
                    }
                }
                if event.result == .failed {
                    Self.bump(&failures, Pair(first: scope, second: event.category?.rawValue ?? "other"))
                }
                if !waiting.isEmpty, let request = event.request { endWait(request, at: event.time, bounds) }
            case .refreshStart:
                if event.reason == nil {
                    tokenCalls += 1
                    if let request = event.request { flightStarts[request] = event.time }
                }
                if lagStart == nil { lagStart = event.time }
            case .refreshRetry:
                tokenCalls += 1
                refreshRetries += 1
                refreshRetryWait += event.delay?.seconds ?? 0
            case .refreshEnd:
                let category = event.category ?? (event.ok == true ? .ok : .transient)
                Self.bump(&refreshes, category.rawValue)
                switch category {
                case .remembered, .limited, .retryAfter:
                    break  // no call was made
                case .timeout:
                    break  // the call runs on: its duration ends with its answer
                default:
                    if let request = event.request, let start = flightStarts.removeValue(forKey: request) {
                        refreshDuration.observe((event.time - start).seconds, bounds: bounds)
                    }
                }
                if category == .ok, let start = lagStart {
                    refreshLag.observe((event.time - start).seconds, bounds: bounds)
                    lagStart = nil
                }
            case .logout:
                let cause = event.category?.rawValue ?? "other"
                Self.bump(&logouts, Pair(first: cause, second: event.rule ?? ""))
                cooldownSeconds += event.cooldown?.seconds ?? 0
            case .held, .queued:
                let isHeld = event.kind == .held
                if isHeld { held += 1 } else { queued += 1 }
                guard let request = event.request else { return }
                // A request held and then queued (or queued again) ends one wait as the next begins.
                if !waiting.isEmpty { endWait(request, at: event.time, bounds) }
                waiting[request] = (event.time, isHeld)
            case .cancel:
                cancellations += 1
            case .problem:
                Self.bump(&problems, Self.problemKind(event.reason))
            case .reload:
                Self.bump(&reloads, event.ok == false ? "refused" : "ok")
            }
        }

        /// A held or queued request left its wait (sent, or ended).
        mutating func endWait(_ request: String, at time: Duration, _ bounds: [Double]) {
            guard let wait = waiting.removeValue(forKey: request) else { return }
            let seconds = (time - wait.since).seconds
            if wait.held {
                heldWait.observe(seconds, bounds: bounds)
            } else {
                queuedWait.observe(seconds, bounds: bounds)
            }
        }

        /// What a `problem` is about, from the start the engine gives each kind of reason.
        static func problemKind(_ reason: String?) -> String {
            guard let reason else { return "other" }
            if reason.hasPrefix("coordination") { return "coordination" }
            if reason.hasPrefix("the credential store") { return "credential_store" }
            if reason.contains("plugin") { return "plugin" }
            return "other"
        }

        /// Counts one more for `key`; a new label past ``PolicyMetrics/maxSeriesPerMetric`` counts
        /// as `other`, where an operator still sees it.
        static func bump(_ counts: inout [String: UInt64], _ key: String) {
            let bounded = counts[key] == nil && counts.count >= PolicyMetrics.maxSeriesPerMetric ? "other" : key
            counts[bounded, default: 0] += 1
        }

        static func bump(_ counts: inout [Pair: UInt64], _ key: Pair) {
            let bounded =
                counts[key] == nil && counts.count >= PolicyMetrics.maxSeriesPerMetric
                ? Pair(first: "other", second: "other") : key
            counts[bounded, default: 0] += 1
        }
    }
}

// MARK: - Families

extension PolicyMetrics {
    static let prefix = "response_policy_"

    static func families(
        _ s: State, bounds: [Double], gauges: EngineGauges?, info: PolicyInfo?
    ) -> [MetricsExposition.Family] {
        typealias F = MetricsExposition.Family
        typealias S = MetricsExposition.Sample
        func counter(_ name: String, _ help: String, unit: String? = nil, _ samples: [S]) -> F {
            F(prefix + name, .counter, unit: unit, help: help, samples: samples)
        }
        func one(_ name: String, _ help: String, _ value: UInt64) -> F { counter(name, help, [S([], Double(value))]) }
        func by(_ label: String, _ counts: [String: UInt64]) -> [S] {
            counts.sorted { $0.key < $1.key }.map { S([(label, $0.key)], Double($0.value)) }
        }
        func by(_ first: String, _ second: String, _ counts: [Pair: UInt64]) -> [S] {
            counts.sorted { ($0.key.first, $0.key.second) < ($1.key.first, $1.key.second) }
                .map { S([(first, $0.key.first), (second, $0.key.second)], Double($0.value)) }
        }
        func histogram(_ name: String, _ help: String, _ h: Histogram) -> F {
            F(prefix + name, .histogram, unit: "seconds", help: help, samples: [S(buckets: h.exposed(bounds))])
        }
        var requestSamples: [S] = []
        for scope in s.requests.keys.sorted() {
            for (index, result) in results.enumerated() {
                requestSamples.append(
                    S(
                        [("scope", scope), ("result", result.rawValue.replacingOccurrences(of: "-", with: "_"))],
                        Double(s.requests[scope]?[index] ?? 0)))
            }
        }
        var families: [F] = []
        if let info {
            families.append(
                F(
                    "response_policy", .info, help: "The policy the engine runs (its name) and the library's version.",
                    samples: [
                        S(
                            [
                                ("policy", info.name), ("schema", String(ResponsePolicyVersion.schema)),
                                ("version", ResponsePolicyVersion.version),
                            ], 1)
                    ]))
        }
        families += [
            counter(
                "requests", "Requests that had their outcome, by scope (default, route-N) and result.", requestSamples),
            counter(
                "request_failures", "Failed requests by scope and reason.", by("scope", "reason", s.failures)),
            one(
                "attempts", "Attempts put on the wire (first sends, retries and re-sends after a refresh).", s.attempts),
            counter(
                "attempt_errors", "Attempts that got no response, by error class.", by("error", s.attemptErrors)),
            counter(
                "rule_matches", "Responses a rule matched, by rule and the action taken.",
                by("rule", "action", s.ruleMatches)),
            counter("retries", "Retries started (a backoff begun), by rule.", by("rule", s.retries)),
            counter(
                "retry_budget_refusals", "Retries the retry budget refused, by rule.", by("rule", s.budgetRefusals)),
            counter(
                "escalations",
                "Responses whose rule led elsewhere than its action (budget, not-retryable, on-exhausted, deadline, "
                    + "on-failure, refresh-answer), by rule and reason.",
                by("rule", "reason", s.escalations)),
            histogram("retry_wait_seconds", "Backoff waits before a retry (Retry-After included).", s.retryWait),
            counter(
                "refreshes",
                "Refreshes that ended, by result: ok, definitive, transient, coordination, superseded, timeout "
                    + "(waiters released at refresh.timeout; the call runs on), and without a call: remembered, "
                    + "limited, retry_after.",
                by("result", s.refreshes)),
            one("token_calls", "Calls to the refresh plugin (the token endpoint), retries included.", s.tokenCalls),
            one("refresh_retries", "Token calls repeated after transient trouble.", s.refreshRetries),
            counter(
                "refresh_retry_wait_seconds", "Time waited before repeating a token call (Retry-After or backoff).",
                unit: "seconds", [S([], s.refreshRetryWait)]),
            histogram("refresh_duration_seconds", "From a refresh's start to its answer.", s.refreshDuration),
            histogram(
                "refresh_lag_seconds",
                "From the first refresh trigger after the last new token to the next new token.", s.refreshLag),
            counter(
                "logouts", "Logouts by cause (rule, refresh_failed, host, fleet) and rule.",
                by("reason", "rule", s.logouts)),
            counter(
                "cooldown_seconds", "Cooldown time the logouts started.", unit: "seconds",
                [S([], s.cooldownSeconds)]),
            one("held_requests", "Requests held before sending while a refresh was in flight.", s.held),
            histogram("held_wait_seconds", "How long held requests waited.", s.heldWait),
            one("queued_requests", "Requests queued for a dispatch slot.", s.queued),
            histogram("queued_wait_seconds", "How long queued requests waited for a dispatch slot.", s.queuedWait),
            one("cancellations", "Requests cancelled (by a logout or their caller).", s.cancellations),
            counter(
                "problems",
                "Problems that did not end a request, by kind (coordination, credential_store, plugin, other).",
                by("kind", s.problems)),
            counter("reloads", "Policy reloads, by result (ok, refused).", by("result", s.reloads)),
        ]
        guard let g = gauges else { return families }
        func gauge(_ name: String, _ help: String, _ value: Double) -> F {
            F(
                prefix + name, .gauge, unit: name.hasSuffix("_seconds") ? "seconds" : nil, help: help,
                samples: [S([], value)])
        }
        families += [
            gauge("requests_in_flight", "Requests that have not had their outcome yet.", Double(g.requestsInFlight)),
            gauge("refresh_in_flight", "1 while a refresh is in flight.", g.refreshing ? 1 : 0),
            gauge("refresh_waiters", "Requests waiting for the refresh in flight.", Double(g.refreshWaiters)),
            gauge("dispatch_slots_in_use", "Dispatch slots in use, all hosts.", Double(g.dispatchInFlight)),
            gauge("dispatch_queued", "Requests waiting for a dispatch slot.", Double(g.dispatchQueued)),
            gauge("logged_out", "1 during the logout cooldown.", g.cooldownRemaining > 0 ? 1 : 0),
            gauge("cooldown_remaining_seconds", "Time left in the logout cooldown.", g.cooldownRemaining),
            gauge(
                "credentials_generation", "The credentials' generation (each refresh, sign-in and adoption adds one).",
                Double(g.generation)),
            gauge(
                "coordination_generation", "The fleet's generation of the credentials held (0: none shared).",
                Double(g.sharedGeneration)),
            gauge(
                "coordination_publication_pending", "1 while a new pair waits to be published to the fleet.",
                g.publicationPending ? 1 : 0),
            gauge(
                "coordination_trouble", "1 while the coordination store reports trouble.",
                g.coordinationTrouble ? 1 : 0),
            counter(
                "coordination_turns",
                "The coordinator's answers to refresh turns, by result: lease (this process calls the token "
                    + "endpoint), adopted (the fleet held newer credentials), published (another process's refresh "
                    + "answered), failed_elsewhere, limited, unavailable, retry_after (the fleet waits for a Retry-After).",
                by("result", g.coordinationTurns)),
        ]
        return families
    }
}
