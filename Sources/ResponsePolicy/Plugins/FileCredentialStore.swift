import Foundation

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// Why a ``FileCredentialStore`` could not load or save. Descriptions name the file and the
/// problem, never the file's contents, so a malformed file cannot leak a token into a log.
public enum CredentialStoreError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The file exists but could not be read (permissions, a directory, an I/O error).
    case unreadable(path: String, reason: String)
    /// The file was read but is not the credentials JSON.
    case malformed(path: String, reason: String)
    /// The new file could not be written or put in place; the old file, if any, is unchanged.
    case unwritable(path: String, reason: String)

    /// The problem, naming the file; never the file's contents.
    public var description: String {
        switch self {
        case .unreadable(let path, let reason): return "cannot read the credentials file '\(path)': \(reason)"
        case .malformed(let path, let reason): return "the credentials file '\(path)' is malformed: \(reason)"
        case .unwritable(let path, let reason): return "cannot write the credentials file '\(path)': \(reason)"
        }
    }
}

/// The `file` store: credentials in a JSON file, replaced atomically with mode 0600.
///
/// Why: a command-line tool or a service that restarts must not lose a rotated refresh token (with
/// rotation the old one is dead), and must not leave a torn or world-readable token file behind.
///
/// The file is the one `policy fetch --credentials` reads (SPEC §5):
///
/// ```json
/// {
///   "access_token": "…",
///   "refresh_token": "…",
///   "expires_at": "2025-01-31T12:00:00Z"
/// }
/// ```
///
/// `refresh_token` and `expires_at` are optional (absent or `null`); `expires_at` is an RFC 3339
/// date-time, with or without fractional seconds and with `Z` or an offset. Three more keys are
/// written when known and optional when read: `issued_at` (when the access token was issued, so
/// its lifetime as issued bounds `refresh.ahead` after a restart too), and `generation` and
/// `epoch` (what a fleet's coordinator numbered these credentials, and the session epoch they
/// belong to: a restarted process never adopts, or presents, a generation older than the one it
/// saved, and re-seeds a store that forgot; issue 30). A value of the wrong type there is
/// ignored, never a reason to refuse the tokens. Other keys are ignored when loading and not
/// written back.
///
/// Saving writes a new file next to the old one (`.<name>.tmp-<pid>-<random>`, created with
/// `O_EXCL | O_NOFOLLOW` and mode 0600), flushes it to disk and renames it over the old one. `rename(2)` is
/// atomic, so a reader — in this process or another — sees the old file or the new one, never a
/// mix, and two processes saving at once each rename a whole file of their own: the last rename
/// wins and the file is always valid. A symbolic link at `path` that belongs to this user or root is
/// followed, so the file it points to is replaced and the link stays; another user's link is not.
///
/// ```swift
/// let store = FileCredentialStore(path: "~/.config/myapp/credentials.json")
/// let engine = PolicyEngine(policy: policy, transport: URLSessionTransport(), credentials: store)
/// ```
///
/// In a policy: `store: { use: file, with: { path: /var/lib/myapp/credentials.json } }`.
///
/// Loading also tidies up after a crash and after careless hands, as ssh does for keys: temporary
/// files a killed process left next to the file (`.<name>.tmp-<pid>-…`, holding tokens) are
/// removed when that process is gone or the file is over an hour old; a credentials file that
/// others may read or write is made 0600 and reported through `warn` — once it was read as a
/// credentials file: a malformed one is refused and left as it was. Anything but a regular file
/// (a FIFO, a device) is refused rather than waited on, and so is a file that belongs to
/// another user (only this user's or root's are read, whatever their mode): see ``SafeFile``.
///
/// Concurrency contract: `load` and `save` may be called from any thread; saves from one store are
/// serialized by a lock (so they land in call order), and saves from different stores or
/// processes are safe as described above. Both block on file I/O; the engine calls them only at
/// start and after a refresh.
/// A credential store kept in a file: the file a `file` coordinator shares with the other
/// processes on the host (see ``FileSessionCoordinator``).
package protocol FileBackedCredentialStore {
    var credentialsFilePath: String { get }
}

/// Credentials as a process saves them for its next start: with the generation and session epoch
/// a fleet's coordinator gave them (issue 30), and whether the fleet has them yet.
package struct SavedCredentials: Sendable, Equatable {
    package var credentials: Credentials
    /// The generation the fleet numbered them, or for a pair not yet published the one it
    /// replaces (0: none known).
    package var generation: UInt64
    /// The session epoch they belong to (0: none known).
    package var epoch: UInt64
    /// `false` for a pair the token endpoint returned that the coordinator has not stored yet: the
    /// next start publishes it (over `generation`) before anything else.
    package var published: Bool

    package init(credentials: Credentials, generation: UInt64 = 0, epoch: UInt64 = 0, published: Bool = true) {
        self.credentials = credentials
        self.generation = generation
        self.epoch = epoch
        self.published = published
    }
}

/// A credential store that keeps, with the credentials, what a fleet's coordinator numbered them
/// (``SavedCredentials``): the engine saves it after every change and hands it to its coordinator
/// at start (``SessionCoordinator/start(saved:updates:)``), so a restarted process never takes the
/// fleet backwards and publishes a pair it could not publish before it exited.
package protocol SessionStampingStore: CredentialStore {
    func loadSaved() throws -> SavedCredentials?
    func save(_ saved: SavedCredentials) throws
}

/// Credentials kept in a JSON file (`store: file`), written atomically and readable by the owner alone.
public final class FileCredentialStore: CredentialStore, CustomStringConvertible, FileBackedCredentialStore,
    SessionStampingStore
{
    /// The credentials file, with `~` expanded.
    public let path: String
    package var credentialsFilePath: String { path }
    /// Serializes this store's saves.
    private let saving = Locked(())
    /// Where warnings go (a credentials file others could read).
    private let warn: @Sendable (String) -> Void

    /// The largest file `load` reads; credentials are far smaller.
    static let maximumSize = 1 << 20

    /// Creates a store for the file at `path`. Nothing is read or written until ``load()`` or
    /// ``save(_:)``.
    ///
    /// - Parameters:
    ///   - path: The credentials file; a leading `~` is the home directory. Relative paths are
    ///     relative to the current directory.
    ///   - warn: Receives warnings, such as a credentials file readable by others that was made
    ///     0600. By default they are written to standard error, as ssh does.
    public init(path: String, warn: (@Sendable (String) -> Void)? = nil) {
        self.path = NSString(string: path).expandingTildeInPath
        self.warn = warn ?? { message in FileHandle.standardError.write(Data("warning: \(message)\n".utf8)) }
    }

    /// Makes the store from a policy's `with: { path: … }`.
    convenience init(configuration: PluginConfiguration) throws(PluginError) {
        guard let path = configuration.string("path"), !path.isEmpty else {
            throw PluginError(kind: .store, name: configuration.name, reason: "the option 'path' is missing")
        }
        self.init(path: path)
    }

    /// Names the file; never the credentials.
    public var description: String { "FileCredentialStore('\(path)')" }

    /// Reads the credentials.
    ///
    /// - Returns: The credentials, or `nil` when the file does not exist.
    /// - Throws: ``CredentialStoreError/unreadable(path:reason:)`` when it cannot be read,
    ///   ``CredentialStoreError/malformed(path:reason:)`` when it is not the credentials JSON.
    public func load() throws -> Credentials? {
        try loadSaved()?.credentials
    }

    /// The credentials with the generation, session epoch and publication state the file keeps.
    package func loadSaved() throws -> SavedCredentials? {
        removeStaleTemporaryFiles()
        return try readFile { data throws(CredentialStoreError) in try Self.decodeSaved(data, path: self.path) }
    }

    /// Checks that a save could land: a temporary file can be created (exclusively, mode 0600)
    /// in the file's folder and removed again. Nothing else is touched.
    ///
    /// Why: with rotating refresh tokens, a refresh spends the old token; a store that then
    /// cannot save the new one has lost the session. A tool checks this before it sends anything.
    ///
    /// - Throws: ``CredentialStoreError/unwritable(path:reason:)`` naming the folder and the cause.
    package func checkWritable() throws {
        try saving.withLock { _ throws(CredentialStoreError) in
            let (fd, temporary) = try createTemporaryFile()
            close(fd)
            unlink(temporary)
        }
    }

    /// Replaces the file with `credentials`, atomically, mode 0600.
    ///
    /// - Throws: ``CredentialStoreError/unwritable(path:reason:)``; the old file is then unchanged.
    public func save(_ credentials: Credentials) throws {
        let bytes = Array(Self.encode(credentials).utf8)
        try saving.withLock { _ throws(CredentialStoreError) in try writeFile(bytes) }
    }

    /// Replaces the file with `saved`'s credentials and what the fleet numbered them (written
    /// when known), atomically, mode 0600.
    package func save(_ saved: SavedCredentials) throws {
        let bytes = Array(Self.encode(saved).utf8)
        try saving.withLock { _ throws(CredentialStoreError) in try writeFile(bytes) }
    }

    // MARK: - Format

    /// The file's text: keys in a fixed order, absent parts left out, a final newline.
    static func encode(_ credentials: Credentials) -> String { encode(SavedCredentials(credentials: credentials)) }

    static func encode(_ saved: SavedCredentials) -> String {
        let credentials = saved.credentials
        var lines = ["  \"access_token\": " + PolicyEvent.quote(credentials.accessToken)]
        if let refreshToken = credentials.refreshToken {
            lines.append("  \"refresh_token\": " + PolicyEvent.quote(refreshToken))
        }
        if let expiresAt = credentials.expiresAt {
            lines.append("  \"expires_at\": " + PolicyEvent.quote(rfc3339(expiresAt)))
        }
        if let issuedAt = credentials.issuedAt {
            lines.append("  \"issued_at\": " + PolicyEvent.quote(rfc3339(issuedAt)))
        }
        if saved.generation > 0 { lines.append("  \"generation\": \(saved.generation)") }
        if saved.epoch > 0 { lines.append("  \"epoch\": \(saved.epoch)") }
        if !saved.published { lines.append("  \"published\": false") }
        return "{\n" + lines.joined(separator: ",\n") + "\n}\n"
    }

    /// The file's credentials with what it keeps of the fleet's numbering (0 and published when
    /// absent or unusable: a stamp never costs the tokens).
    static func decodeSaved(_ data: Data, path: String) throws(CredentialStoreError) -> SavedCredentials {
        var credentials = try decode(data, path: path)
        let object = (try? JSONSerialization.jsonObject(with: data)) as? [String: Any]
        func number(_ key: String) -> UInt64 {
            guard let value = object?[key] as? NSNumber, value.doubleValue.isFinite, value.doubleValue >= 0,
                value.doubleValue < 9e15, value.doubleValue == value.doubleValue.rounded()
            else { return 0 }
            return value.uint64Value
        }
        if let text = object?["issued_at"] as? String, let date = parseRFC3339(text) { credentials.issuedAt = date }
        let generation = number("generation")
        return SavedCredentials(
            credentials: credentials, generation: generation, epoch: min(number("epoch"), generation),
            published: (object?["published"] as? Bool) != false)
    }

    /// Parses the file's bytes. Reasons name keys and expectations, never values.
    static func decode(_ data: Data, path: String) throws(CredentialStoreError) -> Credentials {
        func malformed(_ reason: String) -> CredentialStoreError { .malformed(path: path, reason: reason) }
        guard let parsed = try? JSONSerialization.jsonObject(with: data) else {
            throw malformed("it is not valid JSON")
        }
        guard let object = parsed as? [String: Any] else { throw malformed("it is not a JSON object") }
        guard let accessToken = object["access_token"] as? String, !accessToken.isEmpty else {
            throw malformed(
                object["access_token"] == nil
                    ? "'access_token' is missing" : "'access_token' is not a non-empty text")
        }
        var refreshToken: String?
        if let value = object["refresh_token"], !(value is NSNull) {
            guard let text = value as? String else { throw malformed("'refresh_token' is not a text") }
            refreshToken = text.isEmpty ? nil : text
        }
        var expiresAt: Date?
        if let value = object["expires_at"], !(value is NSNull) {
            guard let text = value as? String, let date = parseRFC3339(text) else {
                throw malformed("'expires_at' is not an RFC 3339 date-time like 2025-01-31T12:00:00Z")
            }
            expiresAt = date
        }
        return Credentials(accessToken: accessToken, refreshToken: refreshToken, expiresAt: expiresAt)
    }

    /// `2025-01-31T12:00:00Z` (whole seconds, UTC).
    package static func rfc3339(_ date: Date) -> String {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime]
        return formatter.string(from: date)
    }

    /// An RFC 3339 date-time, with or without fractional seconds; `t`, `z` and a space for `T`
    /// are accepted as §5.6 allows.
    static func parseRFC3339(_ text: String) -> Date? {
        var normalized = text.trimmingCharacters(in: .whitespaces).uppercased()
        if normalized.count > 10 {
            let separator = normalized.index(normalized.startIndex, offsetBy: 10)
            if normalized[separator] == " " { normalized.replaceSubrange(separator...separator, with: "T") }
        }
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime]
        if let date = formatter.date(from: normalized) { return date }
        formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        return formatter.date(from: normalized)
    }

    // MARK: - Files

    /// The file's bytes, as `decode` makes them; `nil` when it does not exist. The mode of a
    /// file open to others is tightened only after `decode` accepted it: a path given by mistake
    /// (`--credentials ~/notes.txt`) is refused untouched.
    private func readFile<T>(
        _ decode: (Data) throws(CredentialStoreError) -> T
    ) throws(CredentialStoreError) -> T? {
        // Through SafeFile: a link only when it is this user's or root's, O_NOFOLLOW | O_NONBLOCK
        // (a FIFO cannot hang the load), then fstat: a regular file of this user or root (a file
        // another user put there, 0600 or not, is refused, never read or replaced).
        let fd: Int32
        let status: stat
        switch SafeFile.open(path, owner: .userOrRoot) {
        case .failure(let failure):
            if failure.missing { return nil }
            throw .unreadable(path: path, reason: failure.reason)
        case .success(let opened): (fd, status) = (opened.descriptor, opened.status)
        }
        defer { close(fd) }
        let data: Data
        switch SafeFile.read(fd, limit: Self.maximumSize) {
        case .failure(let error): throw .unreadable(path: path, reason: SafeFile.reason(error.code))
        case .success(let bytes):
            guard bytes.count <= Self.maximumSize else {
                throw .malformed(path: path, reason: "it is larger than \(Self.maximumSize >> 20) MiB")
            }
            data = Data(bytes)
        }
        let decoded = try decode(data)
        let mode = status.st_mode & 0o777
        if mode & 0o077 != 0 {
            // As ssh refuses an unprotected key, but a store must keep working: tighten, then say so.
            if fchmod(fd, 0o600) == 0 {
                warn(
                    "the credentials file '\(path)' was open to others (mode \(String(mode, radix: 8))); its mode is now 0600"
                )
            } else {
                warn(
                    "the credentials file '\(path)' is open to others (mode \(String(mode, radix: 8))) and could not be made 0600: \(Self.errorText(errno))"
                )
            }
        }
        return decoded
    }

    /// Writes `bytes` to a fresh temporary file in the target's directory and renames it over
    /// the target.
    private func writeFile(_ bytes: [UInt8]) throws(CredentialStoreError) {
        let target = URL(fileURLWithPath: Self.followingLinks(path))
        let directory = target.deletingLastPathComponent().path
        func failure(_ what: String, _ code: Int32) -> CredentialStoreError {
            .unwritable(path: path, reason: "\(what): \(Self.errorText(code))")
        }
        let created = try createTemporaryFile()
        var fd = created.fd
        let temporary = created.path
        var written = false
        defer {
            if fd >= 0 { close(fd) }
            if !written { unlink(temporary) }
        }
        // The umask can only clear bits, but make the mode exact whatever it is.
        guard fchmod(fd, 0o600) == 0 else { throw failure("cannot set mode 0600", errno) }
        var offset = 0
        while offset < bytes.count {
            let count = bytes.withUnsafeBytes { buffer in
                write(fd, buffer.baseAddress.map { $0 + offset }, buffer.count - offset)
            }
            if count < 0 {
                if errno == EINTR { continue }
                throw failure("cannot write", errno)
            }
            offset += count
        }
        guard fsync(fd) == 0 else { throw failure("cannot flush", errno) }
        let closed = close(fd)
        fd = -1
        guard closed == 0 else { throw failure("cannot close", errno) }
        guard rename(temporary, target.path) == 0 else { throw failure("cannot replace the file", errno) }
        written = true
        // Make the rename itself durable; a failure here leaves a correct file, so it is ignored.
        let directoryFD = open(directory, O_RDONLY | O_CLOEXEC)
        if directoryFD >= 0 {
            _ = fsync(directoryFD)
            close(directoryFD)
        }
    }

    /// Creates the temporary file a save writes, next to the target (so the rename stays on one
    /// file system): `.<name>.tmp-<pid>-<64 random bits>`, created exclusively (`O_EXCL`: a
    /// planted file or link of that name makes the open fail, never followed or reused),
    /// `O_NOFOLLOW`, mode 0600 from the start. The random part comes from the system's secure
    /// generator, so the name cannot be guessed ahead.
    private func createTemporaryFile() throws(CredentialStoreError) -> (fd: Int32, path: String) {
        let target = URL(fileURLWithPath: Self.followingLinks(path))
        let directory = target.deletingLastPathComponent().path
        var code: Int32 = 0
        for _ in 0..<8 {
            let suffix = String(TemporaryNames.suffix(), radix: 16)
            let temporary = directory + "/." + target.lastPathComponent + ".tmp-\(getpid())-" + suffix
            let fd = open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
            if fd >= 0 { return (fd, temporary) }
            code = errno
            if code != EEXIST { break }
        }
        let reason = "cannot create a temporary file in '\(directory)': \(Self.errorText(code))"
        throw .unwritable(path: path, reason: reason)
    }

    /// Removes the temporary files of saves that never finished (a process killed mid-write):
    /// those of a process that no longer exists, and any over an hour old. Those of live
    /// processes, this one included, may be saves in progress and stay. Failures are ignored:
    /// tidying must never stop a load.
    func removeStaleTemporaryFiles(now: Date = Date()) {
        let target = URL(fileURLWithPath: Self.followingLinks(path))
        let directory = target.deletingLastPathComponent().path
        let prefix = "." + target.lastPathComponent + ".tmp-"
        guard let names = try? FileManager.default.contentsOfDirectory(atPath: directory) else { return }
        for name in names where name.hasPrefix(prefix) {
            let rest = name.dropFirst(prefix.count)
            guard let dash = rest.firstIndex(of: "-"), let pid = pid_t(rest[..<dash]) else { continue }
            let file = directory + "/" + name
            var status = stat()
            guard lstat(file, &status) == 0, status.st_mode & S_IFMT == S_IFREG else { continue }
            #if canImport(Darwin)
                let modified = status.st_mtimespec.tv_sec
            #else
                let modified = status.st_mtim.tv_sec
            #endif
            let age = now.timeIntervalSince1970 - Double(modified)
            let alive = pid == getpid() || kill(pid, 0) == 0 || errno == EPERM
            if !alive || age > 3_600 { unlink(file) }
        }
    }

    /// `path` with symbolic links at its end followed (to a file that may not exist yet, which
    /// `resolvingSymlinksInPath` does not do); at most 16 links, against loops. Only links of this
    /// user or root are followed (``SafeFile/resolve(_:)``): the path itself is used otherwise,
    /// so the rename replaces another user's link instead of writing where it points.
    static func followingLinks(_ path: String) -> String {
        guard case .success(let resolved) = SafeFile.resolve(path) else {
            return URL(fileURLWithPath: path).standardizedFileURL.path
        }
        return URL(fileURLWithPath: resolved).standardizedFileURL.path
    }

    private static func errorText(_ code: Int32) -> String {
        String(cString: strerror(code))
    }
}
