import Foundation

/// ``runPolicy(_:in:timeout:)`` on a thread of its own, for async tests.
///
/// Running the binary blocks until it exits; done on the concurrency pool's few threads (2 on a
/// 2-core CI machine), many such tests starve the suites that need the pool to make progress
/// (the simulation scheduler's tests count a pool that does not answer as a deadlock).
func runPolicyOffPool(_ arguments: [String], in directory: URL? = nil, timeout: Int = 20) async throws -> CLIResult {
    try await withCheckedThrowingContinuation { continuation in
        Thread.detachNewThread {
            continuation.resume(with: Result { try runPolicy(arguments, in: directory, timeout: timeout) })
        }
    }
}

/// ``runPolicyWithInput(_:input:in:)`` on a thread of its own.
func runPolicyWithInputOffPool(_ arguments: [String], input: URL, in directory: URL) async throws -> CLIResult {
    try await withCheckedThrowingContinuation { continuation in
        Thread.detachNewThread {
            continuation.resume(with: Result { try runPolicyWithInput(arguments, input: input, in: directory) })
        }
    }
}
