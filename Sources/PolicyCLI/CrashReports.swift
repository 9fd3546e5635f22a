import Foundation

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// Keeps tokens out of crash reports.
///
/// Why: on Linux the Swift runtime catches a crash and runs `swift-backtrace`, whose report shows
/// the crashed thread's registers with the 16 bytes each one points to; a process holding
/// access and refresh tokens prints pieces of them on stderr, where logs collect them. The
/// runtime reads its settings (`SWIFT_BACKTRACE`) once, before `main`, so they cannot be changed
/// from inside a running process. The `policy` binary writes them into its environment in a
/// pre-initializer that runs before the runtime's (the C target `PolicyStartup`, at no cost);
/// where that could not (an empty environment), it replaces itself with a fresh copy (`execv` of
/// `/proc/self/exe`, same arguments and descriptors) at its very start, before it reads any file. The report keeps the stack frames
/// (what a bug report needs) and loses the registers, the memory they point to and the list of
/// loaded images with their paths.
///
/// A host embedding the library does the same in its own environment (see the README's
/// "Crash reports"), e.g. `SWIFT_BACKTRACE=registers=none,images=none,sanitize=yes,interactive=no`.
package enum CrashReports {
    /// Appended to any `SWIFT_BACKTRACE` the user set; later keys win, so these always hold.
    package static let settings = "registers=none,images=none,sanitize=yes,interactive=no"

    /// Restarts the process with ``settings`` in `SWIFT_BACKTRACE` unless the runtime already
    /// started with them (`alreadyApplied`: the pre-initializer set them) or they were in the
    /// environment. When the restart is impossible (no `/proc`), the runtime's crash handlers are
    /// removed instead: a crash then ends the process as the system does by default, with no
    /// report.
    package static func protect(alreadyApplied: Bool) {
        guard !alreadyApplied else { return }
        let current = getenv("SWIFT_BACKTRACE").map { String(cString: $0) } ?? ""
        guard !current.hasSuffix(settings) else { return }
        setenv("SWIFT_BACKTRACE", current.isEmpty ? settings : current + "," + settings, 1)
        execv("/proc/self/exe", CommandLine.unsafeArgv)
        // Still here: the restart failed. No report rather than one with tokens in it.
        for number in [SIGSEGV, SIGBUS, SIGILL, SIGTRAP, SIGFPE, SIGABRT, SIGQUIT] { _ = signal(number, SIG_DFL) }
    }
}
