import Foundation
import PolicyCLI

exit(await PolicyCommand.run(Array(CommandLine.arguments.dropFirst())))
