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

#include <stdlib.h>
#include <string.h>

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
