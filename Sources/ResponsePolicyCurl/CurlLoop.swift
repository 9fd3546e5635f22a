import CCurl
import Foundation
import ResponsePolicy

/// One libcurl multi handle and the thread that drives it.
///
/// Every transfer of a ``CurlTransport`` (and of its session-call side) runs here, so they share
/// one connection cache (kept-alive HTTP/1.1 connections and HTTP/2 connections multiplexed for
/// every method), one CA store (libcurl caches it per multi handle: `CURLOPT_CA_CACHE_TIMEOUT`,
/// loaded once a day instead of once per TLS connection) and one TLS session cache and DNS cache
/// (a share handle).
///
/// It is also a task executor (``CurlTransport/executor``): jobs of tasks that prefer it run on
/// the loop's thread between libcurl's turns, so such a task hands a transfer to libcurl and is
/// resumed by its end without waking another thread.
///
/// Concurrency contract: ``add(_:)``, ``remove(_:)``, ``enqueue(_:)`` and ``shutdown()`` may be
/// called from any thread; they queue a command or a job under a lock and wake the loop
/// (`curl_multi_wakeup`) only when it waits in `curl_multi_poll` (a thread that runs looks at
/// the queues before it waits again). Only the loop's thread touches the multi handle,
/// the easy handles and the share handle, so libcurl needs no locking of its own. Continuations
/// are resumed by ``CurlTransfer``, and jobs run, never under this lock. That is why the
/// `@unchecked Sendable` is safe: the mutable state shared between threads is `commands`, behind
/// its lock.
final class CurlLoop: TaskExecutor, @unchecked Sendable {
    private enum Command {
        case add(CurlTransfer)
        case remove(CurlTransfer)
    }

    private struct Commands {
        var queue: [Command] = []
        /// Jobs of tasks that prefer this loop as their executor (see ``enqueue(_:)``).
        var jobs: [UnownedJob] = []
        var shutdown = false
        /// The loop's thread has ended: a job enqueued now runs on Dispatch's global queue.
        var ended = false
        /// The loop's thread waits in `curl_multi_poll` (or is about to): a command or a job
        /// queued now must wake it. Otherwise the thread is running and looks at the queues
        /// before it waits again, so no wake-up (a system call on each side) is needed; under
        /// load, most requests arrive that way.
        var polling = false
    }

    // `Locked` (a pthread mutex), not Synchronization's `Mutex`: ThreadSanitizer on Linux does not
    // see `Mutex`'s futex and reports every access under it as a race (CI's TSan step did).
    private let commands = Locked(Commands())
    private let multi: UnsafeMutableRawPointer
    private let share: UnsafeMutableRawPointer
    let settings: CurlTransport.Settings

    /// The protocol each origin answered in: what `dispatch: auto` reads (HTTP/2 multiplexes).
    private let protocols = OriginProtocols()
    /// Connections libcurl opened (`CURLINFO_NUM_CONNECTS` summed): for the benchmarks.
    private let opened = Locked(0)

    // Loop-thread state.
    private var running: [UnsafeMutableRawPointer: CurlTransfer] = [:]
    /// Transfers handed to libcurl per origin, and those waiting for one of them to end.
    private var admitted: [RedirectRules.Origin: Int] = [:]
    private var waiting: [RedirectRules.Origin: Queue] = [:]
    private var lastSweep = ContinuousClock.now

    /// A first-in, first-out queue of transfers; one that was stopped while it waited is skipped
    /// when its turn comes (its continuation was resumed already).
    private struct Queue {
        private var items: [CurlTransfer] = []
        private var head = 0

        var isEmpty: Bool { head == items.count }

        mutating func append(_ transfer: CurlTransfer) { items.append(transfer) }

        func forEach(_ body: (CurlTransfer) -> Void) {
            for index in head..<items.count { body(items[index]) }
        }

        mutating func next() -> CurlTransfer? {
            guard head < items.count else { return nil }
            defer {
                head += 1
                if head > 1_024, head * 2 > items.count {
                    items.removeFirst(head)
                    head = 0
                }
            }
            return items[head]
        }
    }
    private var idleHandles: [UnsafeMutableRawPointer] = []

    private static let initialized: Bool = {
        curl_global_init(ccurl_global_all()) == CURLE_OK
    }()

    init?(settings: CurlTransport.Settings) {
        guard Self.initialized, let multi = curl_multi_init(), let share = curl_share_init() else { return nil }
        self.multi = multi
        self.share = share
        self.settings = settings
        _ = ccurl_multi_setopt_long(multi, CURLMOPT_PIPELINING, Int(CURLPIPE_MULTIPLEX))
        // No CURLMOPT_MAX_HOST_CONNECTIONS: a transfer libcurl parks for want of a connection is
        // woken only by another transfer's end, and under a storm all of them ended up parked
        // on idle connections (libcurl 7.88). The loop admits transfers per origin itself.
        _ = ccurl_multi_setopt_long(multi, CURLMOPT_MAX_CONCURRENT_STREAMS, settings.streamsPerConnection)
        _ = ccurl_multi_setopt_long(multi, CURLMOPT_MAXCONNECTS, max(16, (settings.connectionsPerHost + 2) * 4))
        _ = ccurl_share_setopt_long(share, CURLSHOPT_SHARE, Int(CURL_LOCK_DATA_DNS.rawValue))
        _ = ccurl_share_setopt_long(share, CURLSHOPT_SHARE, Int(CURL_LOCK_DATA_SSL_SESSION.rawValue))
        let thread = Thread { [self] in run() }
        thread.name = "ResponsePolicyCurl"
        thread.start()
    }

    // MARK: - Any thread

    func add(_ transfer: CurlTransfer) {
        send(.add(transfer))
    }

    func remove(_ transfer: CurlTransfer) {
        send(.remove(transfer))
    }

    /// Ends the loop once the transfers queued so far are done or removed; the thread then frees
    /// the handles.
    func shutdown() {
        commands.withLock { $0.shutdown = true }
        curl_multi_wakeup(multi)
    }

    private func send(_ command: Command) {
        let polling = commands.withLock { commands -> Bool in
            commands.queue.append(command)
            return commands.polling
        }
        if polling { curl_multi_wakeup(multi) }
    }

    /// A job of a task that prefers this loop as its executor: run on the loop's thread, between
    /// libcurl's turns. Queued while the loop runs (from its own thread, a task its transfer's
    /// end resumed, or from another while it works), it needs no wake-up; after the loop ended
    /// (its transport was released), it runs on Dispatch's global queue.
    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        let (ended, polling) = commands.withLock { commands -> (Bool, Bool) in
            if !commands.ended { commands.jobs.append(job) }
            return (commands.ended, commands.polling)
        }
        if ended {
            DispatchQueue.global().async { [self] in job.runSynchronously(on: asUnownedTaskExecutor()) }
        } else if polling {
            curl_multi_wakeup(multi)
        }
    }

    func speaksHTTP2(_ url: URL) -> Bool? {
        let origin = RedirectRules.origin(url)
        return protocols.multiplexes(origin)
    }

    var connectionsOpened: Int { opened.withLock { $0 } }

    // MARK: - The loop's thread

    private func run() {
        var stillRunning: Int32 = 0
        var shutdown = false
        while true {
            // The commands, then the jobs (which may queue transfers: the next round begins
            // them); a few rounds while jobs keep coming, so that a task's next request goes out
            // in this turn.
            for _ in 0..<4 {
                let (queue, jobs, stop) = commands.withLock { commands -> ([Command], [UnownedJob], Bool) in
                    defer {
                        commands.queue.removeAll(keepingCapacity: true)
                        commands.jobs.removeAll(keepingCapacity: true)
                    }
                    return (commands.queue, commands.jobs, commands.shutdown)
                }
                shutdown = stop
                for command in queue {
                    switch command {
                    case .add(let transfer): begin(transfer)
                    case .remove(let transfer): end(transfer)
                    }
                }
                for job in jobs { job.runSynchronously(on: asUnownedTaskExecutor()) }
                if jobs.isEmpty { break }
            }
            if shutdown, running.isEmpty, commands.withLock({ $0.queue.isEmpty && $0.jobs.isEmpty }) { break }
            curl_multi_perform(multi, &stillRunning)
            var left: Int32 = 0
            while let message = curl_multi_info_read(multi, &left) {
                guard message.pointee.msg == CURLMSG_DONE, let easy = message.pointee.easy_handle else { continue }
                completed(easy, ccurl_message_result(message))
            }
            if !waiting.isEmpty { sweepWaiting() }
            // Work queued meanwhile (a task resumed by a transfer's end, a request from another
            // thread) is not waited for: the next round runs it and lets libcurl read what came.
            // Otherwise the thread waits, marked as waiting under the same lock the queues are
            // read under, so a command queued from then on wakes it.
            let pending = commands.withLock { commands -> Bool in
                let pending = !commands.queue.isEmpty || !commands.jobs.isEmpty
                if !pending { commands.polling = true }
                return pending
            }
            if !pending {
                curl_multi_poll(multi, nil, 0, waiting.isEmpty ? 1_000 : 100, nil)
                commands.withLock { $0.polling = false }
            }
        }
        let late = commands.withLock { commands -> [UnownedJob] in
            commands.ended = true
            defer { commands.jobs = [] }
            return commands.jobs
        }
        for job in late { job.runSynchronously(on: asUnownedTaskExecutor()) }
        // The waiting first, so that no ending transfer admits one of them.
        for origin in Array(waiting.keys) {
            while let transfer = waiting[origin]?.next() {
                transfer.finish(.failure(TransportError(.connection, "\(transfer.label): the transport was shut down")))
            }
        }
        waiting = [:]
        for transfer in running.values {
            transfer.finish(.failure(TransportError(.connection, "\(transfer.label): the transport was shut down")))
            end(transfer)
        }
        for easy in idleHandles { curl_easy_cleanup(easy) }
        curl_multi_cleanup(multi)
        curl_share_cleanup(share)
    }

    /// How many transfers to `origin` libcurl carries at once: the connections per host, two
    /// more for the engine's refresh and logout calls; over HTTP/2, 100 streams on each.
    private func admissionLimit(_ origin: RedirectRules.Origin) -> Int {
        let connections = settings.connectionsPerHost + 2
        return protocols.multiplexes(origin) == true ? connections * settings.streamsPerConnection : connections
    }

    private func begin(_ transfer: CurlTransfer) {
        guard !transfer.isFinished else { return }
        let origin = transfer.origin
        guard admitted[origin, default: 0] < admissionLimit(origin) else {
            waiting[origin, default: Queue()].append(transfer)
            return
        }
        admitted[origin, default: 0] += 1
        let easy = idleHandles.popLast() ?? curl_easy_init()
        guard let easy else {
            release(origin)
            transfer.finish(.failure(TransportError(.connection, "\(transfer.label): libcurl could not make a handle")))
            return
        }
        transfer.easy = easy
        let request = transfer.request
        configure(easy, transfer, request)
        running[easy] = transfer
        if curl_multi_add_handle(multi, easy) != CURLM_OK {
            running[easy] = nil
            transfer.easy = nil
            curl_easy_reset(easy)
            idleHandles.append(easy)
            release(origin)
            transfer.finish(.failure(TransportError(.connection, "\(transfer.label): libcurl refused the transfer")))
        }
    }

    private func configure(_ easy: UnsafeMutableRawPointer, _ transfer: CurlTransfer, _ request: HTTPRequest) {
        // The transfer outlives the handle's use of it: `running` holds it until `end`.
        let context = Unmanaged.passUnretained(transfer).toOpaque()
        _ = request.url.absoluteString.withCString { ccurl_easy_setopt_pointer(easy, CURLOPT_URL, $0) }
        _ = ccurl_easy_setopt_long(easy, CURLOPT_NOSIGNAL, 1)
        _ = ccurl_easy_setopt_long(easy, CURLOPT_FOLLOWLOCATION, 0)
        _ = ccurl_easy_setopt_pointer(easy, CURLOPT_SHARE, UnsafeRawPointer(share))
        // Over TLS, wait for the first connection's ALPN rather than open one per transfer: if it
        // is HTTP/2 they all go on it as streams.
        if transfer.sentAgain {
            // Its first connection failed it before any answer: a new one of its own this time.
            _ = ccurl_easy_setopt_long(easy, CURLOPT_FRESH_CONNECT, 1)
        } else if transfer.origin.scheme == "https" {
            _ = ccurl_easy_setopt_long(easy, CURLOPT_PIPEWAIT, 1)
        }
        _ = ccurl_easy_setopt_long(
            easy, CURLOPT_HTTP_VERSION,
            Int(settings.http2 ? CURL_HTTP_VERSION_2TLS : CURL_HTTP_VERSION_1_1))
        // The CA store is read once and kept for a day. libcurl caches it only when no CA folder
        // is set, and Debian's libcurl sets /etc/ssl/certs as one by default: without this, every
        // new TLS connection reads the whole system bundle again (25-35 ms of CPU, issue 33).
        _ = ccurl_easy_setopt_pointer(easy, CURLOPT_CAPATH, nil)
        _ = ccurl_easy_setopt_long(easy, CURLOPT_CA_CACHE_TIMEOUT, 86_400)
        if let caFile = settings.caFile {
            _ = caFile.withCString { ccurl_easy_setopt_pointer(easy, CURLOPT_CAINFO, $0) }
        }
        _ = "http,https".withCString { ccurl_easy_setopt_pointer(easy, CURLOPT_PROTOCOLS_STR, $0) }
        // Every encoding libcurl can decode, decoded before the write callback counts the bytes.
        _ = "".withCString { ccurl_easy_setopt_pointer(easy, CURLOPT_ACCEPT_ENCODING, $0) }
        let left = (transfer.deadline - ContinuousClock.now).components
        let milliseconds = left.seconds * 1_000 + left.attoseconds / 1_000_000_000_000_000
        _ = ccurl_easy_setopt_long(easy, CURLOPT_TIMEOUT_MS, Int(max(1, min(milliseconds, Int64(Int32.max)))))
        _ = ccurl_easy_setopt_pointer(easy, CURLOPT_ERRORBUFFER, transfer.errorBuffer)
        _ = ccurl_easy_setopt_data_callback(easy, CURLOPT_HEADERFUNCTION, curlHeaderCallback)
        _ = ccurl_easy_setopt_pointer(easy, CURLOPT_HEADERDATA, context)
        _ = ccurl_easy_setopt_data_callback(easy, CURLOPT_WRITEFUNCTION, curlWriteCallback)
        _ = ccurl_easy_setopt_pointer(easy, CURLOPT_WRITEDATA, context)

        var list: UnsafeMutablePointer<curl_slist>?
        for field in request.headers {
            // `Name;` sends a field with an empty value (`Name:` would remove libcurl's own).
            let line = field.value.isEmpty ? field.name + ";" : field.name + ": " + field.value
            list = curl_slist_append(list, line)
        }
        // libcurl's defaults that URLSession does not add: no `Expect: 100-continue` (a round
        // trip), no form Content-Type for a body that has none.
        list = curl_slist_append(list, "Expect:")
        let method = request.method.uppercased()
        if transfer.sendsBody {
            if request.headers["Content-Type"] == nil { list = curl_slist_append(list, "Content-Type:") }
            _ = ccurl_easy_setopt_long(easy, CURLOPT_POST, 1)
            _ = ccurl_easy_setopt_offset(easy, CURLOPT_POSTFIELDSIZE_LARGE, curl_off_t(transfer.requestBody.count))
            _ = ccurl_easy_setopt_data_callback(easy, CURLOPT_READFUNCTION, curlReadCallback)
            _ = ccurl_easy_setopt_pointer(easy, CURLOPT_READDATA, context)
            _ = ccurl_easy_setopt_seek_callback(easy, CURLOPT_SEEKFUNCTION, curlSeekCallback)
            _ = ccurl_easy_setopt_pointer(easy, CURLOPT_SEEKDATA, context)
            if method != "POST" {
                _ = method.withCString { ccurl_easy_setopt_pointer(easy, CURLOPT_CUSTOMREQUEST, $0) }
            }
        } else if method == "HEAD" {
            _ = ccurl_easy_setopt_long(easy, CURLOPT_NOBODY, 1)
        } else if method != "GET" {
            _ = method.withCString { ccurl_easy_setopt_pointer(easy, CURLOPT_CUSTOMREQUEST, $0) }
        }
        transfer.headerList = list
        _ = ccurl_easy_setopt_pointer(easy, CURLOPT_HTTPHEADER, list)
    }

    /// libcurl said the transfer is done, with `code`.
    private func completed(_ easy: UnsafeMutableRawPointer, _ code: CURLcode) {
        guard let transfer = running[easy] else { return }
        var version = 0
        _ = ccurl_easy_getinfo_long(easy, CURLINFO_HTTP_VERSION, &version)
        var connects = 0
        _ = ccurl_easy_getinfo_long(easy, CURLINFO_NUM_CONNECTS, &connects)
        if connects > 0 { opened.withLock { $0 += connects } }
        if code == CURLE_OK, version != 0 {
            let origin = transfer.origin
            let http2 = version >= Int(CURL_HTTP_VERSION_2_0)
            protocols.note(origin, multiplexes: http2)
        }
        if code != CURLE_OK {
            var headerBytes = 0
            var bodyBytesSent: curl_off_t = 0
            _ = ccurl_easy_getinfo_long(easy, CURLINFO_HEADER_SIZE, &headerBytes)
            _ = ccurl_easy_getinfo_offset(easy, CURLINFO_SIZE_UPLOAD_T, &bodyBytesSent)
            if transfer.mayGoAgain(code, headerBytes: headerBytes, bodyBytesSent: Int(bodyBytesSent)) {
                end(transfer)
                transfer.prepareToGoAgain()
                begin(transfer)
                return
            }
        }
        let result: Result<HTTPResponse, any Error>
        if code == CURLE_OK {
            result = .success(transfer.response())
        } else if case .tooLarge(let message) = transfer.abort {
            result = .failure(TransportError(.tooLarge, message))
        } else {
            result = .failure(CurlErrors.transportError(code, transfer))
        }
        end(transfer)
        transfer.finish(result)
    }

    /// Takes the transfer's handle out of the multi handle and keeps it for the next transfer
    /// (a transfer still waiting for admission is skipped when its turn comes).
    private func end(_ transfer: CurlTransfer) {
        guard let easy = transfer.easy, running.removeValue(forKey: easy) != nil else { return }
        curl_multi_remove_handle(multi, easy)
        transfer.easy = nil
        // Reset, not only configured again: libcurl keeps state of its own on a handle between
        // transfers (its count of requests sent again after a reset at reuse, at most 5 per
        // handle's life), which a reused, merely re-configured handle ran out of.
        curl_easy_reset(easy)
        if idleHandles.count < 64 { idleHandles.append(easy) } else { curl_easy_cleanup(easy) }
        release(transfer.origin)
    }

    /// Fails the transfers whose timeout passed while they waited for admission (at most every
    /// 100 ms: the queues may be long).
    private func sweepWaiting() {
        let now = ContinuousClock.now
        guard now - lastSweep >= .milliseconds(100) else { return }
        lastSweep = now
        for origin in Array(waiting.keys) {
            waiting[origin]?.forEach { transfer in
                guard transfer.deadline <= now else { return }
                transfer.finish(
                    .failure(TransportError(.timeout, "\(transfer.label): no complete response within the timeout")))
            }
        }
    }

    /// A transfer to `origin` ended: the next one waiting for it starts.
    private func release(_ origin: RedirectRules.Origin) {
        admitted[origin, default: 1] -= 1
        if admitted[origin] == 0 { admitted[origin] = nil }
        while let next = waiting[origin]?.next() {
            if waiting[origin]?.isEmpty == true { waiting[origin] = nil }
            if !next.isFinished {
                begin(next)
                return
            }
        }
        waiting[origin] = nil
    }
}

// MARK: - libcurl's callbacks (on the loop's thread)

private func transfer(_ context: UnsafeMutableRawPointer?) -> CurlTransfer? {
    context.map { Unmanaged<CurlTransfer>.fromOpaque($0).takeUnretainedValue() }
}

private let curlHeaderCallback: ccurl_data_callback = { buffer, size, count, context in
    let length = size * count
    guard let transfer = transfer(context), let buffer else { return 0 }
    let line = UnsafeBufferPointer(start: UnsafeRawPointer(buffer).assumingMemoryBound(to: UInt8.self), count: length)
    return transfer.header(line) ? length : 0
}

private let curlWriteCallback: ccurl_data_callback = { buffer, size, count, context in
    let length = size * count
    guard let transfer = transfer(context), let buffer else { return 0 }
    let chunk = UnsafeBufferPointer(start: UnsafeRawPointer(buffer).assumingMemoryBound(to: UInt8.self), count: length)
    return transfer.received(chunk) ? length : 0
}

private let curlReadCallback: ccurl_data_callback = { buffer, size, count, context in
    guard let transfer = transfer(context), let buffer else { return Int(CURL_READFUNC_ABORT) }
    return transfer.read(into: UnsafeMutableRawBufferPointer(start: buffer, count: size * count))
}

private let curlSeekCallback: ccurl_seek_callback = { context, offset, origin in
    guard origin == SEEK_SET, let transfer = transfer(context) else { return ccurl_seek_fail() }
    return transfer.seek(to: Int(offset)) ? ccurl_seek_ok() : ccurl_seek_fail()
}
