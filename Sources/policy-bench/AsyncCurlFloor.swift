import CCurl
import Foundation
import ResponsePolicy

/// The `async-libcurl` client: raw libcurl behind the least an `async` Swift API needs, and
/// nothing else. One thread runs a multi handle; a caller's task hands it an easy handle set up
/// once (reused as is, never reset: no headers, no body copies, no timeouts, no cancellation, no
/// redirects rules) and awaits a continuation that the thread resumes when the transfer ends.
///
/// It is the floor under any transport on libcurl that a task awaits from the cooperative pool:
/// the request goes to the loop's thread (a wake-up when it waits in `curl_multi_poll`) and the
/// answer comes back to the pool (a wake-up of a pool thread), two hops the synchronous C
/// baseline never pays. `CurlTransport` through the engine, over this floor, is what the
/// transport and the engine cost; this floor over raw libcurl is what being `async` costs.
final class AsyncCurlFloor: @unchecked Sendable {
    // @unchecked: `shared` is a `Locked`; `onTheWire` is read and written on the loop's thread
    // only; `multi` never changes, and the callers' one call on it, `curl_multi_wakeup`, is the
    // one libcurl allows from any thread.

    /// What the loop's thread and the callers share.
    private struct Shared {
        var queued: [(UnsafeMutableRawPointer, UnsafeContinuation<Bool, Never>)] = []
        var polling = false
        var stopping = false
    }

    private let multi: UnsafeMutableRawPointer
    private let shared = Locked(Shared())
    /// The loop thread's own: the continuation of each transfer on the wire, by easy handle.
    private var onTheWire: [UnsafeMutableRawPointer: UnsafeContinuation<Bool, Never>] = [:]
    private let stopped = DispatchSemaphore(value: 0)

    init?() {
        // libcurl's global state first, as `RawCurl.measure` sets it up: `curl_easy_init` would
        // set it up on its own, `curl_multi_init` (made first here) does not.
        curl_global_init(ccurl_global_all())
        guard let multi = curl_multi_init() else { return nil }
        self.multi = multi
        _ = ccurl_multi_setopt_long(multi, CURLMOPT_PIPELINING, Int(CURLPIPE_MULTIPLEX))
        _ = ccurl_multi_setopt_long(multi, CURLMOPT_MAXCONNECTS, 64)
        let thread = Thread { [self] in run() }
        thread.name = "async-libcurl"
        thread.start()
    }

    /// Sends `easy` (set up by ``RawCurl/easyHandle(url:body:caFile:)``); true when it succeeded.
    /// One transfer per handle at a time.
    func perform(_ easy: UnsafeMutableRawPointer) async -> Bool {
        await withUnsafeContinuation { continuation in
            let wake = shared.withLock { shared in
                shared.queued.append((easy, continuation))
                return shared.polling
            }
            if wake { curl_multi_wakeup(multi) }
        }
    }

    /// Ends the loop and waits for its thread; every transfer must have ended.
    func stop() {
        shared.withLock { $0.stopping = true }
        curl_multi_wakeup(multi)
        stopped.wait()
        curl_multi_cleanup(multi)
    }

    private func run() {
        var running: Int32 = 0
        while true {
            let (queued, stopping) = shared.withLock { shared in
                defer { shared.queued.removeAll(keepingCapacity: true) }
                return (shared.queued, shared.stopping)
            }
            for (easy, continuation) in queued {
                onTheWire[easy] = continuation
                curl_multi_add_handle(multi, easy)
            }
            if stopping && onTheWire.isEmpty { break }
            curl_multi_perform(multi, &running)
            var left: Int32 = 0
            while let message = curl_multi_info_read(multi, &left) {
                guard message.pointee.msg == CURLMSG_DONE, let easy = message.pointee.easy_handle else { continue }
                let succeeded = ccurl_message_result(message) == CURLE_OK
                curl_multi_remove_handle(multi, easy)
                onTheWire.removeValue(forKey: easy)?.resume(returning: succeeded)
            }
            let idle = shared.withLock { shared in
                shared.polling = shared.queued.isEmpty && !shared.stopping
                return shared.polling
            }
            if idle { curl_multi_poll(multi, nil, 0, 1_000, nil) }
            shared.withLock { $0.polling = false }
        }
        stopped.signal()
    }
}
