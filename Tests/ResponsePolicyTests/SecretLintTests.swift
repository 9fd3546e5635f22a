import Foundation
import Testing

@testable import ResponsePolicy

/// Secrets lint used to miss, and http:// endpoints off the machine.
struct SecretLintTests {
    static let secret = "hunter2SECRET"

    static func policy(_ with: String, use: String = "http") -> String {
        """
        policy: 1
        name: secrets
        rules: [{ when: { status: [401] }, then: refresh }]
        refresh:
          use: \(use)
          with: \(with)
        """
    }

    static let refused: [String] = [
        // `{env:` anywhere used to exempt the whole value.
        policy(
            #"{ url: "https://a.example.com/r", token: body.t, headers: { Authorization: "Basic \#(secret) {env:X}" } }"#
        ),
        policy(#"{ url: "https://a.example.com/r", token: body.t, headers: { Authorization: "{env:X} \#(secret)" } }"#),
        policy(#"{ url: "https://a.example.com/r", token: body.t, body: { client_secret: \#(secret) } }"#),
        policy(#"{ url: "https://a.example.com/r", token: body.t, body: { password: \#(secret) } }"#),
        policy(#"{ url: "https://a.example.com/r", token: body.t, body: { refresh_token: \#(secret) } }"#),
        policy(#"{ token-url: "https://\#(secret)@a.example.com/t", client-id: app }"#, use: "oauth2"),
        policy(#"{ token-url: "https://a.example.com/t?key=\#(secret)", client-id: app }"#, use: "oauth2"),
        policy(#"{ token-url: "https://a.example.com/t?token=\#(secret)", client-id: app }"#, use: "oauth2"),
        policy(#"{ token-url: "https://a.example.com/t?sig=\#(secret)", client-id: app }"#, use: "oauth2"),
        policy(#"{ url: "https://a.example.com/r", token: body.t, headers: { X-Auth-Token: \#(secret) } }"#),
        policy(#"{ url: "https://a.example.com/r", token: body.t, headers: { Private-Token: \#(secret) } }"#),
        policy(#"{ url: "https://a.example.com/r", token: body.t, headers: { X-Amz-Security-Token: \#(secret) } }"#),
        // A literal glued to a placeholder is part of the secret.
        policy(#"{ url: "https://a.example.com/r", token: body.t, headers: { Authorization: "Secret{env:X}" } }"#),
        policy(#"{ url: "https://a.example.com/r", token: body.t, body: { password: "\#(secret){env:X}" } }"#),
        // A secret in a credential command's argv (the policy file and every `ps` listing).
        policy(#"{ command: [/usr/bin/get-token, --password, \#(secret)] }"#, use: "exec"),
        policy(#"{ command: [/usr/bin/get-token, "--client-secret=\#(secret)"] }"#, use: "exec"),
        policy(#"{ command: [get-token, -u, app, --token, \#(secret), --verbose] }"#, use: "exec"),
        policy(#"{ command: [curl, -H, "Authorization: Bearer \#(secret)", https://a.example.com/t] }"#, use: "exec"),
        policy(#"{ command: [vault-login, "https://a.example.com/t?api_key=\#(secret)"] }"#, use: "exec"),
    ]

    @Test(arguments: refused)
    func aLiteralSecretIsRefusedWithoutEchoingIt(_ yaml: String) {
        let diagnostics = findings(yaml)
        let secrets = diagnostics.filter { $0.rule == "secret-in-policy" }
        #expect(secrets.count == 1, "\(diagnostics.map(\.description))")
        #expect(secrets.allSatisfy { $0.severity == .error })
        for diagnostic in diagnostics {
            #expect(!diagnostic.description.contains(Self.secret))
            #expect(!DiagnosticRenderer().render(diagnostic, source: yaml).contains(Self.secret))
        }
    }

    static let accepted: [String] = [
        policy(#"{ url: "https://a.example.com/r", token: body.t, headers: { Authorization: "Basic {env:CREDS}" } }"#),
        policy(
            #"{ url: "https://a.example.com/r", token: body.t, headers: { Authorization: "Bearer {refresh_token}" } }"#),
        policy(
            #"{ url: "https://a.example.com/r", token: body.t, headers: { X-Auth-Token: "{env:USER}:{env:PASS}" } }"#),
        policy(
            #"{ url: "https://a.example.com/r", token: body.t, headers: { X-Client: mobile, Accept-Language: de } }"#),
        policy(
            #"{ url: "https://a.example.com/r", token: body.t, body: { refreshToken: "{refresh_token}", device: ios } }"#
        ),
        policy(#"{ url: "https://a.example.com/r", token: body.t, body: { password: "{env:PW}" } }"#),
        policy(#"{ token-url: "https://a.example.com/t?realm=app", client-id: app }"#, use: "oauth2"),
        policy(
            #"{ command: [/usr/bin/get-token, --token-file, /run/secrets/t, --client-id, app, --key, ~/.key], env: [APP_SECRET] }"#,
            use: "exec"),
        policy(#"{ command: [get-token, "--password-env=APP_PASSWORD", --audience, api] }"#, use: "exec"),
    ]

    @Test(arguments: accepted)
    func placeholdersAndPlainValuesAreAccepted(_ yaml: String) {
        #expect(findings(yaml).filter { $0.rule == "secret-in-policy" }.isEmpty)
    }

    @Test(arguments: [
        ("http://auth.example.com/token", true), ("http://10.0.0.5:8080/token", true),
        ("https://auth.example.com/t", false),
        ("http://127.0.0.1:8080/token", false), ("http://localhost/token", false), ("http://[::1]:9000/t", false),
        // Names that only look like loopback addresses resolve wherever their owner says.
        ("http://127.0.0.1.evil.example/token", true), ("http://127.evil.example/t", true),
        ("http://127.1.2.3/t", false), ("http://[::ffff:127.0.0.1]/t", false), ("http://[::2]/t", true),
    ])
    func plainHTTPOffTheMachineIsAWarning(_ url: String, _ warned: Bool) {
        let yaml =
            Self.policy(#"{ token-url: "\#(url)", client-id: app }"#, use: "oauth2")
            + "\nlogout: { use: http, with: { url: \"\(url)\" } }\n"
        let warnings = findings(yaml).filter { $0.rule == "insecure-endpoint" }
        #expect(warnings.count == (warned ? 2 : 0))
        #expect(warnings.allSatisfy { $0.severity == .warning })
        if warned {
            let host = URL(string: url)?.host ?? ""
            #expect(
                warnings.first?.message
                    == "'token-url' sends tokens over plain http to '\(host)'; use https (plain http is for loopback addresses only)"
            )
        }
    }
}
