import Foundation

/// One HTTP response as a transport returns it.
public struct HTTPResponse: Sendable, Hashable {
    /// The status code.
    public var status: Int
    /// The header fields.
    public var headers: HTTPHeaders
    /// The body, empty when there was none.
    public var body: Data

    /// A response with this status, headers and body.
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
