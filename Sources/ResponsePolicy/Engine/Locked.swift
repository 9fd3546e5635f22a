#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// A value behind a pthread mutex: the one place each piece of shared mutable state lives.
///
/// Why not `Synchronization.Mutex`: on Linux it is built on raw futexes that ThreadSanitizer
/// does not see, so every access under it is reported as a race (reproduced with a ten-line
/// program: two reports with `Mutex`, none with a pthread mutex). The engine's concurrency
/// tests run under TSan in CI, and a sanitizer that cries wolf on every access would hide real
/// races. A pthread mutex is intercepted by TSan and costs the same uncontended.
///
/// Concurrency contract: `withLock` may be called from any thread; it is not reentrant (calling
/// it again from inside `body` deadlocks), and `body` must not suspend (it is synchronous).
package final class Locked<Value>: @unchecked Sendable {
    // @unchecked: `value` is only read or written inside `withLock`, between lock and unlock of
    // `mutex`, which is allocated once and never moves, so every access is serialised.
    private var value: Value
    private let mutex: UnsafeMutablePointer<pthread_mutex_t>

    package init(_ value: Value) {
        self.value = value
        mutex = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)
        mutex.initialize(to: pthread_mutex_t())
        pthread_mutex_init(mutex, nil)
    }

    deinit {
        pthread_mutex_destroy(mutex)
        mutex.deinitialize(count: 1)
        mutex.deallocate()
    }

    /// Runs `body` with exclusive access to the value.
    @inline(__always)
    package func withLock<R, E: Error>(_ body: (inout Value) throws(E) -> R) throws(E) -> R {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return try body(&value)
    }
}
