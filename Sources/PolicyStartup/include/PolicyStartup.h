#ifndef POLICY_STARTUP_H
#define POLICY_STARTUP_H

/// Non-zero when the `policy` binary's pre-initializer put the crash-report settings into
/// SWIFT_BACKTRACE before the Swift runtime read it (see PolicyStartup.c).
int policy_crash_reports_protected(void);

/// Puts back the environment variable whose slot the pre-initializer lent to SWIFT_BACKTRACE.
void policy_restore_environment(void);

#endif
