/// Resumes a continuation with the first of several racing results and ignores the rest.
///
/// Concurrency contract: `resume` may be called from any thread, any number of times; exactly
/// one call resumes the continuation.
final class ResumeOnce<T: Sendable>: Sendable {
    private let continuation: Locked<CheckedContinuation<T, Never>?>

    init(_ continuation: CheckedContinuation<T, Never>) {
        self.continuation = Locked(continuation)
    }

    func resume(_ value: T) {
        let taken = continuation.withLock { stored -> CheckedContinuation<T, Never>? in
            defer { stored = nil }
            return stored
        }
        taken?.resume(returning: value)
    }
}
