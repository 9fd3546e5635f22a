import CCurl
import Foundation
import ResponsePolicy

/// How libcurl's result codes map onto the classes a policy's `when: { error: [...] }` names.
enum CurlErrors {
    /// The class of a failed transfer's code:
    ///
    /// - `.timeout`: `CURLE_OPERATION_TIMEDOUT`, the transport's own timeout (the server or the
    ///   network did not answer in time; the same request may well succeed later).
    /// - `.dns`: `CURLE_COULDNT_RESOLVE_HOST` and `_PROXY`: the name did not resolve; nothing was sent.
    /// - `.tls`: the handshake or a certificate check failed (`CURLE_SSL_*`,
    ///   `CURLE_PEER_FAILED_VERIFICATION`, `CURLE_USE_SSL_FAILED`): retrying rarely helps, and the
    ///   cause is often an interception proxy or a clock.
    /// - `.connection`: everything else: refused, reset or closed before a whole, parseable
    ///   response arrived (`CURLE_COULDNT_CONNECT`, `CURLE_RECV_ERROR`, `CURLE_SEND_ERROR`,
    ///   `CURLE_PARTIAL_FILE`, `CURLE_GOT_NOTHING`, `CURLE_HTTP2`, `CURLE_WEIRD_SERVER_REPLY`,
    ///   `CURLE_BAD_CONTENT_ENCODING`, …).
    ///
    /// `too-large` is not here: the transport knows it from its own callbacks, not from a code.
    static func errorClass(_ code: CURLcode) -> TransportErrorClass {
        switch code {
        case CURLE_OPERATION_TIMEDOUT:
            return .timeout
        case CURLE_COULDNT_RESOLVE_HOST, CURLE_COULDNT_RESOLVE_PROXY:
            return .dns
        case CURLE_SSL_CONNECT_ERROR, CURLE_PEER_FAILED_VERIFICATION, CURLE_SSL_CERTPROBLEM, CURLE_SSL_CIPHER,
            CURLE_SSL_CACERT_BADFILE, CURLE_SSL_ENGINE_NOTFOUND, CURLE_SSL_ENGINE_SETFAILED,
            CURLE_SSL_ENGINE_INITFAILED, CURLE_SSL_SHUTDOWN_FAILED, CURLE_SSL_CRL_BADFILE, CURLE_SSL_ISSUER_ERROR,
            CURLE_SSL_PINNEDPUBKEYNOTMATCH, CURLE_SSL_INVALIDCERTSTATUS, CURLE_SSL_CLIENTCERT, CURLE_USE_SSL_FAILED:
            return .tls
        default:
            return .connection
        }
    }

    /// The error for a transfer that ended with `code`: its class, the request's method and
    /// redacted URL, and libcurl's message unless it might carry the query or user info.
    static func transportError(_ code: CURLcode, _ transfer: CurlTransfer) -> TransportError {
        let errorClass = errorClass(code)
        if errorClass == .timeout {
            return TransportError(.timeout, "\(transfer.label): no complete response within the timeout")
        }
        var text = transfer.curlMessage
        if text.isEmpty, let description = curl_easy_strerror(code) { text = String(cString: description) }
        let url = transfer.url
        text = text.replacingOccurrences(of: url.absoluteString, with: RedirectRules.redacted(url))
        for secret in [url.query(percentEncoded: true), url.query(percentEncoded: false), url.user, url.password] {
            if let secret, !secret.isEmpty, text.contains(secret) { text = "" }
        }
        return TransportError(
            errorClass, "\(transfer.label): libcurl error \(code.rawValue)" + (text.isEmpty ? "" : ": \(text)"))
    }
}
