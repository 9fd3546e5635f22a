import Dispatch
import Foundation

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// Reads a credential command's stdout and stderr on one thread, keeping at most a limit of each,
/// until both reach their end or it is told to stop; then it reads what is already in the pipes
/// and closes them.
///
/// Why a stop: a command that exits but leaves a descendant holding its output pipes (a daemon
/// started with `setsid`) never gives an end of file. Before, the refresh waited for one until the
/// command's timeout, and then failed as a timeout though the command had answered.
///
/// Concurrency contract: `start` once; `stop` from any thread; `result` after ``finished``.
final class OutputCollector: Sendable {
    struct Output: Sendable {
        var stdout = Data()
        var stderr = Data()
        var stdoutOverflow = false
        var stderrOverflow = false
    }

    private let stdoutDescriptor: Int32
    private let stderrDescriptor: Int32
    private let limits: (stdout: Int, stderr: Int)
    /// The pipe that wakes the reader when it must stop: its read end, its write end.
    private let wake: (read: Int32, write: Int32)
    private let output = Locked(Output())
    /// Signalled once the reader closed the pipes.
    let finished = DispatchSemaphore(value: 0)
    /// The inodes of the two output pipes: what a process holding them open is found by.
    let pipeInodes: Set<UInt64>

    init(stdout: Int32, stderr: Int32, stdoutLimit: Int, stderrLimit: Int) {
        stdoutDescriptor = stdout
        stderrDescriptor = stderr
        limits = (stdoutLimit, stderrLimit)
        var fds: [Int32] = [-1, -1]
        if pipe(&fds) == 0 {
            for fd in fds { _ = fcntl(fd, F_SETFD, FD_CLOEXEC) }
            _ = fcntl(fds[1], F_SETFL, fcntl(fds[1], F_GETFL) | O_NONBLOCK)
        }
        wake = (fds[0], fds[1])
        var inodes = Set<UInt64>()
        for fd in [stdout, stderr] {
            var info = stat()
            if fstat(fd, &info) == 0 { inodes.insert(UInt64(info.st_ino)) }
            // Never blocked in a read: the loop polls first, and drains without waiting at the end.
            _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
        }
        pipeInodes = inodes
    }

    func start() {
        CommandRun.onThread { [self] in run() }
    }

    /// Makes the reader take what is in the pipes now and finish.
    func stop() {
        var byte: UInt8 = 1
        _ = write(wake.write, &byte, 1)
    }

    func result() -> Output { output.withLock { $0 } }

    private func run() {
        var open = [stdoutDescriptor, stderrDescriptor]
        defer {
            close(stdoutDescriptor)
            close(stderrDescriptor)
            close(wake.read)
            close(wake.write)
            finished.signal()
        }
        while !open.isEmpty {
            var fds = open.map { pollfd(fd: $0, events: Int16(POLLIN), revents: 0) }
            fds.append(pollfd(fd: wake.read, events: Int16(POLLIN), revents: 0))
            let ready = poll(&fds, nfds_t(fds.count), -1)
            if ready < 0 {
                if errno == EINTR { continue }
                return
            }
            if fds[fds.count - 1].revents != 0 {
                // Told to stop: what is buffered now is all that is read.
                for fd in open { _ = drain(fd) }
                return
            }
            for entry in fds.dropLast() where entry.revents != 0 {
                if drain(entry.fd) { open.removeAll { $0 == entry.fd } }
            }
        }
    }

    /// Reads what `fd` has now; `true` at its end of file (or an error).
    private func drain(_ fd: Int32) -> Bool {
        var chunk = [UInt8](repeating: 0, count: 16_384)
        while true {
            let count = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if count < 0 {
                if errno == EINTR { continue }
                return errno != EAGAIN && errno != EWOULDBLOCK
            }
            if count == 0 { return true }
            let isStdout = fd == stdoutDescriptor
            let limit = isStdout ? limits.stdout : limits.stderr
            output.withLock { output in
                let kept = isStdout ? output.stdout.count : output.stderr.count
                let room = limit - kept
                if room > 0 {
                    if isStdout {
                        output.stdout.append(contentsOf: chunk[0..<min(room, count)])
                    } else {
                        output.stderr.append(contentsOf: chunk[0..<min(room, count)])
                    }
                }
                if count > room {
                    if isStdout { output.stdoutOverflow = true } else { output.stderrOverflow = true }
                }
            }
        }
    }
}

/// The processes a credential command left behind once it exited, found and killed.
///
/// The command runs as the leader of a session of its own (`POSIX_SPAWN_SETSID`), so its
/// descendants are in its process group (killed as a group), or in its session after moving to
/// a group of their own (`setpgid`), or, having called `setsid` themselves, outside both; those
/// are found by the command's output pipes they still hold. All three are killed. A descendant
/// that left the session and closed its copies of the pipes is detached for good: it no longer
/// holds the refresh up, and is not found (documented on ``ExecRefresh``).
enum Descendants {
    /// Kills the members of session `session` and every process of this user holding one of the
    /// pipes `inodes`, this process excepted.
    static func kill(session: pid_t, holding inodes: Set<UInt64>) {
        #if os(Linux)
            let me = getpid()
            let names = (try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? []
            for name in names {
                guard let pid = pid_t(name), pid != me, pid != session else { continue }
                if sessionOf(pid) == session || holds(pid, inodes) { _ = Glibc.kill(pid, SIGKILL) }
            }
        #endif
    }

    /// The session id in `/proc/PID/stat` (the sixth field; the second, the command's name, may
    /// hold spaces and parentheses, so fields are counted after its last `)`).
    static func sessionOf(_ pid: pid_t) -> pid_t? {
        guard let text = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
            let close = text.lastIndex(of: ")")
        else { return nil }
        // After "(comm)": state, ppid, pgrp, session.
        let fields = text[text.index(after: close)...].split(separator: " ")
        guard fields.count > 3, fields[0] != "Z", fields[0] != "X" else { return nil }
        return pid_t(fields[3])
    }

    /// Whether `pid` has one of the pipes open (`/proc/PID/fd/N` reads `pipe:[INODE]`).
    static func holds(_ pid: pid_t, _ inodes: Set<UInt64>) -> Bool {
        guard !inodes.isEmpty,
            let fds = try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd")
        else { return false }
        for fd in fds {
            guard let target = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(pid)/fd/\(fd)"),
                target.hasPrefix("pipe:["), target.hasSuffix("]"),
                let inode = UInt64(target.dropFirst(6).dropLast())
            else { continue }
            if inodes.contains(inode) { return true }
        }
        return false
    }
}
