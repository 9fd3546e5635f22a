import Foundation

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// The one way the package opens a file it reads: credentials, the shared session's state and
/// lock files, policies, reload targets, secret files.
///
/// Why: these files sit in folders others may write (`/tmp`, a shared volume), and what they hold
/// decides where tokens go. Opening one the plain way follows a link another user planted, waits
/// forever on a FIFO (an `open` for reading blocks until a writer comes), or reads a file another
/// user wrote. So, before a byte is read:
///
/// - a symbolic link at the end of the path is followed only when it belongs to this user or to
///   root (as the kernel's `protected_symlinks` does in sticky folders; a Kubernetes ConfigMap or
///   Secret mount is root's links), at most 16 of them;
/// - the file itself is opened with `O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC`, so a link swapped in
///   meanwhile is refused and a FIFO or a device cannot block the open;
/// - `fstat` on the open descriptor: it must be a regular file and, for files whose contents are
///   trusted (``Owner/userOrRoot``), belong to this user or to root.
///
/// Every refusal names the path and the reason, never the contents.
///
/// ```swift
/// let bytes = try SafeFile.read("/var/lib/app/credentials.json", limit: 1 << 20, owner: .userOrRoot)
/// ```
///
/// Concurrency contract: stateless; call from any thread. Calls block on file I/O.
package enum SafeFile {
    /// Whose files may be read.
    package enum Owner: Sendable {
        /// Files whose contents decide what is sent or where tokens go (credentials, shared state,
        /// a policy an engine runs, a reload target, a secret): this user's or root's only.
        case userOrRoot
        /// Files only analysed (`policy lint`, `explain`, `graph`, `diff`): any owner. Links and
        /// FIFOs are refused as for the others.
        case anyone
    }

    /// Why a file was not opened. `missing` is set when nothing is at the path (callers that treat
    /// a missing file as empty check it).
    package struct Failure: Error, Sendable, Equatable, CustomStringConvertible {
        package var path: String
        package var reason: String
        package var missing = false

        package var description: String { "cannot read '\(path)': \(reason)" }
    }

    /// An open descriptor (close it) with its `fstat`.
    package struct Opened {
        package var descriptor: Int32
        package var status: stat
    }

    /// The most links followed at the end of a path.
    static let maxLinks = 16

    /// `path` with the symbolic links at its end followed, each checked to belong to this user or
    /// root. The result may not exist yet (a file about to be created).
    package static func resolve(_ path: String) -> Result<String, Failure> {
        var current = path
        for _ in 0...maxLinks {
            var info = stat()
            guard lstat(current, &info) == 0, info.st_mode & S_IFMT == S_IFLNK else { return .success(current) }
            guard info.st_uid == geteuid() || info.st_uid == 0 else {
                return .failure(
                    Failure(
                        path: path,
                        reason:
                            "'\(current)' is a symbolic link that belongs to another user (uid \(info.st_uid)); "
                            + "only links of this user or root are followed"))
            }
            guard let destination = try? FileManager.default.destinationOfSymbolicLink(atPath: current) else {
                return .failure(Failure(path: path, reason: "the symbolic link '\(current)' cannot be read"))
            }
            current =
                destination.hasPrefix("/")
                ? destination
                : URL(fileURLWithPath: current).deletingLastPathComponent().appendingPathComponent(destination).path
        }
        return .failure(Failure(path: path, reason: "it is behind more than \(maxLinks) symbolic links"))
    }

    /// Opens `path` for reading as described on the type.
    package static func open(_ path: String, owner: Owner) -> Result<Opened, Failure> {
        let target: String
        switch resolve(path) {
        case .failure(let failure): return .failure(failure)
        case .success(let resolved): target = resolved
        }
        let descriptor = systemOpen(target, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW)
        guard descriptor >= 0 else {
            let code = errno
            var failure = Failure(path: path, reason: reason(code))
            if code == ENOENT {
                failure.reason = PolicyError.noSuchFile
                failure.missing = true
            } else if code == ELOOP {
                failure.reason = "it is a symbolic link (replaced while it was opened)"
            }
            return .failure(failure)
        }
        var info = stat()
        guard fstat(descriptor, &info) == 0 else {
            let code = errno
            close(descriptor)
            return .failure(Failure(path: path, reason: reason(code)))
        }
        if let refusal = check(info, owner: owner) {
            close(descriptor)
            return .failure(Failure(path: path, reason: refusal))
        }
        return .success(Opened(descriptor: descriptor, status: info))
    }

    /// Why an open file may not be read: not a regular file, or another owner where that matters.
    package static func check(_ info: stat, owner: Owner) -> String? {
        switch info.st_mode & S_IFMT {
        case S_IFREG: break
        case S_IFDIR: return "it is a directory"
        default: return "it is not a regular file"
        }
        if case .userOrRoot = owner, info.st_uid != geteuid(), info.st_uid != 0 {
            return "it belongs to another user (uid \(info.st_uid)); only files of this user or root are read "
                + "(chown it, or run as its owner)"
        }
        return nil
    }

    /// An `errno` from a read.
    package struct SystemError: Error, Sendable {
        package var code: Int32
    }

    /// Reads at most `limit + 1` bytes of `fd` (so a caller can tell a file over its limit).
    package static func read(_ descriptor: Int32, limit: Int) -> Result<[UInt8], SystemError> {
        var bytes: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 65_536)
        while bytes.count <= limit {
            let wanted = min(buffer.count, limit + 1 - bytes.count)
            let count = buffer.withUnsafeMutableBytes { systemRead(descriptor, $0.baseAddress, wanted) }
            if count < 0 {
                let code = errno
                if code == EINTR { continue }
                return .failure(SystemError(code: code))
            }
            if count == 0 { break }
            bytes.append(contentsOf: buffer[0..<count])
        }
        return .success(bytes)
    }

    /// The bytes of `path` (at most `limit + 1`), `nil` when nothing is at the path.
    ///
    /// - Throws: ``Failure`` naming the path and the reason.
    package static func read(_ path: String, limit: Int, owner: Owner) throws(Failure) -> [UInt8]? {
        let opened: Opened
        switch open(path, owner: owner) {
        case .failure(let failure):
            if failure.missing { return nil }
            throw failure
        case .success(let file): opened = file
        }
        defer { close(opened.descriptor) }
        switch read(opened.descriptor, limit: limit) {
        case .success(let bytes): return bytes
        case .failure(let error): throw Failure(path: path, reason: reason(error.code))
        }
    }

    /// `strerror`'s text, lower-case as the package's messages are.
    package static func reason(_ code: Int32) -> String {
        switch code {
        case EACCES: return "permission denied"
        case ENOENT: return PolicyError.noSuchFile
        case EISDIR: return "it is a directory"
        case ENOTDIR: return "a part of the path is not a directory"
        default: return String(cString: strerror(code)).lowercased()
        }
    }
}

/// `open(2)` and `read(2)`, named apart from ``SafeFile``'s own `open` and `read`.
private func systemOpen(_ path: String, _ flags: Int32) -> Int32 { open(path, flags) }

private func systemRead(_ descriptor: Int32, _ buffer: UnsafeMutableRawPointer?, _ count: Int) -> Int {
    read(descriptor, buffer, count)
}
