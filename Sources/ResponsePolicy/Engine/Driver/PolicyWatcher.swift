import Dispatch
import Foundation

/// Reloads an engine's policy when its file changes, and on SIGHUP.
///
/// Why polling: it works the same on every platform and filesystem (network mounts, editors that
/// write a new file and rename it over the old one, config-map symlink swaps in containers), and
/// a policy file changes rarely. Every `interval` the watcher compares the file's modification
/// time, size and inode; when they change, it reads the file and waits for it to settle: only a
/// file whose modification time, size and content are still the same `settle` later is handed to
/// ``PolicyEngine/reload(contentsOf:)`` (if its bytes differ from what is running). So a file
/// caught half-written — many prefixes of a policy are valid policies — is never loaded. A file
/// that fails lint is refused (the engine emits `reload` with `ok: false` and keeps the running
/// policy); a later good edit is picked up as usual. SIGHUP reloads at once, changed or not: send
/// it once the file is complete.
///
/// Replace the file atomically all the same: write the new policy to a temporary file in the same
/// directory, then rename it over the old one (`mv new.yaml policy.yaml`, or what editors and
/// config-map updates do). `rename(2)` swaps the whole file at once, so a reader sees the old
/// policy or the new one, never a mix.
///
/// ```swift
/// let watcher = PolicyWatcher(engine: engine, url: policyURL)
/// watcher.start()          // polls every 2 s and listens for SIGHUP
/// ...
/// watcher.stop()
/// ```
///
/// Concurrency contract: `start`, `stop` and `check` may be called from any task; checks never
/// overlap (a check that finds another running returns `.unchanged`). `stop` ends polling and
/// the signal handler; a check already running finishes.
public final class PolicyWatcher: Sendable {
    /// What one check did.
    public enum Outcome: Sendable, Equatable {
        /// The file is as it was loaded (or another check is running).
        case unchanged
        /// The changed file was loaded; `name` is its policy's name.
        case reloaded(name: String)
        /// The changed file has errors (or plugins that cannot be made); the running policy stays.
        case refused(diagnostics: [Diagnostic])
        /// The file could not be read; the running policy stays.
        case unreadable(reason: String)
        /// The file changed and is waiting to stay the same for `settle` before it is loaded.
        case settling
    }

    private struct FileStamp: Equatable {
        var modified: Date?
        var size: Int?
        var inode: Int?
    }

    /// A change seen but not loaded yet: what the file looked like, and since when.
    private struct Pending {
        var stamp: FileStamp
        var bytes: [UInt8]
        var since: Duration
    }

    private struct State {
        var stamp: FileStamp?
        var bytes: [UInt8]?
        var pending: Pending?
        var checking = false
        var poller: Task<Void, Never>?
        /// Its number in ``SIGHUPListeners`` while it listens for SIGHUP.
        var listening: UInt64?
    }

    package let engine: PolicyEngine
    package let url: URL
    package let interval: Duration
    /// How long a changed file must stay the same (modification time, size, content) before it is
    /// loaded; `500ms` by default.
    package let settle: Duration
    private let clock: any PolicyClock
    private let state = Locked(State())

    /// - Parameters:
    ///   - engine: the engine to reload.
    ///   - url: the policy file.
    ///   - interval: how often to look at the file; `2s` by default.
    ///   - settle: how long a changed file must stay the same before it is loaded; `500ms` by
    ///     default. `.zero` loads a change as soon as it is seen.
    ///   - clock: what the polling sleeps on; the system clock by default.
    public init(
        engine: PolicyEngine, url: URL, interval: Duration = .seconds(2), settle: Duration = .milliseconds(500),
        clock: any PolicyClock = SystemPolicyClock()
    ) {
        self.engine = engine
        self.url = url
        self.interval = interval
        self.settle = settle
        self.clock = clock
        // What the engine runs now counts as loaded, so the first check reloads only on change.
        let stamp = Self.stamp(url)
        let bytes = try? Policy.readFile(url.path, limits: .default)
        state.withLock { state in
            state.stamp = stamp
            state.bytes = bytes
        }
    }

    deinit {
        stop()
    }

    /// Starts polling every `interval`, and reloading on SIGHUP when `onSIGHUP` is true (the
    /// default). SIGHUP's default action (terminate) is replaced for the whole process. The
    /// signal source becomes active asynchronously: a SIGHUP sent at the very moment of `start`
    /// may be missed.
    public func start(onSIGHUP: Bool = true) {
        let weakSelf = WeakReference(self)
        let interval = interval
        let settle = settle
        let clock = clock
        let poller = Task {
            var next = clock.now + interval
            while !Task.isCancelled {
                do { try await clock.sleep(until: next) } catch { return }
                guard let watcher = weakSelf.value else { return }
                // A file settling is looked at again after `settle`, not a whole interval later.
                next = clock.now + (watcher.check() == .settling ? max(settle, .milliseconds(1)) : interval)
            }
        }
        let listening = onSIGHUP ? SIGHUPListeners.shared.add(weakSelf) : nil
        let previous = state.withLock { state in
            let previous = (state.poller, state.listening)
            state.poller = poller
            state.listening = listening
            return previous
        }
        previous.0?.cancel()
        if let number = previous.1 { SIGHUPListeners.shared.remove(number) }
    }

    /// Stops polling and listening for SIGHUP.
    public func stop() {
        let (poller, listening) = state.withLock { state in
            let taken = (state.poller, state.listening)
            state.poller = nil
            state.listening = nil
            return taken
        }
        poller?.cancel()
        if let number = listening { SIGHUPListeners.shared.remove(number) }
    }

    /// Looks at the file now; reloads when it changed (or always, with `force`).
    @discardableResult
    public func check(force: Bool = false) -> Outcome {
        let stamp = Self.stamp(url)
        let proceed = state.withLock { state -> Bool in
            guard !state.checking, force || stamp != state.stamp else { return false }
            state.checking = true
            return true
        }
        guard proceed else { return .unchanged }
        defer { state.withLock { $0.checking = false } }
        let bytes: [UInt8]
        do {
            bytes = try Policy.readFile(url.path, limits: .default)
        } catch {
            return .unreadable(reason: error.description)
        }
        if !force, settle > .zero {
            // Loaded only once it has stayed the same for `settle`: a writer may not be done.
            let now = clock.now
            let settled = state.withLock { state -> Bool in
                if let pending = state.pending, pending.stamp == stamp, pending.bytes == bytes {
                    return now - pending.since >= settle
                }
                state.pending = Pending(stamp: stamp, bytes: bytes, since: now)
                return false
            }
            guard settled else { return .settling }
        }
        let same = state.withLock { state -> Bool in
            state.stamp = stamp
            state.pending = nil
            return state.bytes == bytes
        }
        if same && !force { return .unchanged }
        do {
            let policy = try engine.reload(contentsOf: url)
            state.withLock { $0.bytes = bytes }
            return .reloaded(name: policy.name)
        } catch {
            // Remember the refused bytes too: the same broken file is not retried every poll.
            state.withLock { $0.bytes = bytes }
            return .refused(diagnostics: error.diagnostics)
        }
    }

    private static func stamp(_ url: URL) -> FileStamp {
        let attributes = try? FileManager.default.attributesOfItem(atPath: url.path)
        return FileStamp(
            modified: attributes?[.modificationDate] as? Date, size: (attributes?[.size] as? NSNumber)?.intValue,
            inode: (attributes?[.systemFileNumber] as? NSNumber)?.intValue)
    }
}

/// The watchers that listen for SIGHUP, behind one dispatch signal source made once per process
/// and never cancelled. A source per watcher, made and cancelled as watchers start and stop,
/// raced in libdispatch on Linux (where a signal source is a `signalfd` shared by every source of
/// the signal): a watcher restarted while another stopped could stop hearing the signal. SIGHUP's
/// default action (terminate) is replaced by "ignore" once, before the source is made; setting it
/// again afterwards would replace the handler dispatch relies on.
final class SIGHUPListeners: Sendable {
    static let shared = SIGHUPListeners()

    private struct State {
        var next: UInt64 = 0
        var watchers: [UInt64: WeakReference<PolicyWatcher>] = [:]
        var source: (any DispatchSourceSignal)?
    }

    private let state = Locked(State())

    /// Starts delivering SIGHUP to `watcher` (a forced check); the number to remove it with.
    func add(_ watcher: WeakReference<PolicyWatcher>) -> UInt64 {
        let (number, made) = state.withLock { state -> (UInt64, Bool) in
            state.next += 1
            state.watchers[state.next] = watcher
            return (state.next, state.source != nil)
        }
        if !made { makeSource() }
        return number
    }

    func remove(_ number: UInt64) {
        _ = state.withLock { $0.watchers.removeValue(forKey: number) }
    }

    private func makeSource() {
        state.withLock { state in
            guard state.source == nil else { return }
            signal(SIGHUP, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: SIGHUP, queue: .global())
            source.setEventHandler { [self] in
                let watchers = self.state.withLock { Array($0.watchers.values) }
                for watcher in watchers { _ = watcher.value?.check(force: true) }
            }
            source.resume()
            state.source = source
        }
    }
}
