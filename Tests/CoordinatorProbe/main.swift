// One coordinator in a process of its own, for the multi-process coordination tests: it plays
// one engine meeting an expired token. Protocol on stdout, one line each: `ready`, then after
// `go` on stdin, `turn <kind> <number>`; a lease holder appends a line to the counter file (the
// fake token endpoint), says `refreshing`, waits `--hold` ms and says `published <generation>`.
//
//   coordinator-probe redis URL KEY | file PATH  [--lease MS] [--hold MS] [--timeout MS] --counter FILE
import Foundation
import ResponsePolicy
import ResponsePolicyRedis

#if canImport(Glibc)
    import Glibc
#endif

func say(_ line: String) {
    FileHandle.standardOutput.write(Data((line + "\n").utf8))
}

let arguments = Array(CommandLine.arguments.dropFirst())
func option(_ name: String) -> String? {
    guard let index = arguments.firstIndex(of: name), index + 1 < arguments.count else { return nil }
    return arguments[index + 1]
}
let lease = Duration.milliseconds(Int(option("--lease") ?? "") ?? 15000)
let hold = Int(option("--hold") ?? "") ?? 30
let timeout = Duration.milliseconds(Int(option("--timeout") ?? "") ?? 10000)
guard arguments.count >= 2, let counter = option("--counter") else {
    FileHandle.standardError.write(Data("usage: coordinator-probe redis URL KEY | file PATH --counter FILE\n".utf8))
    exit(64)
}

let coordinator: any SessionCoordinator
do {
    switch arguments[0] {
    case "redis":
        coordinator = try RedisSessionCoordinator(.init(url: arguments[1], key: arguments[2], lease: lease))
    default:
        coordinator = try FileSessionCoordinator(.init(path: arguments[1], lease: lease))
    }
} catch {
    FileHandle.standardError.write(Data("\(error)\n".utf8))
    exit(1)
}

let seed = Credentials(accessToken: "expired", refreshToken: "refresh-0")
_ = await coordinator.start(local: seed, updates: { _ in })
say("ready")
_ = readLine()
let turn = await coordinator.beginRefresh(RefreshTurnRequest(failedGeneration: 0, timeout: timeout, limit: nil))
switch turn {
case .lease(let granted):
    say("turn lease \(granted.fencingToken)")
    let descriptor = open(counter, O_WRONLY | O_CREAT | O_APPEND, 0o600)
    _ = "refresh by \(getpid())\n".withCString { write(descriptor, $0, strlen($0)) }
    close(descriptor)
    say("refreshing")
    try? await Task.sleep(for: .milliseconds(hold))
    let fresh = Credentials(accessToken: "access-\(getpid())", refreshToken: "refresh-\(getpid())")
    switch await coordinator.publish(fresh, with: granted) {
    case .published(let session): say("published \(session.generation)")
    case .leaseLost: say("lease-lost")
    case .unavailable: say("unavailable")
    }
case .published(let session): say("turn published \(session.generation)")
case .newer(let session): say("turn newer \(session.generation)")
case .failedElsewhere: say("turn failed 0")
case .limited: say("turn limited 0")
case .retryAfter: say("turn retry-after 0")
case .unavailable: say("turn unavailable 0")
}
coordinator.stop()
