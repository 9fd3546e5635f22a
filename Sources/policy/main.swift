import Foundation
import PolicyCLI

CrashReports.protect()  // before anything is read: no token in a crash report
exit(await PolicyCommand.run(Array(CommandLine.arguments.dropFirst())))
