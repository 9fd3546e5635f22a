import Foundation

#if canImport(Glibc)
    import Glibc
#endif

/// Why a plain loopback exchange failed.
public struct LoopbackHTTPError: Error, CustomStringConvertible {
    public var description: String
}

/// A plain HTTP/1.1 exchange with `127.0.0.1:port` over a socket (no URLSession: nothing cached,
/// nothing shared, nothing kept alive): the status and the body. A form body is sent as
/// `application/x-www-form-urlencoded`.
public func loopbackHTTP(port: Int, _ method: String, _ path: String, form body: String? = nil) throws -> (Int, String)
{
    let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    defer { close(descriptor) }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_port = in_port_t(UInt16(port).bigEndian)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    let connected = withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
            connect(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
        }
    }
    guard connected == 0 else {
        throw LoopbackHTTPError(description: "cannot connect to 127.0.0.1:\(port) for \(path)")
    }
    var text = "\(method) \(path) HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
    if let body {
        text += "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: \(body.utf8.count)\r\n\r\n\(body)"
    } else {
        text += "\r\n"
    }
    _ = text.withCString { send(descriptor, $0, strlen($0), 0) }
    var reply = [UInt8]()
    var buffer = [UInt8](repeating: 0, count: 4096)
    while true {
        let count = recv(descriptor, &buffer, buffer.count, 0)
        if count <= 0 { break }
        reply += buffer[0..<count]
    }
    let response = String(decoding: reply, as: UTF8.self)
    let status = Int(response.split(separator: " ").dropFirst().first ?? "") ?? 0
    let body = response.components(separatedBy: "\r\n\r\n").dropFirst().joined(separator: "\r\n\r\n")
    return (status, body)
}
