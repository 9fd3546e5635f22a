import Foundation
import PolicyCLI
import PolicyStartup
import ResponsePolicyRedis

// No token in a crash report: set before the runtime read its settings, or restart to apply them.
policy_restore_environment()
CrashReports.protect(alreadyApplied: policy_crash_reports_protected() != 0)
// A crash exits within 2 s of the signal, its report written (or cut) first.
policy_exit_after_crash_reports(2)
// `coordination: redis` in every registry the commands make (the core does not link hiredis).
RedisCoordination.install()
exit(await PolicyCommand.run(Array(CommandLine.arguments.dropFirst())))
