import Foundation

/// One HTTP response as a transport returns it.
public struct HTTPResponse: Sendable, Hashable {
    public var status: Int
    public var headers: HTTPHeaders
    public var body: Data

    public init(status: Int, headers: HTTPHeaders = [:], body: Data = Data()) {
        self.status = status
        self.headers = headers
        self.body = body
    }
}

extension HTTPResponse: CustomStringConvertible {
    /// Status and body size only: headers and bodies can carry tokens, so they are never printed.
    public var description: String { "HTTP \(status) (\(body.count) bytes)" }
}
