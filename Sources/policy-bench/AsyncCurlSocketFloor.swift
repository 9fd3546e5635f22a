#if os(Linux)
    import CCurl
    import Foundation
    import ResponsePolicy

    /// The `async-libcurl-socket` client: `async-libcurl` (``AsyncCurlFloor``) without its first
    /// hop. The caller's thread hands the easy handle to libcurl and sends the request itself
    /// (`curl_multi_socket_action` under a lock, libcurl's socket interface); a thread waiting in
    /// epoll reads the answer and resumes the caller's continuation. So an awaited request pays
    /// one hop (the answer back to the cooperative pool) where `async-libcurl` pays two, and this
    /// says what the first one costs: whether a transport on libcurl could come closer to raw
    /// libcurl by sending on the caller's thread.
    ///
    /// Concurrency contract: every call into the multi handle, and every field below `lock`, is
    /// made under `lock` (libcurl's socket and timer callbacks run inside those calls); the
    /// epoll set is told about sockets from any thread (`epoll_ctl` is thread-safe) while the
    /// loop's thread waits in it outside the lock; continuations are resumed after unlocking.
    /// That is why the `@unchecked Sendable` is safe.
    final class AsyncCurlSocketFloor: @unchecked Sendable {
        private let multi: UnsafeMutableRawPointer
        private let poller: Int32
        /// An eventfd in the epoll set: wakes the loop's thread when a caller leaves libcurl a
        /// timer earlier than the one the thread waits for, or the floor stops.
        private let wakeFD: Int32
        private let lock = Locked(())
        // Under `lock`.
        private var onTheWire: [UnsafeMutableRawPointer: UnsafeContinuation<Bool, Never>] = [:]
        /// When libcurl wants `curl_multi_socket_action(CURL_SOCKET_TIMEOUT)`; nil for never.
        private var timerDue: ContinuousClock.Instant?
        /// The loop's thread waits in epoll (or is about to), until `pollingUntil` (nil: a second).
        private var polling = false
        private var pollingUntil: ContinuousClock.Instant?
        /// The sockets in the epoll set (the eventfd aside).
        private var watching: Set<Int32> = []
        private var stopping = false
        private let stopped = DispatchSemaphore(value: 0)

        init?() {
            curl_global_init(ccurl_global_all())
            guard let multi = curl_multi_init() else { return nil }
            self.multi = multi
            poller = epoll_create1(Int32(EPOLL_CLOEXEC))
            wakeFD = ccurl_wake_make()
            _ = ccurl_epoll_watch(poller, wakeFD, CURL_POLL_IN, 0)
            _ = ccurl_multi_setopt_long(multi, CURLMOPT_PIPELINING, Int(CURLPIPE_MULTIPLEX))
            _ = ccurl_multi_setopt_long(multi, CURLMOPT_MAXCONNECTS, 64)
            let context = Unmanaged.passUnretained(self).toOpaque()
            _ = ccurl_multi_setopt_socket_callback(multi) { _, socket, what, context, _ in
                guard let context else { return -1 }
                return Unmanaged<AsyncCurlSocketFloor>.fromOpaque(context).takeUnretainedValue().watch(socket, what)
            }
            _ = ccurl_multi_setopt_pointer(multi, CURLMOPT_SOCKETDATA, context)
            _ = ccurl_multi_setopt_timer_callback(multi) { _, milliseconds, context in
                guard let context else { return -1 }
                Unmanaged<AsyncCurlSocketFloor>.fromOpaque(context).takeUnretainedValue().timerSet(milliseconds)
                return 0
            }
            _ = ccurl_multi_setopt_pointer(multi, CURLMOPT_TIMERDATA, context)
            let thread = Thread { [self] in run() }
            thread.name = "async-libcurl-socket"
            thread.start()
        }

        /// Sends `easy` (set up by ``RawCurl/easyHandle(url:body:caFile:)``); true when it
        /// succeeded. One transfer per handle at a time.
        func perform(_ easy: UnsafeMutableRawPointer) async -> Bool {
            await withUnsafeContinuation { continuation in
                let (done, wake) = lock.withLock { _ -> ([(UnsafeContinuation<Bool, Never>, Bool)], Bool) in
                    onTheWire[easy] = continuation
                    // libcurl asks (its timer callback says 0 ms) for a call at once, which writes
                    // the request on a kept-alive connection: made here, as are the timers it sets
                    // due at once after it (each would be a wake-up of the loop's thread).
                    curl_multi_add_handle(multi, easy)
                    runDueTimers()
                    // The loop's thread is woken only for a timer earlier than its wait.
                    let wake = polling && timerDue.map { due in pollingUntil.map { due < $0 } ?? true } ?? false
                    return (drain(), wake)
                }
                for (continuation, succeeded) in done { continuation.resume(returning: succeeded) }
                if wake { ccurl_wake_signal(wakeFD) }
            }
        }

        /// Ends the loop and waits for its thread; every transfer must have ended.
        func stop() {
            lock.withLock { _ in stopping = true }
            ccurl_wake_signal(wakeFD)
            stopped.wait()
            curl_multi_cleanup(multi)
            close(poller)
            close(wakeFD)
        }

        /// libcurl's socket callback, under the lock: the epoll set follows what libcurl wants
        /// watched (one system call each, the set's members known).
        private func watch(_ socket: Int32, _ what: Int32) -> Int32 {
            let watched = what == CURL_POLL_REMOVE ? watching.remove(socket) != nil : !watching.insert(socket).inserted
            return ccurl_epoll_watch(poller, socket, what, watched ? 1 : 0) == 0 ? 0 : -1
        }

        /// libcurl's timer callback, under the lock.
        private func timerSet(_ milliseconds: Int) {
            timerDue = milliseconds >= 0 ? ContinuousClock.now + .milliseconds(milliseconds) : nil
        }

        /// Calls libcurl back for its timers due now (a few in a row: one may set the next due at
        /// once); under the lock.
        private func runDueTimers() {
            var running: Int32 = 0
            for _ in 0..<8 {
                guard let due = timerDue, due <= ContinuousClock.now else { return }
                timerDue = nil
                curl_multi_socket_action(multi, CURL_SOCKET_TIMEOUT, 0, &running)
            }
        }

        /// The transfers libcurl ended, taken out of the multi handle; under the lock.
        private func drain() -> [(UnsafeContinuation<Bool, Never>, Bool)] {
            var done: [(UnsafeContinuation<Bool, Never>, Bool)] = []
            var left: Int32 = 0
            while let message = curl_multi_info_read(multi, &left) {
                guard message.pointee.msg == CURLMSG_DONE, let easy = message.pointee.easy_handle else { continue }
                curl_multi_remove_handle(multi, easy)
                if let continuation = onTheWire.removeValue(forKey: easy) {
                    done.append((continuation, ccurl_message_result(message) == CURLE_OK))
                }
            }
            return done
        }

        private func run() {
            var fds = [Int32](repeating: 0, count: 64)
            var masks = [Int32](repeating: 0, count: 64)
            while true {
                let timeout = lock.withLock { _ -> Int32? in
                    if stopping && onTheWire.isEmpty { return nil }
                    polling = true
                    pollingUntil = timerDue
                    guard let due = timerDue else { return 1_000 }
                    let left = (due - ContinuousClock.now).components
                    let milliseconds =
                        left.seconds * 1_000 + (left.attoseconds + 999_999_999_999_999) / 1_000_000_000_000_000
                    return Int32(max(0, min(milliseconds, 1_000)))
                }
                guard let timeout else { break }
                let count = ccurl_epoll_wait(poller, &fds, &masks, 64, timeout)
                let done = lock.withLock { _ -> [(UnsafeContinuation<Bool, Never>, Bool)] in
                    polling = false
                    var running: Int32 = 0
                    for index in 0..<max(0, Int(count)) {
                        if fds[index] == wakeFD {
                            ccurl_wake_drain(wakeFD)
                        } else {
                            curl_multi_socket_action(multi, fds[index], masks[index], &running)
                        }
                    }
                    runDueTimers()
                    return drain()
                }
                for (continuation, succeeded) in done { continuation.resume(returning: succeeded) }
            }
            stopped.signal()
        }
    }
#endif
