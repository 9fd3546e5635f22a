extension Policy {
    /// The shipped default policy (policies/default.yaml), embedded so a program can run
    /// without the file. A test keeps this text identical to the file.
    package static let defaultPolicyText = """
        # The business-code scheme of our mobile API, as shipped.
        #
        # 200 {"status":1401}  access token expired   -> refresh once, send again
        # 200 {"status":202}   signed in elsewhere    -> log out, 20 s cooldown
        # 401/403 with WWW-Authenticate: Bearer error="insufficient_scope"
        #                      the token is valid, it lacks a scope -> delivered as it is
        # 401                  the token was refused   -> refresh once, send again
        # 502/503/504, timeouts, dropped connections  -> 3 retries, 1s 2s 4s
        policy: 1
        name: mobile-api

        classify:
          code: body.status

        rules:
          - name: token-expired
            when: { code: [1401] }
            then: refresh
          - name: forced-logout
            when: { code: [202] }
            then: logout
          - name: missing-scope            # RFC 6750 §3.1: a valid token that lacks a scope; a new token would not help
            when: { status: [401, 403], header: { WWW-Authenticate: "*insufficient_scope*" } }
            then: deliver
          - name: unauthorized
            when: { status: [401] }
            then: refresh
          - name: transient
            when: { status: [502, 503, 504], error: [timeout, connection] }
            then: retry

        refresh:
          use: oauth2
          with:
            token-url: https://auth.example.com/oauth/token
            client-id: mobile
          timeout: 10s
          share-window: 0s             # off: a request signed with an older token is re-sent with the new one anyway
          max-per-request: 1
          on-exhausted: logout
          on-failure: logout

        logout:
          use: none
          cancel-in-flight: true
          cooldown: 20s

        retry:
          max-retries: 3
          backoff: exponential
          initial: 1s
          multiplier: 2
          max-delay: 8s
          retry-after: honor
          attempt-timeout: 10s
          deadline: 120s

        routes:
          - match: { path: "/oauth/*" }
            rules: []
        """

    /// Loads the embedded default policy.
    ///
    /// - Throws: never in practice: a test loads it; `PolicyError` if it were broken.
    public static func loadDefault() throws(PolicyError) -> Policy {
        try Policy.load(yaml: defaultPolicyText, file: "policies/default.yaml")
    }
}
