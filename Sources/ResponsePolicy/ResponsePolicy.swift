/// ResponsePolicy: declarative token refresh, forced logout and retries for HTTP clients.
///
/// Load a YAML policy with `Policy.load`, then send requests through `PolicyEngine`.
package enum ResponsePolicyVersion {
    package static let schema = 1
    /// The library's version: `1.0.0`.
    package static let version = "1.0.0"
    /// `ResponsePolicy/1.0.0`: the `User-Agent` of an embedding engine's own calls (token and
    /// logout requests), so an identity provider's logs name the client rather than libcurl.
    package static let userAgent = "ResponsePolicy/\(version)"
}
