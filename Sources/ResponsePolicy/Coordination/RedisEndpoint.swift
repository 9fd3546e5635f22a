import Foundation

// Where a Redis coordination store is: parsed by the core (lint, explain and `Policy.load` check
// `coordination: redis` without linking hiredis); the connection itself is in ResponsePolicyRedis.

/// Why a Redis call failed. Never carries the password or a command's arguments (they may be
/// tokens): only what hiredis or the server said about the connection.
package struct RedisError: Error, Sendable, Equatable, CustomStringConvertible {
    package var message: String
    package init(message: String) { self.message = message }
    package var description: String { message }
}

/// Where a Redis server is, parsed from `redis://[user@]host[:port][/db]`. A password in the URL
/// is refused by lint; it comes from `password-env`.
package struct RedisEndpoint: Sendable, Equatable, CustomStringConvertible {
    package var host: String
    package var port: Int
    package var database: Int
    package var username: String?
    package var tls: Bool

    /// `nil` with a reason when `text` is not a Redis URL.
    package static func parse(_ text: String) -> Result<RedisEndpoint, RedisError> {
        guard let components = URLComponents(string: text), let scheme = components.scheme?.lowercased(),
            scheme == "redis" || scheme == "rediss"
        else { return .failure(RedisError(message: "'url' must be redis://host[:port][/db] or rediss://…")) }
        guard let host = components.host, !host.isEmpty else {
            return .failure(RedisError(message: "'url' has no host"))
        }
        let path = components.path.trimmingCharacters(in: CharacterSet(charactersIn: "/"))
        var database = 0
        if !path.isEmpty {
            guard let number = Int(path), number >= 0 else {
                return .failure(RedisError(message: "'url' must end in a database number, like /0"))
            }
            database = number
        }
        let user = components.user.flatMap { $0.isEmpty ? nil : $0 }
        return .success(
            RedisEndpoint(
                host: host, port: components.port ?? 6379, database: database, username: user,
                tls: scheme == "rediss"))
    }

    /// Whether the host is this machine, where plain TCP is acceptable: the same test as for
    /// http endpoints (an address in 127.0.0.0/8, `::1`, `localhost`), so `127.0.0.1.evil.example`,
    /// a name anyone can register, is not (issue 32: it had no TLS warning).
    package var isLoopback: Bool { PolicyDecoder.isLoopback(host) }

    /// `host:port/db`, never with credentials.
    package var description: String { "\(tls ? "rediss" : "redis")://\(host):\(port)/\(database)" }
}
