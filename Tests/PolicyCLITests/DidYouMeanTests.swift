import Foundation
import ResponsePolicy
import Testing

@testable import PolicyCLI

/// A mistyped key gets "did you mean" in every section, not only at the top level (`max-retry:`
/// inside `retry` got the list of every key instead), and a plugin's options written beside
/// `with:` are one finding that says to indent them.
struct DidYouMeanTests {
    /// A section, where its keys are written (`KEY` stands for the key), and the keys it takes.
    struct Section: Sendable, CustomTestStringConvertible {
        var name: String
        var template: String
        var keys: [String]
        /// A simulation script, not a policy.
        var script = false
        var testDescription: String { name }
    }

    static let oauth2Options: [String] = {
        guard case .some(.some(let schema)) = PluginCatalog().schema(.refresh, "oauth2") else { return [] }
        return schema.options.map(\.name)
    }()

    static let sections: [Section] = [
        Section(name: "top level", template: "KEY: 1\n", keys: PolicyDecoder.topLevelKeys),
        Section(name: "retry", template: "retry:\n  KEY: 1\n", keys: PolicyDecoder.retryKeys),
        Section(
            name: "refresh", template: "refresh:\n  KEY: 1\n",
            keys: PolicyDecoder.pluginKeys + PolicyDecoder.refreshTuningKeys),
        Section(
            name: "logout", template: "logout:\n  KEY: 1\n",
            keys: PolicyDecoder.pluginKeys + PolicyDecoder.logoutTuningKeys),
        Section(name: "dispatch", template: "dispatch:\n  KEY: 1\n", keys: PolicyDecoder.dispatchKeys),
        Section(name: "budget", template: "retry:\n  budget:\n    KEY: 1\n", keys: PolicyDecoder.budgetKeys),
        Section(name: "limit", template: "refresh:\n  limit:\n    KEY: 1\n", keys: PolicyDecoder.limitKeys),
        Section(
            name: "transient", template: "refresh:\n  transient:\n    KEY: 1\n", keys: PolicyDecoder.transientKeys),
        Section(name: "a rule", template: "rules:\n  - KEY: 1\n", keys: PolicyDecoder.ruleKeys),
        Section(
            name: "when", template: "rules:\n  - { name: r, when: { KEY: 1 }, then: fail }\n",
            keys: PolicyDecoder.whenKeys),
        Section(
            name: "then", template: "rules:\n  - { name: r, when: { status: [503] }, then: { do: retry, KEY: 1 } }\n",
            keys: PolicyDecoder.retryKeys + ["do"]),
        Section(name: "classify", template: "classify:\n  KEY: 1\n", keys: PolicyDecoder.classifyKeys),
        Section(name: "a route", template: "routes:\n  - KEY: 1\n", keys: PolicyDecoder.routeKeys),
        Section(name: "match", template: "routes:\n  - { match: { KEY: 1 } }\n", keys: PolicyDecoder.matchKeys),
        Section(name: "authorize", template: "authorize:\n  KEY: 1\n", keys: PolicyDecoder.pluginKeys),
        Section(name: "store", template: "store:\n  KEY: 1\n", keys: PolicyDecoder.pluginKeys),
        Section(name: "an observe entry", template: "observe:\n  - KEY: 1\n", keys: PolicyDecoder.pluginKeys),
        Section(name: "coordination", template: "coordination:\n  KEY: 1\n", keys: PolicyDecoder.pluginKeys),
        Section(
            name: "oauth2's options", template: "refresh:\n  use: oauth2\n  with:\n    KEY: 1\n", keys: oauth2Options),
        Section(
            name: "a script's response",
            template: "requests:\n  - { id: a, responses: [{ status: 200, KEY: 1 }] }\n",
            keys: ["status", "body", "headers", "latency", "error"], script: true),
        Section(
            name: "a script's tokens",
            template: "requests: [{ id: a, responses: [{ status: 200 }] }]\ntokens: { KEY: 1 }\n",
            keys: ["initial", "rejected", "expire"], script: true),
    ]

    /// `key` with its second and third letters swapped (`mxa-retries`), one edit away: a typo.
    static func typo(_ key: String) -> String {
        var letters = Array(key)
        if letters.count >= 3, letters[1] != letters[2] { letters.swapAt(1, 2) } else { letters.swapAt(0, 1) }
        return String(letters)
    }

    @Test(arguments: sections)
    func aMistypedKeyInAnySectionGetsDidYouMean(_ section: Section) throws {
        #expect(!section.keys.isEmpty)
        for key in section.keys {
            let typed = Self.typo(key)
            let body = section.template.replacingOccurrences(of: "KEY", with: typed)
            let yaml = section.script ? body : "policy: 1\nname: t\n" + body
            let result = try #require(
                LintCommand.check(Array(yaml.utf8), file: "p.yaml", named: true, catalog: PluginCatalog()))
            let messages = result.diagnostics.map(\.message)
            #expect(
                messages.contains { $0.contains("'\(typed)'") && $0.hasSuffix("did you mean '\(key)'?") },
                "\(section.name): '\(typed)' for '\(key)' got \(messages)")
        }
    }

    /// The issue's own case: a singular of a long key is three edits away and still suggested.
    @Test func theSingularOfALongKeyIsSuggested() async throws {
        let directory = try TemporaryDirectory()
        try directory.write(
            "p.yaml",
            "policy: 1\nname: t\nrules: [{ name: r, when: { status: [503] }, then: retry }]\nretry:\n  max-retry: 3\n")
        let result = try await runPolicy(["lint", "p.yaml"], in: directory.url)
        expectResult(
            result,
            stdout: "p.yaml:5:3: error: unknown key 'max-retry'; did you mean 'max-retries'? [unknown-key]\n"
                + "1 file checked: 1 error, 0 warnings\n",
            status: 1)
    }

    /// A word far from every key still gets the list of keys, not a wild guess.
    @Test func aKeyFarFromEveryKeyGetsTheList() throws {
        let yaml = "policy: 1\nname: t\nlogout:\n  banana: 1\n"
        let result = try #require(
            LintCommand.check(Array(yaml.utf8), file: "p.yaml", named: true, catalog: PluginCatalog()))
        #expect(
            result.diagnostics.map(\.message) == [
                "unknown key 'banana' in 'logout'; expected one of 'use', 'with', 'cancel-in-flight', 'cooldown'"
            ])
    }

    // MARK: - Options beside `with:`

    static let misindented = """
        policy: 1
        name: t
        rules: [{ name: missing-scope, when: { status: [401], header: { WWW-Authenticate: '*insufficient_scope*' } }, then: deliver }, { name: expired, when: { status: [401] }, then: refresh }]
        refresh:
          use: oauth2
          with:
          token-url: https://auth.example.com/token
          client-id: app
          on-failure: fail
          on-exhausted: fail

        """

    /// A `with:` block indented one level too little gave four findings (two unknown keys, two
    /// missing options) and no hint: now one, at the first option, pointing at `with:`.
    @Test func optionsBesideWithAreOneFindingThatSaysIndentThem() async throws {
        let directory = try TemporaryDirectory()
        try directory.write("p.yaml", Self.misindented)
        let result = try await runPolicy(["lint", "p.yaml"], in: directory.url)
        expectResult(
            result,
            stdout: """
                p.yaml:7:3: error: 'token-url' and 'client-id' are options of refresh plugin 'oauth2', written \
                beside 'with:'; indent them under 'with:' [unknown-key]
                p.yaml:6:3: note: 'with:' is here
                p.yaml:8:3: note: 'client-id' is here
                1 file checked: 1 error, 0 warnings

                """,
            status: 1)
    }

    /// Without `with:` at all, the finding says to write them under it; the options are read as
    /// the plugin's, so a wrong value among them is still reported.
    @Test func optionsWithoutWithAreOneFindingAndStillChecked() throws {
        let yaml = Self.misindented.replacingOccurrences(of: "  with:\n", with: "")
            .replacingOccurrences(of: "https://auth.example.com/token", with: "not-a-url")
        let result = try #require(
            LintCommand.check(Array(yaml.utf8), file: "p.yaml", named: true, catalog: PluginCatalog()))
        #expect(
            result.diagnostics.map(\.message) == [
                "'token-url' and 'client-id' are options of refresh plugin 'oauth2'; write them under 'with:', as in "
                    + "with: { token-url: … }",
                "'token-url' must be an http:// or https:// URL with a host, not 'not-a-url'",
            ])
    }

    /// Every plugin section, not only `refresh`: one option of `header` beside `with:`.
    @Test func anOptionBesideWithInAPluginOnlySection() throws {
        let yaml = "policy: 1\nname: t\nauthorize:\n  use: header\n  with:\n  name: auth_token\n"
        let result = try #require(
            LintCommand.check(Array(yaml.utf8), file: "p.yaml", named: true, catalog: PluginCatalog()))
        #expect(
            result.diagnostics.map(\.description) == [
                "p.yaml:6:3: error: 'name' is an option of authorize plugin 'header', written beside 'with:'; indent it "
                    + "under 'with:' [unknown-key]"
            ])
    }
}
