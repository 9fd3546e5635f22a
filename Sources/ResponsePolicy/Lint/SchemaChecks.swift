/// The checks the loader and decoder make while reading a file, described like lint rules so the
/// rule reference and the example tests cover them too.
enum SchemaChecks {
    static func describe(
        _ id: String, _ summary: String, _ rationale: String, triggering: [String], nonTriggering: [String] = []
    ) -> LintRuleDescription {
        LintRuleDescription(
            id: id, summary: summary, rationale: rationale, severity: .error, triggering: triggering,
            nonTriggering: nonTriggering.isEmpty ? [exampleHeader] : nonTriggering)
    }

    static let descriptions: [LintRuleDescription] = [
        describe(
            "yaml-syntax", "the file is not valid YAML", "Nothing else can be checked until the file parses.",
            triggering: [exampleHeader + "rules: [\n", exampleHeader + "retry:\n\tmax-retries: 3\n"]),
        describe(
            "multiple-documents", "a second YAML document in the file",
            "One file holds one policy, so a second document is a mistake, not something to ignore.",
            triggering: [exampleHeader + "---\n" + exampleHeader]),
        describe(
            "duplicate-key", "a key written twice in one mapping",
            "YAML parsers disagree on which value wins; the policy must say one thing.",
            triggering: [exampleHeader + "retry: { max-retries: 3, max-retries: 4 }\n"]),
        describe(
            "invalid-tag", "a YAML tag that does not fit its value, or one a policy cannot use",
            "The core tags !!str, !!int, !!float, !!bool and !!null are honoured; a value they do not describe is refused, and so are !!binary, !!timestamp and the like.",
            triggering: [exampleHeader + "retry: { max-retries: !!int three }\n"],
            nonTriggering: [exampleHeader + "retry: { max-retries: !!int 3, initial: !!str 1s }\n"]),
        describe(
            "undefined-alias", "an alias with no anchor before it", "The value it stands for does not exist.",
            triggering: [exampleHeader + "retry: *defaults\n"],
            nonTriggering: [
                exampleHeader
                    + "x-defaults: &defaults { max-retries: 2 }\nretry: *defaults\nrules: [{ when: { status: [503] }, then: retry }]\n"
            ]),
        describe(
            "too-many-nodes", "aliases expand the document beyond the node limit",
            "A few lines of nested aliases can expand to billions of nodes (\"billion laughs\").",
            triggering: [
                exampleHeader + "x-a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n"
                    + (1...7).map {
                        "x-\($0 + 1): &l\($0) [" + String(repeating: "*\($0 == 1 ? "a" : "l\($0 - 1)"), ", count: 9)
                            + "*\($0 == 1 ? "a" : "l\($0 - 1)")]"
                    }.joined(separator: "\n") + "\n"
            ]),
        describe(
            "nesting-too-deep", "mappings or lists nested beyond the depth limit",
            "Policies are shallow; deep nesting is hostile or generated input.",
            triggering: [
                exampleHeader + "x-deep: " + String(repeating: "[", count: 80) + String(repeating: "]", count: 80)
                    + "\n"
            ]),
        describe(
            "empty-file", "the file has no content", "An empty policy is almost always a failed write.",
            triggering: ["", "# only a comment\n"]),
        describe(
            "invalid-root", "the document is not a mapping", "A policy is a mapping of sections.",
            triggering: ["- policy: 1\n"]),
        describe(
            "missing-key", "a required key is missing",
            "The schema version, the name and each rule's 'then' are required.",
            triggering: ["name: example\n", "policy: 1\n", exampleHeader + "rules: [{ when: { status: [401] } }]\n"]),
        describe(
            "unsupported-version", "'policy' is not 1",
            "Only schema 1 exists; another number is a file for another tool.",
            triggering: ["policy: 2\nname: example\n"]),
        describe(
            "invalid-name", "a policy or rule name with characters other than a-z, 0-9 and '-'",
            "Names appear in events, logs and metrics; keep them safe to use as identifiers.",
            triggering: ["policy: 1\nname: My API\n"]),
        describe(
            "unknown-key", "a key the schema does not have", "A typo would otherwise be silently ignored.",
            triggering: [exampleHeader + "retry: { retries: 3 }\n", exampleHeader + "retyr: {}\n"],
            nonTriggering: [exampleHeader + "x-notes: anything goes here\n"]),
        describe(
            "invalid-type", "a value of the wrong type", "A list where a number belongs is never what was meant.",
            triggering: [
                exampleHeader + "retry: { max-retries: three }\n",
                exampleHeader + "logout: { cancel-in-flight: yes }\n",
            ]),
        describe(
            "invalid-value", "a value outside what the key allows", "The engine could not run it.",
            triggering: [
                exampleHeader + "retry: { backoff: progressive }\n", exampleHeader + "retry: { jitter: lots }\n",
            ]),
        describe(
            "invalid-duration", "a duration without a unit or not a duration",
            "A bare 20 could mean seconds or milliseconds; the unit says which.",
            triggering: [exampleHeader + "logout: { cooldown: 20 }\n", exampleHeader + "retry: { initial: soon }\n"],
            nonTriggering: [
                exampleHeader + "logout: { cooldown: 20s }\nrules: [{ when: { status: [403] }, then: logout }]\n"
            ]),
        describe(
            "invalid-status", "a status outside 100-599 or a malformed range", "It could never match a response.",
            triggering: [
                exampleHeader + "rules: [{ when: { status: [700] }, then: fail }]\n",
                exampleHeader + "rules: [{ when: { status: [\"599-500\"] }, then: fail }]\n",
            ]),
        describe(
            "invalid-code", "a business code range written another way than \"a-b\", or backwards",
            "Integer business codes take ranges as statuses do, \"1400-1499\"; '1400..1499' would be one code that no server sends.",
            triggering: [
                exampleHeader
                    + "classify: { code: body.status }\nrules: [{ when: { code: [\"1400..1499\"] }, then: fail }]\n",
                exampleHeader
                    + "classify: { code: body.status }\nrules: [{ when: { code: [\"1499-1400\"] }, then: fail }]\n",
            ],
            nonTriggering: [
                exampleHeader
                    + "classify: { code: body.status }\nrules: [{ when: { code: [\"1400-1499\", 202] }, then: fail }]\n"
            ]),
        describe(
            "unknown-plugin", "'use:' names a plugin that is neither built in nor declared",
            "The engine would have nothing to run. Host plugins are declared with --plugin KIND:NAME.",
            triggering: [exampleHeader + "authorize: { use: beare }\n"]),
        describe(
            "unknown-plugin-option", "'with:' gives an option the plugin does not take",
            "A misspelt option would be ignored and the plugin would run with its default.",
            triggering: [exampleHeader + "authorize: { use: header, with: { name: X-Token, prefixx: 'T ' } }\n"],
            nonTriggering: [exampleHeader + "authorize: { use: header, with: { name: X-Token, prefix: 'T ' } }\n"]),
        describe(
            "missing-plugin-option", "a required plugin option is missing", "The plugin cannot work without it.",
            triggering: [exampleHeader + "authorize: { use: header }\n"]),
        describe(
            "secret-in-policy", "a secret written in the policy file",
            "Policies are shared and committed; secrets belong in the environment.",
            triggering: [
                exampleHeader
                    + "refresh: { use: oauth2, with: { token-url: \"https://a.example.com/t\", client-id: app, client-secret: hunter2 } }\n",
                exampleHeader
                    + "refresh: { use: oauth2, with: { token-url: \"https://app:hunter2@a.example.com/t\", client-id: app } }\n",
                exampleHeader
                    + "refresh: { use: oauth2, with: { token-url: \"https://a.example.com/t?client_secret=hunter2\", client-id: app } }\n",
                exampleHeader
                    + "refresh: { use: http, with: { url: \"https://a.example.com/r\", token: body.token, headers: { X-Api-Key: hunter2 } } }\n",
                exampleHeader
                    + "refresh: { use: http, with: { url: \"https://a.example.com/r\", token: body.token, headers: { Authorization: \"Basic aHVudGVyMg== {env:X}\" } } }\n",
                exampleHeader
                    + "refresh: { use: http, with: { url: \"https://a.example.com/r\", token: body.token, body: { client_secret: hunter2 } } }\n",
                exampleHeader
                    + "refresh: { use: oauth2, with: { token-url: \"https://hunter2@a.example.com/t\", client-id: app } }\n",
                exampleHeader
                    + "refresh: { use: oauth2, with: { token-url: \"https://a.example.com/t?sig=hunter2\", client-id: app } }\n",
                exampleHeader
                    + "refresh: { use: http, with: { url: \"https://a.example.com/r\", token: body.token, headers: { X-Auth-Token: hunter2 } } }\n",
            ],
            nonTriggering: [
                exampleHeader
                    + "refresh: { use: oauth2, with: { token-url: \"https://a.example.com/t?realm=app\", client-id: app, client-secret-env: APP_SECRET } }\n",
                exampleHeader
                    + "refresh: { use: http, with: { url: \"https://a.example.com/r\", token: body.token, headers: { X-Api-Key: \"{env:API_KEY}\", Authorization: \"Bearer {refresh_token}\", X-Client: mobile } } }\n",
                exampleHeader
                    + "refresh: { use: http, with: { url: \"https://a.example.com/r\", token: body.token, headers: { Authorization: \"Basic {env:CREDENTIALS}\" }, body: { refreshToken: \"{refresh_token}\", device: ios } } }\n",
            ]),
        LintRuleDescription(
            id: "insecure-endpoint",
            summary: "a token, refresh or logout endpoint on plain http:// other than loopback",
            rationale:
                "Refresh tokens, client secrets and new access tokens would cross the network in clear text; plain http is fine only on the same machine (localhost, 127.0.0.0/8, ::1).",
            severity: .warning,
            triggering: [
                exampleHeader
                    + "refresh: { use: oauth2, with: { token-url: \"http://auth.example.com/token\", client-id: app } }\n",
                exampleHeader + "logout: { use: http, with: { url: \"http://api.example.com/logout\" } }\n",
            ],
            nonTriggering: [
                exampleHeader
                    + "refresh: { use: oauth2, with: { token-url: \"https://auth.example.com/token\", client-id: app } }\n",
                exampleHeader
                    + "refresh: { use: oauth2, with: { token-url: \"http://127.0.0.1:8080/token\", client-id: app } }\n",
                exampleHeader + "logout: { use: http, with: { url: \"http://localhost:9000/logout\" } }\n",
            ]),
        describe(
            "plugin-unavailable",
            "a plugin that cannot be made here: an unset environment variable, an unreadable secret file, a missing command",
            "Found by 'policy lint --check-env', PolicyEngine(checking:) and every reload, which refuses the policy: "
                + "otherwise the first refresh would fail and log the user out.",
            triggering: []),
        describe(
            "request-wide-override", "a rule's 'then:' sets a key that applies to the whole request",
            "'deadline' and 'attempt-timeout' are armed when the request starts and before each attempt, 'ahead' and 'hold-new-requests' act before it is sent: before any rule has matched. A rule cannot change them, so the key is refused rather than accepted and ignored; a route's section sets them for its requests.",
            triggering: [
                exampleHeader
                    + "rules:\n  - { name: slow, when: { status: [503] }, then: { do: retry, attempt-timeout: 100ms, deadline: 500ms } }\n"
            ],
            nonTriggering: [
                exampleHeader
                    + "routes:\n  - match: { path: \"/slow/*\" }\n    retry: { attempt-timeout: 100ms, deadline: 500ms }\nrules:\n  - { name: slow, when: { status: [503] }, then: { do: retry, max-retries: 1 } }\n"
            ]),
        describe(
            "invalid-merge", "a merge key '<<' with something other than mappings", "Only mappings can be merged.",
            triggering: [exampleHeader + "retry: { <<: 3 }\n"]),
        describe(
            "invalid-key", "a mapping key that is not a plain name", "Keys are names like 'max-retries'.",
            triggering: [exampleHeader + "retry: { [a, b]: 3 }\n"]),
        describe(
            "conflicting-keys", "two keys that exclude each other", "Only one of them can apply.",
            triggering: [exampleHeader + "classify: { code: body.status, use: custom }\n"]),
        LintRuleDescription(
            id: "coordination-without-tls", summary: "a redis:// coordination URL that leaves this machine without TLS",
            rationale:
                "The coordinator shares the tokens themselves through Redis; over plain TCP to another host anyone on "
                + "the path can read them. Use a TLS tunnel on a loopback port; loopback is fine.",
            severity: .warning,
            triggering: [
                exampleHeader + "coordination: { use: redis, with: { url: \"redis://10.0.0.5:6379/0\", key: api } }\n"
            ],
            nonTriggering: [
                exampleHeader + "coordination: { use: redis, with: { url: \"redis://127.0.0.1:6379/0\", key: api } }\n"
            ]),
        LintRuleDescription(
            id: "coordination-unsigned",
            summary: "a Redis coordination store on another host without 'signing-key-env'",
            rationale:
                "Every client of that Redis could publish credentials of its choosing, which every process would "
                + "sign requests with and save. With a shared key, every value read from the store is used only "
                + "when signed (HMAC-SHA256). The engine says so at run time too: a problem event at start, "
                + "listed in engine.problems and printed by policy fetch.",
            severity: .warning,
            triggering: [
                exampleHeader + "coordination: { use: redis, with: { url: \"redis://10.0.0.5:6379/0\", key: api } }\n"
            ],
            nonTriggering: [
                exampleHeader
                    + "coordination: { use: redis, with: { url: \"redis://10.0.0.5:6379/0\", key: api, signing-key-env: FLEET_KEY } }\n",
                exampleHeader + "coordination: { use: redis, with: { url: \"redis://127.0.0.1:6379/0\", key: api } }\n",
            ]),
        LintRuleDescription(
            id: "coordination-store-forgets",
            summary: "a coordination store set up to forget what the fleet shares (Redis evicting keys)",
            rationale:
                "Found by 'policy lint --check-env', which asks the store (Redis INFO memory): with a memory limit "
                + "and an eviction policy other than noeviction, Redis may drop the session or its lease under "
                + "memory pressure. The fleet re-seeds it from the newest pair a process holds, but each loss "
                + "delays refreshes by up to one lease, and a lease no process heard of cannot be honoured. The "
                + "engine says so at run time too: a problem event at start. Set maxmemory-policy noeviction, or "
                + "give the coordination keys a Redis of their own.",
            severity: .warning, triggering: [], nonTriggering: [exampleHeader]),
        LintRuleDescription(
            id: "coordination-tls-unsupported", summary: "a rediss:// coordination URL, which this build cannot use",
            rationale:
                "hiredis is built here without TLS, so the coordinator refuses rediss:// at run time and the fleet "
                + "would not coordinate. Reach Redis through a TLS tunnel on a loopback port instead.",
            severity: .error,
            triggering: [
                exampleHeader
                    + "coordination: { use: redis, with: { url: \"rediss://cache.internal:6380/0\", key: api } }\n"
            ],
            nonTriggering: [
                exampleHeader + "coordination: { use: redis, with: { url: \"redis://127.0.0.1:6380/0\", key: api } }\n"
            ]),
    ]
}
