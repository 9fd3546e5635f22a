import BenchHeap
import CCurl
import Foundation
import ResponsePolicy
import ResponsePolicyCurl
import ResponsePolicyURLSession

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// `--only transport`: GET and POST, sequential and 16 at once, over HTTP/1.1, TLS with HTTP/1.1
/// and TLS with HTTP/2, against a loopback nginx the bench starts (Debian's `nginx-light` and
/// `libnginx-mod-http-echo`; a self-signed certificate made with `openssl`, trusted through a CA
/// bundle of the system's certificates plus it, so each TLS client loads 140 certificates as in
/// production). Each row runs, in the same run: the engine over `CurlTransport`, the same under
/// `CurlTransport.executor` (the requesting tasks on the transport's thread), the engine over
/// `URLSessionTransport`, raw URLSession (one shared session, no engine) and raw libcurl (an easy
/// handle reused sequentially, a multi handle for 16 at once; the CA store cached and every
/// connection kept, libcurl at its best). Reported per request: CPU
/// (getrusage, the whole process) and wall; and the connections nginx accepted.
///
/// `transport-h2-c16-20ms`: 16 concurrent GETs over HTTP/2 where the server takes 20 ms, the
/// engine over each transport against raw URLSession's wall.
extension Benchmarks {
    enum Client: String, CaseIterable {
        case engineCurl = "engine+curl"
        /// The engine over `CurlTransport`, run under its `executor` (no thread hop per request).
        case engineCurlExecutor = "engine+curl-executor"
        /// `CurlTransport` alone under its executor (no engine): what the transport costs.
        case curlExecutor = "curl-executor"
        case engineURLSession = "engine+urlsession"
        case rawURLSession = "raw-urlsession"
        case rawCurl = "raw-libcurl"
        /// Raw libcurl awaited from a task: the floor under any `async` transport on libcurl
        /// (see ``AsyncCurlFloor``).
        case asyncCurl = "async-libcurl"
        /// `async-libcurl` with the request sent on the caller's thread (one hop, not two; see
        /// ``AsyncCurlSocketFloor``).
        case asyncCurlSocket = "async-libcurl-socket"
    }

    struct Figure {
        var cpuMicros = Double.nan
        var wallMicros = Double.nan
        var connections = 0
        var failures = 0
        /// The heap's growth over the measured requests, per request (`mallinfo2`, after the
        /// warm-up, the client still alive): what a long-running service would keep. A leak of
        /// the transfers (fixed: each request kept about 1.7 KB) shows here first.
        var retainedBytes = Double.nan
    }

    /// - Parameter only: `transport` for every row, or a prefix of the rows wanted
    ///   (`transport-h2`, `transport-tls1-post`).
    ///   - clients: The clients measured (`--clients engine+curl,raw-libcurl`, for profiling one).
    static func transport(
        quick: Bool, installCA: Bool, only: String = "transport", clients: Set<Client> = Set(Client.allCases),
        requests: Int? = nil, repetitions: Int = 1, goawayAfter: Int? = nil
    ) async -> [BenchResult] {
        guard let nginx = BenchNginx.start(installCA: installCA, requestsPerConnection: goawayAfter) else {
            FileHandle.standardError.write(
                Data("transport: could not start nginx (apt-get install nginx-light libnginx-mod-http-echo)\n".utf8))
            return []
        }
        defer { nginx.stop() }
        let sequential = quick ? 10 : requests ?? 300
        let rounds = quick ? 1 : max(1, (requests ?? 320) / 16)
        var results: [BenchResult] = []
        for (scheme, port) in [("http", nginx.httpPort), ("tls1", nginx.tls1Port), ("h2", nginx.h2Port)] {
            let host = scheme == "http" ? "http://127.0.0.1:\(port)" : "https://localhost:\(port)"
            for method in ["GET", "POST"] {
                for concurrent in [false, true] {
                    let name = "transport-\(scheme)-\(method.lowercased())-\(concurrent ? "c16" : "seq")"
                    guard name.hasPrefix(only) || only == "transport",
                        let url = URL(string: host + (method == "GET" ? "/get" : "/post"))
                    else { continue }
                    let reps = await repeated(repetitions, clients) { client in
                        let figure = await measureClient(
                            client, url: url, method: method, count: concurrent ? 16 * rounds : sequential,
                            concurrency: concurrent ? 16 : 1, http2: scheme == "h2", nginx: nginx)
                        progress(
                            "\(scheme) \(method) \(concurrent ? "c16" : "seq") \(client.rawValue): "
                                + "\(Int(figure.cpuMicros)) us CPU, \(Int(figure.wallMicros)) us wall, "
                                + "\(figure.connections) connections, \(figure.failures) failed")
                        return figure
                    }
                    results.append(transportRow(name, reps))
                }
            }
        }
        // 16 at once over HTTP/2 with 20 ms of server time: wall against raw URLSession's.
        if "transport-h2-c16-20ms".hasPrefix(only), let url = URL(string: "https://localhost:\(nginx.h2Port)/slow") {
            let reps = await repeated(repetitions, clients) { client in
                await measureClient(
                    client, url: url, method: "GET", count: 16 * (quick ? 1 : 10), concurrency: 16, http2: true,
                    nginx: nginx)
            }
            let figures = medians(reps)
            let ours = figures[.engineCurl]?.wallMicros ?? .nan
            let raw = figures[.rawURLSession]?.wallMicros ?? .nan
            results.append(
                BenchResult(
                    name: "transport-h2-c16-20ms", value: ours / 1_000, unit: "ms wall/request",
                    baseline: raw / 1_000, baselineName: "raw URLSession",
                    ratio: medianRatio(reps, .engineCurl, over: .rawURLSession, \.wallMicros),
                    ratioMeaning:
                        "engine+curl wall / raw URLSession wall (median of the repetitions' ratios), lower is better",
                    extra: extras(figures, reps), goal: "<= 1.2x raw URLSession's wall"))
        }
        return results
    }

    /// A line on stderr as each measure ends (the whole run takes minutes).
    static func progress(_ line: String) {
        FileHandle.standardError.write(Data(("transport: " + line + "\n").utf8))
    }

    /// `measure` for each client, `count` times over, the clients taking turns (each repetition
    /// starts with the next one): the machine's drift lands on every client alike.
    static func repeated(
        _ count: Int, _ clients: Set<Client>, _ measure: (Client) async -> Figure
    ) async -> [[Client: Figure]] {
        let order = Client.allCases.filter { clients.contains($0) }
        var reps: [[Client: Figure]] = []
        for rep in 0..<count {
            var figures: [Client: Figure] = [:]
            for index in order.indices {
                let client = order[(index + rep) % order.count]
                figures[client] = await measure(client)
            }
            reps.append(figures)
        }
        return reps
    }

    /// Each client's median CPU, wall and connections over the repetitions; failures summed.
    static func medians(_ reps: [[Client: Figure]]) -> [Client: Figure] {
        var result: [Client: Figure] = [:]
        for client in Client.allCases {
            let figures = reps.compactMap { $0[client] }
            guard !figures.isEmpty else { continue }
            result[client] = Figure(
                cpuMicros: median(figures.map(\.cpuMicros)), wallMicros: median(figures.map(\.wallMicros)),
                connections: Int(median(figures.map { Double($0.connections) })),
                failures: figures.reduce(0) { $0 + $1.failures }, retainedBytes: median(figures.map(\.retainedBytes)))
        }
        return result
    }

    /// The median over the repetitions of `client`'s figure divided by `baseline`'s in the same
    /// repetition: steadier than a ratio of medians when the machine drifts.
    static func medianRatio(
        _ reps: [[Client: Figure]], _ client: Client, over baseline: Client, _ figure: KeyPath<Figure, Double>
    ) -> Double {
        median(
            reps.compactMap { rep in
                rep[client].flatMap { ours in rep[baseline].map { ours[keyPath: figure] / $0[keyPath: figure] } }
            })
    }

    static func transportRow(_ name: String, _ reps: [[Client: Figure]]) -> BenchResult {
        let figures = medians(reps)
        return BenchResult(
            name: name, value: figures[.engineCurl]?.cpuMicros ?? .nan, unit: "us CPU/request",
            baseline: figures[.rawCurl]?.cpuMicros ?? .nan, baselineName: "raw libcurl",
            ratio: medianRatio(reps, .engineCurl, over: .rawCurl, \.cpuMicros),
            ratioMeaning: "engine+curl CPU / raw libcurl CPU (median of the repetitions' ratios), lower is better",
            extra: extras(figures, reps),
            goal: "engine+curl <= 2x libcurl CPU; engine+urlsession <= 1.5x raw URLSession; <= 1 connection/100")
    }

    /// Each client's medians, and the ratios the goals read (each the median of the repetitions'
    /// ratios).
    static func extras(_ figures: [Client: Figure], _ reps: [[Client: Figure]]) -> [(String, Double)] {
        var extra: [(String, Double)] = []
        for client in Client.allCases {
            guard let figure = figures[client] else { continue }
            let key = client.rawValue.replacingOccurrences(of: "+", with: "_").replacingOccurrences(of: "-", with: "_")
            extra.append(("\(key)_cpu_us", figure.cpuMicros))
            extra.append(("\(key)_wall_us", figure.wallMicros))
            extra.append(("\(key)_connections", Double(figure.connections)))
            extra.append(("\(key)_retained_bytes_per_request", figure.retainedBytes))
            if figure.failures > 0 { extra.append(("\(key)_failures", Double(figure.failures))) }
        }
        let ratios: [(String, Client, Client, KeyPath<Figure, Double>)] = [
            ("engine_urlsession_over_raw_urlsession_cpu", .engineURLSession, .rawURLSession, \.cpuMicros),
            ("engine_urlsession_over_raw_urlsession_wall", .engineURLSession, .rawURLSession, \.wallMicros),
            ("engine_curl_over_raw_urlsession_wall", .engineCurl, .rawURLSession, \.wallMicros),
            ("engine_curl_executor_over_raw_libcurl_cpu", .engineCurlExecutor, .rawCurl, \.cpuMicros),
            ("curl_executor_over_raw_libcurl_cpu", .curlExecutor, .rawCurl, \.cpuMicros),
            ("async_libcurl_over_raw_libcurl_cpu", .asyncCurl, .rawCurl, \.cpuMicros),
            ("engine_curl_over_async_libcurl_cpu", .engineCurl, .asyncCurl, \.cpuMicros),
            ("async_libcurl_socket_over_raw_libcurl_cpu", .asyncCurlSocket, .rawCurl, \.cpuMicros),
            ("async_libcurl_socket_over_async_libcurl_cpu", .asyncCurlSocket, .asyncCurl, \.cpuMicros),
        ]
        for (key, client, baseline, figure) in ratios where figures[client] != nil && figures[baseline] != nil {
            extra.append((key, medianRatio(reps, client, over: baseline, figure)))
        }
        extra.append(("repetitions", Double(reps.count)))
        return extra
    }

    /// `count` requests, `concurrency` at once, through one client made for this measure.
    static func measureClient(
        _ client: Client, url: URL, method: String, count: Int, concurrency: Int, http2: Bool, nginx: BenchNginx
    ) async -> Figure {
        let body = method == "POST" ? Data(#"{"grant_type":"refresh_token","refresh_token":"r-0123456789"}"#.utf8) : nil
        let request = HTTPRequest(method: method, url: url, headers: ["Content-Type": "application/json"], body: body)
        let send: @Sendable () async -> Bool
        var keep: [AnyObject] = []
        var executor: (any TaskExecutor)?
        var finish: () -> Void = {}
        switch client {
        case .engineCurl, .engineCurlExecutor, .engineURLSession:
            guard let policy = try? Policy.load(yaml: "policy: 1\nname: bench\n", file: "bench.yaml") else {
                return Figure()
            }
            let transport: any Transport
            if client == .engineURLSession {
                transport = URLSessionTransport(timeout: .seconds(30))
            } else {
                let curl = CurlTransport(timeout: .seconds(30), caFile: nginx.caBundle)
                if client == .engineCurlExecutor { executor = curl.executor }
                transport = curl
            }
            let engine = PolicyEngine(
                policy: policy, transport: transport, credentials: MemoryCredentialStore(Credentials(accessToken: "t")))
            send = { (try? await engine.send(request))?.status == 200 }
        case .curlExecutor:
            let curl = CurlTransport(timeout: .seconds(30), caFile: nginx.caBundle)
            executor = curl.executor
            send = { (try? await curl.send(request))?.status == 200 }
        case .rawURLSession:
            let configuration = URLSessionConfiguration.ephemeral
            configuration.urlCache = nil
            let session = URLSession(configuration: configuration)
            keep.append(session)
            var urlRequest = URLRequest(url: url)
            urlRequest.httpMethod = method
            urlRequest.setValue("application/json", forHTTPHeaderField: "Content-Type")
            urlRequest.httpBody = body
            let made = urlRequest
            send = {
                await withCheckedContinuation { (continuation: CheckedContinuation<Bool, Never>) in
                    session.dataTask(with: made) { _, response, _ in
                        continuation.resume(returning: (response as? HTTPURLResponse)?.statusCode == 200)
                    }.resume()
                }
            }
        case .asyncCurl, .asyncCurlSocket:
            let floor: (perform: @Sendable (UnsafeMutableRawPointer) async -> Bool, stop: @Sendable () -> Void)
            if client == .asyncCurl {
                guard let made = AsyncCurlFloor() else { return Figure() }
                floor = ({ await made.perform($0) }, made.stop)
            } else {
                #if os(Linux)
                    guard let made = AsyncCurlSocketFloor() else { return Figure() }
                    floor = ({ await made.perform($0) }, made.stop)
                #else
                    return Figure()
                #endif
            }
            let handles = (0..<concurrency).compactMap { _ in
                RawCurl.easyHandle(url: url, body: body, caFile: nginx.caBundle)
            }
            let free = Locked(handles)
            send = {
                guard let easy = free.withLock({ $0.popLast() }) else { return false }
                defer { free.withLock { $0.append(easy) } }
                return await floor.perform(easy)
            }
            finish = {
                floor.stop()
                for easy in handles { curl_easy_cleanup(easy) }
            }
        case .rawCurl:
            return RawCurl.measure(
                url: url, body: body, count: count, concurrency: concurrency, http2: http2, caFile: nginx.caBundle,
                nginx: nginx)
        }
        // Warm-up, not counted: one round of `concurrency` requests at once, so each client has
        // the connections it keeps (and the CA store, DNS) before the measure, as raw libcurl's
        // warm-up round has. (With one warm-up request, a client 16 at once paid its other
        // connections' handshakes inside the measure: over TLS, 5-15 handshakes in 320 requests.)
        await withTaskGroup(of: Void.self) { group in
            for _ in 0..<concurrency { group.addTask(executorPreference: executor) { _ = await send() } }
        }
        let acceptedBefore = nginx.accepted()
        let heapBefore = heapInUse()
        let cpuBefore = processCPU()
        let start = ContinuousClock.now
        let failures = await withTaskGroup(of: Int.self) { group in
            var failures = 0
            let perWorker = count / concurrency
            for _ in 0..<concurrency {
                group.addTask(executorPreference: executor) {
                    var failed = 0
                    for _ in 0..<perWorker where !(await send()) { failed += 1 }
                    return failed
                }
            }
            for await failed in group { failures += failed }
            return failures
        }
        let wall = ContinuousClock.now - start
        let cpu = processCPU() - cpuBefore
        let heap = heapInUse() - heapBefore
        withExtendedLifetime(keep) {}
        finish()
        let n = Double(count / concurrency * concurrency)
        return Figure(
            cpuMicros: cpu * 1e6 / n, wallMicros: wall.nanoseconds / 1_000 / n,
            connections: nginx.accepted() - acceptedBefore - 1, failures: failures, retainedBytes: heap / n)
    }

    /// Bytes allocated and not freed, in every arena and in `mmap`ed blocks.
    static func heapInUse() -> Double {
        Double(bench_heap_in_use())
    }

    /// User and system CPU of the whole process, in seconds.
    static func processCPU() -> Double {
        var usage = rusage()
        getrusage(RUSAGE_SELF.rawValue, &usage)
        return Double(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec)
            + Double(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6
    }
}

/// The libcurl baseline: what a small C program does with the same requests.
enum RawCurl {
    /// An easy handle set up once for `url` (and `body`, a POST), to be reused as is: libcurl at
    /// its best.
    static func easyHandle(url: URL, body: Data?, caFile: String?) -> UnsafeMutableRawPointer? {
        guard let easy = curl_easy_init() else { return nil }
        let bodyBytes = [UInt8](body ?? Data())
        // COPYPOSTFIELDS reads POSTFIELDSIZE first.
        if body != nil {
            _ = ccurl_easy_setopt_offset(easy, CURLOPT_POSTFIELDSIZE_LARGE, curl_off_t(bodyBytes.count))
        }
        _ = url.absoluteString.withCString { ccurl_easy_setopt_pointer(easy, CURLOPT_URL, $0) }
        if let caFile { _ = caFile.withCString { ccurl_easy_setopt_pointer(easy, CURLOPT_CAINFO, $0) } }
        // libcurl at its best: the CA store cached (Debian's default CA folder disables the
        // cache), as CurlTransport has it.
        _ = ccurl_easy_setopt_pointer(easy, CURLOPT_CAPATH, nil)
        _ = ccurl_easy_setopt_long(easy, CURLOPT_NOSIGNAL, 1)
        _ = ccurl_easy_setopt_long(easy, CURLOPT_PIPEWAIT, 1)
        _ = ccurl_easy_setopt_data_callback(easy, CURLOPT_WRITEFUNCTION, { _, size, count, _ in size * count })
        if body != nil {
            bodyBytes.withUnsafeBytes { _ = ccurl_easy_setopt_pointer(easy, CURLOPT_COPYPOSTFIELDS, $0.baseAddress) }
            _ = ccurl_easy_setopt_offset(easy, CURLOPT_POSTFIELDSIZE_LARGE, curl_off_t(bodyBytes.count))
        }
        return easy
    }

    static func measure(
        url: URL, body: Data?, count: Int, concurrency: Int, http2: Bool, caFile: String?, nginx: BenchNginx
    ) -> Benchmarks.Figure {
        curl_global_init(ccurl_global_all())
        var handles: [UnsafeMutableRawPointer] = []
        for _ in 0..<concurrency {
            guard let easy = easyHandle(url: url, body: body, caFile: caFile) else { return Benchmarks.Figure() }
            handles.append(easy)
        }
        defer { for easy in handles { curl_easy_cleanup(easy) } }
        guard let multi = curl_multi_init() else { return Benchmarks.Figure() }
        defer { curl_multi_cleanup(multi) }
        _ = ccurl_multi_setopt_long(multi, CURLMOPT_PIPELINING, Int(CURLPIPE_MULTIPLEX))
        // Keep every connection of a round for the next (the default cache shrinks with the handles).
        _ = ccurl_multi_setopt_long(multi, CURLMOPT_MAXCONNECTS, 64)
        var failures = 0
        func round() {
            if concurrency == 1, let easy = handles.first {
                if curl_easy_perform(easy) != CURLE_OK { failures += 1 }
                return
            }
            for easy in handles { curl_multi_add_handle(multi, easy) }
            var running: Int32 = 1
            while running > 0 {
                curl_multi_perform(multi, &running)
                if running > 0 { curl_multi_poll(multi, nil, 0, 1_000, nil) }
            }
            var left: Int32 = 0
            while let message = curl_multi_info_read(multi, &left) {
                if ccurl_message_result(message) != CURLE_OK { failures += 1 }
            }
            for easy in handles { curl_multi_remove_handle(multi, easy) }
        }
        round()  // warm-up
        failures = 0
        let acceptedBefore = nginx.accepted()
        let heapBefore = Benchmarks.heapInUse()
        let cpuBefore = Benchmarks.processCPU()
        let start = ContinuousClock.now
        let rounds = count / concurrency
        for _ in 0..<rounds { round() }
        let wall = ContinuousClock.now - start
        let cpu = Benchmarks.processCPU() - cpuBefore
        let heap = Benchmarks.heapInUse() - heapBefore
        let n = Double(rounds * concurrency)
        return Benchmarks.Figure(
            cpuMicros: cpu * 1e6 / n, wallMicros: wall.nanoseconds / 1_000 / n,
            connections: nginx.accepted() - acceptedBefore - 1, failures: failures, retainedBytes: heap / n)
    }
}

/// A loopback nginx for the transport rows: plain HTTP/1.1, TLS 1.3 with HTTP/1.1 only, TLS 1.3
/// with HTTP/2; `/get` and `/post` answer at once, `/slow` after 20 ms (the echo module);
/// `/status` is stub_status (its `accepts` counts connections).
final class BenchNginx: @unchecked Sendable {
    // Set once in `start`, read-only afterwards.
    let folder: String
    let httpPort: Int
    let tls1Port: Int
    let h2Port: Int
    let statusPort: Int
    /// The CA file the libcurl clients read; `nil` for the system's (with `--install-ca`).
    let caBundle: String?
    let process: Process
    /// The system bundle as it was, to put back at the end (with `--install-ca`).
    let systemBundle: String?

    private init(folder: String, ports: [Int], caBundle: String?, process: Process, systemBundle: String?) {
        self.folder = folder
        (httpPort, tls1Port, h2Port, statusPort) = (ports[0], ports[1], ports[2], ports[3])
        self.caBundle = caBundle
        self.process = process
        self.systemBundle = systemBundle
    }

    /// - Parameter requestsPerConnection: nginx's `keepalive_requests`: after that many requests
    ///   it closes an HTTP/1.1 connection and sends `GOAWAY` on an HTTP/2 one, as load balancers
    ///   do (`--goaway-after`); 100,000 by default.
    static func start(installCA: Bool, requestsPerConnection: Int? = nil) -> BenchNginx? {
        let binary = ["/usr/sbin/nginx", "/usr/local/sbin/nginx"].first {
            FileManager.default.isExecutableFile(atPath: $0)
        }
        guard let binary else { return nil }
        let folder = NSTemporaryDirectory() + "policy-bench-nginx-\(getpid())"
        try? FileManager.default.createDirectory(atPath: folder + "/logs", withIntermediateDirectories: true)
        guard
            run(
                "/usr/bin/openssl",
                [
                    "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
                    "-keyout", folder + "/key.pem", "-out", folder + "/cert.pem",
                ])
        else { return nil }
        // The system's bundle plus the bench's certificate: each client loads ~140 certificates.
        let system = (try? String(contentsOfFile: "/etc/ssl/certs/ca-certificates.crt", encoding: .utf8)) ?? ""
        let own = (try? String(contentsOfFile: folder + "/cert.pem", encoding: .utf8)) ?? ""
        let bundle = folder + "/bundle.pem"
        guard (try? (system + "\n" + own).write(toFile: bundle, atomically: true, encoding: .utf8)) != nil else {
            return nil
        }
        // FoundationNetworking on Linux trusts only the system bundle (its CA-file variable is read
        // on Android only): with --install-ca the certificate is appended to the system bundle for
        // the run and taken out at its end, and every client (libcurl's too) reads the system's.
        var systemBundle: String?
        if installCA {
            let path = "/etc/ssl/certs/ca-certificates.crt"
            guard (try? (system + "\n" + own).write(toFile: path, atomically: false, encoding: .utf8)) != nil else {
                FileHandle.standardError.write(Data("transport: --install-ca: cannot write \(path)\n".utf8))
                return nil
            }
            systemBundle = system
        }
        let ports = (0..<4).map { _ in freePort() }
        let echo = "/usr/lib/nginx/modules/ngx_http_echo_module.so"
        let hasEcho = FileManager.default.fileExists(atPath: echo)
        let slow = hasEcho ? "echo_sleep 0.02; echo '{\"status\":0}';" : "return 200 '{\"status\":0}';"
        let locations = """
                    location /get { default_type application/json; return 200 '{"status":0}'; }
                    location /post { default_type application/json; return 200 '{"status":0}'; }
                    location /slow { default_type application/json; \(slow) }
            """
        let config = """
            \(hasEcho ? "load_module \(echo);" : "")
            worker_processes 1;
            daemon off;
            master_process off;
            error_log \(folder)/logs/error.log error;
            pid \(folder)/nginx.pid;
            events { worker_connections 4096; }
            http {
                access_log off;
                keepalive_requests \(requestsPerConnection ?? 100_000);
                keepalive_timeout 75s;
                http2_max_concurrent_streams 128;
                ssl_protocols TLSv1.3;
                ssl_certificate \(folder)/cert.pem;
                ssl_certificate_key \(folder)/key.pem;
                client_body_temp_path \(folder)/body;
                proxy_temp_path \(folder)/proxy;
                fastcgi_temp_path \(folder)/fastcgi;
                uwsgi_temp_path \(folder)/uwsgi;
                scgi_temp_path \(folder)/scgi;
                server { listen 127.0.0.1:\(ports[0]);
            \(locations)
                }
                server { listen 127.0.0.1:\(ports[1]) ssl;
            \(locations)
                }
                server { listen 127.0.0.1:\(ports[2]) ssl http2;
            \(locations)
                }
                server { listen 127.0.0.1:\(ports[3]); location /status { stub_status; } }
            }
            """
        guard (try? config.write(toFile: folder + "/nginx.conf", atomically: true, encoding: .utf8)) != nil else {
            return nil
        }
        let process = Process()
        process.executableURL = URL(fileURLWithPath: binary)
        process.arguments = ["-p", folder, "-c", folder + "/nginx.conf"]
        process.standardError = FileHandle.standardError
        guard (try? process.run()) != nil else { return nil }
        let server = BenchNginx(
            folder: folder, ports: ports, caBundle: installCA ? nil : bundle, process: process,
            systemBundle: systemBundle)
        // Ready when stub_status answers.
        for _ in 0..<100 {
            if server.accepted(orNil: true) != nil { return server }
            usleep(50_000)
        }
        server.stop()
        return nil
    }

    func stop() {
        if let systemBundle {
            try? systemBundle.write(toFile: "/etc/ssl/certs/ca-certificates.crt", atomically: false, encoding: .utf8)
        }
        // SIGQUIT is nginx's graceful stop, SIGKILL if it is still there a second later.
        if process.isRunning { kill(process.processIdentifier, SIGQUIT) }
        for _ in 0..<20 where process.isRunning { usleep(50_000) }
        if process.isRunning { kill(process.processIdentifier, SIGKILL) }
        process.waitUntilExit()
        try? FileManager.default.removeItem(atPath: folder)
    }

    /// Connections nginx accepted so far (the status request itself included).
    func accepted() -> Int { accepted(orNil: false) ?? 0 }

    private func accepted(orNil: Bool) -> Int? {
        guard let easy = curl_easy_init() else { return nil }
        defer { curl_easy_cleanup(easy) }
        let box = TextBox()
        _ = "http://127.0.0.1:\(statusPort)/status".withCString { ccurl_easy_setopt_pointer(easy, CURLOPT_URL, $0) }
        _ = ccurl_easy_setopt_pointer(easy, CURLOPT_WRITEDATA, Unmanaged.passUnretained(box).toOpaque())
        _ = ccurl_easy_setopt_data_callback(easy, CURLOPT_WRITEFUNCTION) { buffer, size, count, context in
            guard let buffer, let context else { return 0 }
            let box = Unmanaged<TextBox>.fromOpaque(context).takeUnretainedValue()
            box.data.append(UnsafeRawPointer(buffer).assumingMemoryBound(to: UInt8.self), count: size * count)
            return size * count
        }
        guard curl_easy_perform(easy) == CURLE_OK else { return nil }
        // "Active connections: 1 \nserver accepts handled requests\n 5 5 9 \n..."
        let lines = String(decoding: box.data, as: UTF8.self).split(separator: "\n")
        guard lines.count > 2, let accepts = lines[2].split(separator: " ").first.flatMap({ Int($0) }) else {
            return nil
        }
        return accepts
    }

    private final class TextBox { var data = Data() }

    private static func run(_ path: String, _ arguments: [String]) -> Bool {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: path)
        process.arguments = arguments
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        guard (try? process.run()) != nil else { return false }
        process.waitUntilExit()
        return process.terminationStatus == 0
    }

    private static func freePort() -> Int {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(fd, $0, length) == 0 && getsockname(fd, $0, &length) == 0
            }
        }
        return Int(UInt16(bigEndian: address.sin_port))
    }
}
