// Keeps tokens out of the `policy` binary's crash reports, at no cost at start.
//
// The Swift runtime reads SWIFT_BACKTRACE once, in a constructor of libswiftCore, before `main`,
// by scanning `environ`. An executable's .preinit_array runs before the constructors of every
// shared library, libc's included, and libc's own initializer then sets `environ` back to the
// process's original environment array: a setenv() here would be undone. So the setting is
// written into that array itself. An existing SWIFT_BACKTRACE entry is replaced (the user's
// settings first, ours after them: later keys win); otherwise one entry nobody reads while the
// process starts (`_`, `SHLVL`, `OLDPWD`) lends its slot and is put back from `main` with
// policy_restore_environment(). With none of those, nothing is changed and PolicyCLI's
// CrashReports.protect() restarts the process with the setting instead.

#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "PolicyStartup.h"

static int protected_crash_reports = 0;
static char *displaced = NULL;

// Kept in step with CrashReports.settings.
static const char settings[] = "registers=none,images=none,sanitize=yes,interactive=no";
static const char name[] = "SWIFT_BACKTRACE=";
static char entry[4096];

static int starts_with(const char *text, const char *prefix) { return strncmp(text, prefix, strlen(prefix)) == 0; }

static void policy_protect_crash_reports(int argc, char **argv, char **envp) {
    (void)argc;
    (void)argv;
    if (envp == NULL) return;
    size_t name_length = strlen(name);
    size_t settings_length = strlen(settings);
    for (char **slot = envp; *slot != NULL; slot++) {
        if (!starts_with(*slot, name)) continue;
        const char *current = *slot + name_length;
        size_t current_length = strlen(current);
        if (current_length >= settings_length && strcmp(current + current_length - settings_length, settings) == 0) {
            protected_crash_reports = 1;
            return;
        }
        if (name_length + current_length + 1 + settings_length + 1 > sizeof entry) return;
        memcpy(entry, name, name_length);
        memcpy(entry + name_length, current, current_length);
        size_t end = name_length + current_length;
        if (current_length > 0) entry[end++] = ',';
        memcpy(entry + end, settings, settings_length + 1);
        *slot = entry;
        protected_crash_reports = 1;
        return;
    }
    static const char *const lenders[] = {"_=", "SHLVL=", "OLDPWD="};
    for (size_t lender = 0; lender < sizeof lenders / sizeof lenders[0]; lender++) {
        for (char **slot = envp; *slot != NULL; slot++) {
            if (!starts_with(*slot, lenders[lender])) continue;
            memcpy(entry, name, name_length);
            memcpy(entry + name_length, settings, settings_length + 1);
            displaced = *slot;
            *slot = entry;
            protected_crash_reports = 1;
            return;
        }
    }
}

#if defined(__linux__)
__attribute__((used, section(".preinit_array"))) static void (*const policy_preinit)(int, char **, char **) =
    policy_protect_crash_reports;
#endif

int policy_crash_reports_protected(void) { return protected_crash_reports; }

void policy_restore_environment(void) {
    if (displaced == NULL) return;
    char *equals = strchr(displaced, '=');
    if (equals == NULL) return;
    size_t length = (size_t)(equals - displaced);
    char variable[256];
    if (length >= sizeof variable) return;
    memcpy(variable, displaced, length);
    variable[length] = '\0';
    setenv(variable, equals + 1, 1);
    displaced = NULL;
}

// A crash ends the process within a bound, its report written first.
//
// The Swift runtime's crash handler runs swift-backtrace and then returns. For a fault the
// faulting instruction runs again and the process dies; for the same signal sent by kill(2)
// (an operator's SIGSEGV or SIGQUIT) nothing faults again and the process went on, a request
// still waiting, for minutes. Each of the runtime's handlers is wrapped: the wrapper arms an
// alarm (a report that takes longer, a loaded machine symbolicating every thread, is cut), calls
// the runtime's handler, and then ends the process by the same signal with its default action.

static const int crash_signals[] = {SIGSEGV, SIGBUS, SIGILL, SIGTRAP, SIGFPE, SIGABRT, SIGQUIT};
#define CRASH_SIGNAL_COUNT ((int)(sizeof crash_signals / sizeof crash_signals[0]))
static struct sigaction runtime_handlers[CRASH_SIGNAL_COUNT];
static volatile sig_atomic_t crashing_signal = 0;
static unsigned report_seconds = 2;

// Ends the process by `signo` with its default action (a core dump where the system makes one).
static void die_by(int signo) {
    struct sigaction default_action;
    memset(&default_action, 0, sizeof default_action);
    default_action.sa_handler = SIG_DFL;
    sigemptyset(&default_action.sa_mask);
    sigaction(signo, &default_action, NULL);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, signo);
    pthread_sigmask(SIG_UNBLOCK, &set, NULL);
    raise(signo);
    _exit(128 + signo);
}

static void report_took_too_long(int signo) {
    (void)signo;
    die_by(crashing_signal != 0 ? crashing_signal : SIGABRT);
}

static void exit_after_report(int signo, siginfo_t *info, void *context) {
    int index = 0;
    while (index < CRASH_SIGNAL_COUNT && crash_signals[index] != signo) index++;
    if (index == CRASH_SIGNAL_COUNT) die_by(signo);
    if (crashing_signal == 0) {
        crashing_signal = signo;
        struct sigaction alarm_action;
        memset(&alarm_action, 0, sizeof alarm_action);
        alarm_action.sa_handler = report_took_too_long;
        sigemptyset(&alarm_action.sa_mask);
        sigaction(SIGALRM, &alarm_action, NULL);
        alarm(report_seconds);
    }
    struct sigaction *runtime = &runtime_handlers[index];
    if (runtime->sa_flags & SA_SIGINFO) {
        if (runtime->sa_sigaction != NULL) runtime->sa_sigaction(signo, info, context);
    } else if (runtime->sa_handler != SIG_DFL && runtime->sa_handler != SIG_IGN) {
        runtime->sa_handler(signo);
    }
    die_by(signo);
}

void policy_exit_after_crash_reports(unsigned seconds) {
    if (seconds > 0) report_seconds = seconds;
    for (int index = 0; index < CRASH_SIGNAL_COUNT; index++) {
        struct sigaction current;
        if (sigaction(crash_signals[index], NULL, &current) != 0) continue;
        // No handler of the runtime's (reports off): the default action already ends the process.
        if (!(current.sa_flags & SA_SIGINFO) && (current.sa_handler == SIG_DFL || current.sa_handler == SIG_IGN)) {
            continue;
        }
        runtime_handlers[index] = current;
        struct sigaction wrapper = current;
        wrapper.sa_sigaction = exit_after_report;
        wrapper.sa_flags = current.sa_flags | SA_SIGINFO;
        // The alarm must reach the handler while the runtime's report is being written.
        sigdelset(&wrapper.sa_mask, SIGALRM);
        sigaction(crash_signals[index], &wrapper, NULL);
    }
}
