/// ResponsePolicy: declarative token refresh, forced logout and retries for HTTP clients.
///
/// Load a YAML policy with `Policy.load`, then send requests through `PolicyEngine`.
public enum ResponsePolicyVersion {
    public static let schema = 1
}
