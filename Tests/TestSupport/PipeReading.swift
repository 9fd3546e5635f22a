import Foundation

/// Reads `handle` (a child process's pipe) to its end on a thread of its own: each chunk goes to
/// `receive` as it arrives, and `ended` is called at the end of the stream.
///
/// Why not `FileHandle.readabilityHandler`: it arms a libdispatch read source on the pipe, and
/// tearing such sources down (the handler clearing itself at the end, the pipe closed) races
/// libdispatch's epoll bookkeeping on Linux, which crashes the whole test process in
/// `_dispatch_event_loop_drain` (swift-corelibs-libdispatch#949). A blocking read registers
/// nothing with libdispatch. Start it after the process ran: until then the parent holds the
/// pipe's write end and the read would never end.
public func readToEndOnThread(
    _ handle: FileHandle, receive: @escaping @Sendable (Data) -> Void, ended: @escaping @Sendable () -> Void = {}
) {
    Thread.detachNewThread {
        while true {
            let data = handle.availableData
            if data.isEmpty { break }
            receive(data)
        }
        ended()
    }
}
