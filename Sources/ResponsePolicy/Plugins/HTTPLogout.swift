import Foundation

/// The `http` logout plugin: tells a server the session ended with one POST, fire-and-forget.
///
/// Why fire-and-forget: by the time it runs the engine has already ended the session (cooldown
/// started, requests in flight cancelled); the POST only lets the server clean up (revoke the
/// refresh token, end a server-side session, count forced logouts). Its answer changes nothing,
/// so it is never retried, its status is ignored, and it is bounded by `timeout` so that a server
/// that never answers cannot keep a task, a connection or the process alive.
///
/// The request is `POST <url>` with `Content-Type: application/json`, `Accept: application/json`
/// and the body `{"reason":"<rule>"}`, where `<rule>` is the rule that logged out, or `refresh`
/// when a failed refresh did. It goes through the engine's transport, bypassing the policy's
/// rules. It is not signed: ``LogoutContext`` carries no credentials.
///
/// ```yaml
/// logout:
///   use: http
///   with:
///     url: https://api.example.com/session/logout
///     timeout: 2s          # 5s by default
/// ```
///
/// Concurrency contract: immutable and `Sendable`. The engine calls ``logout(_:)`` once per logout
/// in a task of its own and does not wait for it; the call returns after the answer, a transport
/// error, `timeout`, or the cancellation of its task, whichever comes first.
package struct HTTPLogout: LogoutPlugin {
    /// Where the logout request is POSTed.
    package let url: URL
    /// How long the POST may take; `5s` by default.
    package let timeout: Duration
    /// Which redirects of the logout endpoint are followed: ``RedirectPolicy/none`` by default
    /// (`follow-redirects:` in the policy; `same-origin` follows those within the endpoint's origin).
    package var followRedirects: RedirectPolicy = .none

    /// Creates the plugin.
    ///
    /// ```swift
    /// registry.register(logout: "revoke") { _ in HTTPLogout(url: revokeURL, timeout: .seconds(2)) }
    /// ```
    ///
    /// - Parameters:
    ///   - url: Where the logout request is POSTed.
    ///   - timeout: How long to wait for it; `5s` by default.
    package init(url: URL, timeout: Duration = .seconds(5)) {
        self.url = url
        self.timeout = timeout
    }

    /// Makes the plugin from a policy's `with:` options (`url`, `timeout`).
    ///
    /// - Throws: ``PluginError`` when `url` is not an http(s) URL or `timeout` is not a duration.
    init(configuration: PluginConfiguration) throws(PluginError) {
        let url = try TokenEndpoint.url(configuration, "url", kind: .logout)
        var timeout = Duration.seconds(5)
        if let text = configuration.string("timeout") {
            guard let parsed = Duration.parsePolicy(text) else {
                throw PluginError(
                    kind: .logout, name: configuration.name, reason: "the option 'timeout' is not a duration like 5s")
            }
            timeout = parsed
        }
        self.init(url: url, timeout: timeout)
        followRedirects = try TokenEndpoint.redirects(configuration, kind: .logout)
    }

    /// Sends the logout POST and returns once it is answered, has failed, or `timeout` passed.
    ///
    /// - Parameter context: The rule that logged out and the engine's transport.
    package func logout(_ context: LogoutContext) async {
        var request = HTTPRequest(
            method: "POST", url: url,
            headers: ["Content-Type": "application/json", "Accept": "application/json"],
            body: Data(("{\"reason\":" + PolicyEvent.quote(context.reason) + "}").utf8), id: "http-logout")
        request.redirects = followRedirects
        request.maxResponseBytes = TokenEndpoint.maxAnswerBytes
        let sent = request
        let transport = context.transport
        let clock = context.clock
        let deadline = clock.now + timeout
        await withTaskGroup(of: Void.self) { group in
            group.addTask { _ = try? await transport.send(sent) }
            // On the engine's clock, so a test or a simulation controls the timeout.
            group.addTask { try? await clock.sleep(until: deadline) }
            // The first to finish ends the call; cancelling the other is prompt, since transports
            // must honour cancellation.
            await group.next()
            group.cancelAll()
        }
    }
}
