import Foundation
import ResponsePolicy
import ResponsePolicyRedis

#if canImport(Glibc)
    import Glibc
#endif

/// `--only coordination`: what fleet coordination through Redis costs, against a `redis-server`
/// the benchmark starts on a free loopback port (skipped with a note when none is installed).
///
/// - `coordination-refresh`: one uncontended refresh turn (`beginRefresh` + `publish`, the
///   plugin itself instant), against one Redis round trip (`PING`) as the baseline; the Redis
///   commands it sends per refresh come from `INFO commandstats`.
/// - `coordination-storm`: 8 coordinators × 100 requests meet one expired token at once; the time
///   until every one has its answer, and how many refreshes were made (must be 1).
/// - `coordination-hot-path`: Redis commands sent while 10,000 ordinary requests run through an
///   engine coordinated through Redis, subscribed to the key (must be 0: news is pushed, never
///   polled).
extension Benchmarks {
    static func coordination(quick: Bool) async -> [BenchResult] {
        guard
            let executable = ["/usr/bin/redis-server", "/usr/local/bin/redis-server"].first(where: {
                FileManager.default.isExecutableFile(atPath: $0)
            })
        else {
            FileHandle.standardError.write(Data("coordination: redis-server is not installed; skipped\n".utf8))
            return []
        }
        let port = freePort()
        let server = Process()
        server.executableURL = URL(fileURLWithPath: executable)
        server.arguments = ["--port", String(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        server.standardOutput = FileHandle.nullDevice
        guard (try? server.run()) != nil else { return [] }
        defer {
            kill(server.processIdentifier, SIGKILL)
            server.waitUntilExit()
        }
        let url = "redis://127.0.0.1:\(port)/0"
        guard case .success(let endpoint) = RedisEndpoint.parse(url) else { return [] }
        var admin: RedisConnection?
        for _ in 0..<200 where admin == nil {
            admin = try? RedisConnection(endpoint, password: nil, timeout: .seconds(1))
            if admin == nil { usleep(10_000) }
        }
        guard let admin else { return [] }
        func calls() -> [String: Int] {
            guard let text = (try? admin.command(["INFO", "commandstats"]))?.text else { return [:] }
            var result: [String: Int] = [:]
            for line in text.split(separator: "\r\n") where line.hasPrefix("cmdstat_") {
                let name = String(line.dropFirst(8).prefix { $0 != ":" })
                if let range = line.range(of: "calls=") {
                    result[name] = Int(line[range.upperBound...].prefix { $0.isNumber })
                }
            }
            return result
        }
        func sent(since before: [String: Int]) -> Int {
            calls().filter { $0.key != "info" }.reduce(0) { $0 + $1.value - (before[$1.key] ?? 0) }
        }

        // One round trip, the baseline.
        let iterations = quick ? 5 : 2000
        var pings: [Double] = []
        for _ in 0..<iterations {
            let start = ContinuousClock.now
            _ = try? admin.command(["PING"])
            pings.append((ContinuousClock.now - start).nanoseconds / 1000)
        }

        /// Warm refresh turns of `coordinator` (started, one turn made to load its scripts), each
        /// timed; with Redis's command counts before and after them, and the median of the scripts
        /// Redis ran during each turn (read outside the timed span): a subscriber's re-read that
        /// a loaded machine delays into one turn, or a turn that found news instead of a lease,
        /// does not move it.
        func warmTurns(_ coordinator: RedisSessionCoordinator) async -> (
            [Double], [String: Int], [String: Int], scriptsPerTurn: Double
        ) {
            func total(_ names: [String]) -> Int {
                let now = calls()
                return names.reduce(0) { $0 + (now[$1] ?? 0) }
            }
            let scripts = { total(["eval", "evalsha"]) }
            let roundTrips = { total(["eval", "evalsha", "script|load", "script"]) }
            let beforeStart = scripts()
            _ = await coordinator.start(local: Credentials(accessToken: "a", refreshToken: "r"), updates: { _ in })
            // Start's own read and the subscriber's start-up read (one script each) are done before
            // anything is counted: waited for by Redis's count, not a sleep a loaded machine outlasts.
            let deadline = ContinuousClock.now + .seconds(30)
            while scripts() < beforeStart + 2, ContinuousClock.now < deadline { usleep(2_000) }
            var generation: UInt64 = 0
            // One turn to warm up: the scripts are loaded once per connection (SCRIPT LOAD).
            if case .lease(let lease) = await coordinator.beginRefresh(
                .init(failedGeneration: 0, timeout: .seconds(5), limit: nil)),
                case .published(let session) = await coordinator.publish(Credentials(accessToken: "w"), with: lease)
            {
                generation = session.generation
            }
            var turns: [Double] = []
            var perTurn: [Double] = []
            let before = calls()
            for index in 0..<iterations {
                let sentBefore = roundTrips()
                let start = ContinuousClock.now
                let turn = await coordinator.beginRefresh(
                    .init(failedGeneration: generation, timeout: .seconds(5), limit: nil))
                guard case .lease(let lease) = turn else { continue }
                if case .published(let session) = await coordinator.publish(
                    Credentials(accessToken: "a\(index)", refreshToken: "r\(index)"), with: lease)
                {
                    generation = session.generation
                }
                turns.append((ContinuousClock.now - start).nanoseconds / 1000)
                perTurn.append(Double(roundTrips() - sentBefore))
            }
            return (turns, before, calls(), percentile(perTurn, 0.5))
        }

        // An uncontended refresh turn.
        guard let single = try? RedisSessionCoordinator(.init(url: url, key: "bench")) else { return [] }
        let (turns, before, after, roundTrips) = await warmTurns(single)
        let refreshCount = Double(max(1, turns.count))
        // commandstats counts the commands inside a script too; the client sends only EVALSHAs (and
        // a SCRIPT LOAD per script and connection, before the first turn): a turn's round trips
        // are the scripts Redis ran during it.
        let serverCommands =
            Double(after.filter { $0.key != "info" }.reduce(0) { $0 + $1.value - (before[$1.key] ?? 0) })
            / refreshCount
        single.stop()

        // The same warm turn under signing-key-env: every value sealed and checked (HMAC-SHA256).
        var signedTurns: [Double] = []
        var signedRoundTrips = 0.0
        if let signed = try? RedisSessionCoordinator(
            .init(url: url, key: "bench-signed", signingKey: Data(repeating: 0x5a, count: 32)))
        {
            (signedTurns, _, _, signedRoundTrips) = await warmTurns(signed)
            signed.stop()
        }

        // Cold: what a process that just started pays for its first refresh turn: connecting,
        // seeding, the subscriber's connection and read, loading the scripts, then the turn.
        let coldIterations = quick ? 3 : 40
        var colds: [Double] = []
        var coldGeneration: UInt64 = 0
        let coldBefore = calls()
        for index in 0..<coldIterations {
            let start = ContinuousClock.now
            guard let fresh = try? RedisSessionCoordinator(.init(url: url, key: "cold")) else { continue }
            let shared = await fresh.start(local: Credentials(accessToken: "c", refreshToken: "c"), updates: { _ in })
            coldGeneration = max(coldGeneration, shared?.generation ?? 0)
            if case .lease(let lease) = await fresh.beginRefresh(
                .init(failedGeneration: coldGeneration, timeout: .seconds(5), limit: nil)),
                case .published(let session) = await fresh.publish(
                    Credentials(accessToken: "c\(index)", refreshToken: "c\(index)"), with: lease)
            {
                coldGeneration = session.generation
            }
            colds.append((ContinuousClock.now - start).nanoseconds / 1000)
            fresh.stop()
        }
        let coldAfter = calls()
        // The commands the clients sent (commandstats also counts the ones inside scripts, left out
        // here), the subscriber's included: round trips of a fresh process's first refresh.
        let clientCommands = ["eval", "evalsha", "script|load", "script", "subscribe", "select", "auth", "ping"]
        let coldCommands =
            Double(clientCommands.reduce(0) { $0 + (coldAfter[$1] ?? 0) - (coldBefore[$1] ?? 0) })
            / Double(max(1, colds.count))

        // A storm: many coordinators, many requests, one expired token.
        let processes = quick ? 2 : 8
        let perProcess = quick ? 5 : 100
        let fleet = (0..<processes).compactMap { _ in try? RedisSessionCoordinator(.init(url: url, key: "storm")) }
        for coordinator in fleet {
            _ = await coordinator.start(local: Credentials(accessToken: "a", refreshToken: "r"), updates: { _ in })
        }
        let stormStart = ContinuousClock.now
        let answers = await withTaskGroup(of: RefreshTurn.self) { group in
            for coordinator in fleet {
                for _ in 0..<perProcess {
                    group.addTask {
                        let turn = await coordinator.beginRefresh(
                            .init(failedGeneration: 0, timeout: .seconds(10), limit: nil))
                        if case .lease(let lease) = turn {
                            _ = await coordinator.publish(Credentials(accessToken: "b", refreshToken: "s"), with: lease)
                        }
                        return turn
                    }
                }
            }
            return await group.reduce(into: [RefreshTurn]()) { $0.append($1) }
        }
        let stormMs = (ContinuousClock.now - stormStart).nanoseconds / 1_000_000
        let refreshes = answers.filter { if case .lease = $0 { true } else { false } }.count

        // The fleet is stopped first: on a loaded machine a subscriber whose command outlived its
        // connect timeout reconnects (SUBSCRIBE and a resync), which `INFO commandstats` would count
        // against the hot path although no request caused it.
        fleet.forEach { $0.stop() }

        // The hot path: ordinary requests through an engine coordinated through Redis (its own
        // coordinator, subscribed to the same key), after the join its first request waits for.
        let requests = quick ? 200 : 10_000
        var hotPathCommands = -1
        if let policy = try? Policy.load(yaml: Policy.defaultPolicyText),
            let coordinator = try? RedisSessionCoordinator(.init(url: url, key: "storm"))
        {
            var options = PolicyEngine.Options()
            options.coordinator = coordinator
            let engine = PolicyEngine(
                policy: policy, transport: InstantCancellableTransport(),
                credentials: MemoryCredentialStore(Credentials(accessToken: "t")), options: options)
            let request = HTTPRequest(url: URL(fileURLWithPath: "/profile"))
            blackHole(try? await engine.send(request))
            // The subscriber connects on its own thread (SUBSCRIBE, then a resync of what it missed):
            // a join's cost, not the hot path's. Measure once Redis has heard nothing new for 100 ms.
            var quiet = calls()
            for _ in 0..<50 {
                usleep(100_000)
                let now = calls()
                if now.filter({ $0.key != "info" }) == quiet.filter({ $0.key != "info" }) { break }
                quiet = now
            }
            for _ in 0..<requests { blackHole(try? await engine.send(request)) }
            hotPathCommands = sent(since: quiet)
            coordinator.stop()
        }

        let ping = median(pings)
        let turn = median(turns)
        let cold = median(colds)
        let signedTurn = median(signedTurns)
        return [
            BenchResult(
                name: "coordination-refresh-cold", value: cold, unit: "us", baseline: turn,
                baselineName: "a warm refresh turn (coordination-refresh)", ratio: cold / turn,
                ratioMeaning: "first refresh turn of a fresh coordinator / a warm one, lower is better",
                extra: [("commands_per_cold_turn", coldCommands), ("p99_us", percentile(colds, 0.99))],
                goal: "a fresh process pays its connections and script loads once"),
            BenchResult(
                name: "coordination-refresh", value: turn, unit: "us", baseline: ping,
                baselineName: "one Redis round trip (PING)", ratio: turn / ping,
                ratioMeaning: "refresh turn latency / one PING round trip, lower is better",
                extra: [
                    ("round_trips_per_refresh", roundTrips), ("server_commands_per_refresh", serverCommands),
                    ("p99_us", percentile(turns, 0.99)),
                ],
                goal: "2 round trips (beginRefresh + publish) added to a refresh"),
            BenchResult(
                name: "coordination-refresh-signed", value: signedTurn, unit: "us", baseline: turn,
                baselineName: "the same turn without a key (coordination-refresh)", ratio: signedTurn / turn,
                ratioMeaning: "refresh turn with signing-key-env / without, lower is better",
                extra: [("round_trips_per_refresh", signedRoundTrips), ("p99_us", percentile(signedTurns, 0.99))],
                goal: "signing costs microseconds, not round trips"),
            BenchResult(
                name: "coordination-storm", value: stormMs, unit: "ms", baseline: nil, baselineName: nil, ratio: nil,
                ratioMeaning: "",
                extra: [
                    ("processes", Double(processes)), ("requests", Double(processes * perProcess)),
                    ("refreshes", Double(refreshes)),
                ],
                goal: "refreshes == 1"),
            BenchResult(
                name: "coordination-hot-path", value: Double(hotPathCommands), unit: "commands", baseline: nil,
                baselineName: nil, ratio: nil, ratioMeaning: "", extra: [("requests", Double(requests))],
                goal: "0 Redis commands for requests that trigger no refresh or logout"),
        ]
    }

    static func median(_ values: [Double]) -> Double { percentile(values, 0.5) }

    static func percentile(_ values: [Double], _ fraction: Double) -> Double {
        guard !values.isEmpty else { return .nan }
        let sorted = values.sorted()
        return sorted[min(sorted.count - 1, Int(Double(sorted.count) * fraction))]
    }

    static func freePort() -> Int {
        let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(descriptor) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        _ = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(descriptor, $0, &length) }
        }
        return Int(UInt16(bigEndian: address.sin_port))
    }
}
