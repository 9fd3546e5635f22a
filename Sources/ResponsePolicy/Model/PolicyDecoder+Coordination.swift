import Foundation

extension PolicyDecoder {
    /// `coordination: { use: local | file | redis | host plugin, with: {…} }`. Options are checked
    /// against the plugin's schema (unknown keys, a literal `password`); for `redis` the URL is
    /// checked here too: it must be `redis://` or `rediss://`, carry no password, and a host that is
    /// not this machine without TLS gets a warning (tokens would cross the network in clear).
    mutating func coordination(_ node: YAMLNode) -> PluginReference? {
        guard let reference = pluginSection(.coordination, node, what: "'coordination'") else { return nil }
        let options = node.pairs?.first { $0.key.scalar == "with" }?.value.pairs ?? []
        func value(_ key: String) -> YAMLNode? { options.first { $0.key.scalar == key }?.value }
        if reference.name == "redis" || reference.name == "file", let leaseNode = value("lease"),
            let text = leaseNode.scalar, let lease = Duration.parsePolicy(text), lease <= .zero
        {
            // A lease of 0s expires as it is granted: every process would refresh at once.
            report(
                .error(
                    "invalid-value",
                    "'lease' must be longer than 0s: a lease that expires as it is granted lets every process refresh with the same refresh token; use at least refresh.timeout",
                    at: leaseNode.range))
        }
        guard reference.name == "redis" else { return reference }
        if let keyNode = value("key"), let key = keyNode.scalar,
            key.isEmpty || key.contains(where: { "{}".contains($0) || $0.isWhitespace })
        {
            report(
                .error(
                    "invalid-value", "'key' must be a name without spaces or braces, not '\(key.truncatedForMessage)'",
                    at: keyNode.range))
        }
        guard let urlNode = value("url"), let text = urlNode.scalar, !urlNode.isNull else { return reference }
        switch RedisEndpoint.parse(text) {
        case .failure(let error):
            report(.error("invalid-value", error.message, at: urlNode.range))
        case .success(let endpoint):
            if let components = URLComponents(string: text), let password = components.password, !password.isEmpty {
                report(
                    .error(
                        "secret-in-policy",
                        "'url' carries a password; a secret belongs in the environment: name it with 'password-env'",
                        at: urlNode.range))
            }
            if endpoint.tls {
                // Refused at run time too (hiredis here is built without SSL): said at lint time,
                // not by a fleet that coordinates nothing in production.
                report(
                    .error(
                        "coordination-tls-unsupported",
                        "'rediss://' needs hiredis built with TLS, which this build lacks; reach Redis through a TLS tunnel (stunnel, spiped) on a loopback port and use redis://127.0.0.1:PORT",
                        at: urlNode.range))
            }
            if !endpoint.isLoopback, value("signing-key-env") == nil {
                report(
                    .warning(
                        "coordination-unsigned",
                        "'url' reaches '\(endpoint.host.truncatedForMessage)': without 'signing-key-env' any client of that Redis can sign this fleet in with tokens of its choosing; name an environment variable holding a shared key",
                        at: urlNode.range))
            }
            if !endpoint.tls, !endpoint.isLoopback {
                report(
                    .warning(
                        "coordination-without-tls",
                        "'url' reaches '\(endpoint.host.truncatedForMessage)' over plain TCP; the shared tokens would cross the network in clear: use a TLS tunnel (stunnel, spiped) on a loopback port",
                        at: urlNode.range))
            }
        }
        return reference
    }
}
