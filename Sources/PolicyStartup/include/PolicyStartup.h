#ifndef POLICY_STARTUP_H
#define POLICY_STARTUP_H

/// Non-zero when the `policy` binary's pre-initializer put the crash-report settings into
/// SWIFT_BACKTRACE before the Swift runtime read it (see PolicyStartup.c).
int policy_crash_reports_protected(void);

/// Puts back the environment variable whose slot the pre-initializer lent to SWIFT_BACKTRACE.
void policy_restore_environment(void);

/// Wraps the Swift runtime's crash handlers so that, once the crash report is written, the process
/// ends by the crash's signal: a SIGSEGV or SIGQUIT sent with kill(2) made the runtime report and
/// then carry on. A report still being written after `seconds` (2 when 0) is cut and the process
/// ends anyway. Call from `main`, after the runtime installed its handlers.
void policy_exit_after_crash_reports(unsigned seconds);

#endif
