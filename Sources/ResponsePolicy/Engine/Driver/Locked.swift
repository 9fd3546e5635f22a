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
/// A copy shares the value and the mutex with the original (it is a reference). The mutex is
/// allocated in the same block as the value, so a `Locked` costs one allocation: the engine
/// makes one per attempt (``AttemptCancellation``).
///
/// Concurrency contract: `withLock` may be called from any thread; it is not reentrant (calling
/// it again from inside `body` deadlocks), and `body` must not suspend (it is synchronous).
package struct Locked<Value>: @unchecked Sendable {
    // @unchecked: the value is only read or written inside `withLock`, between lock and unlock of
    // the storage's mutex, which lives in the storage's tail allocation and never moves.
    private let storage: LockedStorage<Value>

    package init(_ value: Value) {
        storage = LockedStorage.make(value)
    }

    /// Runs `body` with exclusive access to the value.
    @inline(__always)
    package func withLock<R, E: Error>(_ body: (inout Value) throws(E) -> R) throws(E) -> R {
        try storage.withLock(body)
    }

    #if DEBUG
        /// How often the lock was taken (debug builds only, for the tests that count the
        /// engine's lock acquisitions per attempt). Read under the lock, so it counts itself.
        package var acquisitions: Int { storage.withLock { _ in storage.acquisitions } }
    #endif
}

/// The value as the header and the mutex as the single tail element of one heap block.
final class LockedStorage<Value>: ManagedBuffer<Value, pthread_mutex_t> {
    #if DEBUG
        /// Lock acquisitions, counted under the lock (debug builds only).
        nonisolated(unsafe) var acquisitions = 0
    #endif

    static func make(_ value: Value) -> LockedStorage<Value> {
        let buffer = unsafeDowncast(create(minimumCapacity: 1) { _ in value }, to: LockedStorage<Value>.self)
        buffer.withUnsafeMutablePointerToElements { mutex in
            mutex.initialize(to: pthread_mutex_t())
            pthread_mutex_init(mutex, nil)
        }
        return buffer
    }

    deinit {
        // The header (the value) is destroyed by `ManagedBuffer`; the element is ours.
        withUnsafeMutablePointerToElements { mutex in
            pthread_mutex_destroy(mutex)
            mutex.deinitialize(count: 1)
        }
    }

    @inline(__always)
    func withLock<R, E: Error>(_ body: (inout Value) throws(E) -> R) throws(E) -> R {
        try withUnsafeMutablePointers { value, mutex throws(E) -> R in
            pthread_mutex_lock(mutex)
            defer { pthread_mutex_unlock(mutex) }
            #if DEBUG
                acquisitions &+= 1
            #endif
            return try body(&value.pointee)
        }
    }
}
