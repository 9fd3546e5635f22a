import Foundation

extension PolicyDecoder {
    package static let retryKeys = [
        "max-retries", "backoff", "initial", "multiplier", "max-delay", "jitter", "retry-after", "attempt-timeout",
        "methods", "idempotency-key", "on-exhausted", "deadline", "budget",
    ]
    package static let refreshTuningKeys = [
        "timeout", "share-window", "max-per-request", "on-exhausted", "on-failure", "limit", "ahead",
        "hold-new-requests", "transient",
    ]
    package static let transientKeys = ["initial", "max-delay", "retry-after"]
    package static let dispatchKeys = ["max-in-flight-per-host"]
    package static let logoutTuningKeys = ["cancel-in-flight", "cooldown"]
    package static let budgetKeys = ["ratio", "min"]
    package static let limitKeys = ["count", "per"]
    package static let pluginKeys = ["use", "with"]

    // MARK: - retry

    /// Applies the keys of a `retry:` mapping (or a rule's `then:` overrides) over `base`.
    mutating func retry(
        _ node: YAMLNode, over base: RetrySettings, what: String = "'retry'", extraKeys: [String] = [],
        path: String = "retry"
    )
        -> RetrySettings
    {
        var settings = base
        guard let fields = mappingFields(node, what, allowed: Self.retryKeys + extraKeys) else { return settings }
        for (key, _, value) in fields {
            locations["\(path).\(key)"] = value.range
            switch key {
            case "max-retries": settings.maxRetries = integer(value, key, in: 0...100) ?? settings.maxRetries
            case "backoff": settings.backoff = choice(value, key, RetrySettings.Backoff.self) ?? settings.backoff
            case "initial": settings.initial = duration(value, key).flatMap { $0 } ?? settings.initial
            case "multiplier": settings.multiplier = number(value, key, in: 1...100) ?? settings.multiplier
            case "max-delay": if let d = duration(value, key, allowNone: true) { settings.maxDelay = d }
            case "jitter": settings.jitter = jitter(value) ?? settings.jitter
            case "retry-after":
                if let text = value.scalar, value.isPlainScalar, text == "honor" || text == "ignore" {
                    settings.honorRetryAfter = text == "honor"
                } else if value.scalar == "honour" {
                    report(
                        .error(
                            "invalid-value", "'retry-after' cannot be 'honour'; did you mean 'honor'?", at: value.range)
                    )
                } else {
                    report(
                        .error(
                            "invalid-value", "'retry-after' must be honor or ignore, not \(value.kindDescription)",
                            at: value.range))
                }
            case "attempt-timeout": if let d = duration(value, key, allowNone: true) { settings.attemptTimeout = d }
            case "methods": settings.methods = methods(value, key) ?? settings.methods
            case "idempotency-key":
                if let text = string(value, key) {
                    settings.idempotencyKey = text == "none" ? nil : text
                    if text != "none", !Self.isHeaderName(text) {
                        report(
                            .error(
                                "invalid-value",
                                "'idempotency-key' must be a header name, not '\(text.truncatedForMessage)'",
                                at: value.range))
                    }
                }
            case "on-exhausted": settings.onExhausted = action(value, key) ?? settings.onExhausted
            case "deadline": if let d = duration(value, key, allowNone: true) { settings.deadline = d }
            case "budget": settings.budget = budget(value) ?? settings.budget
            default: break
            }
        }
        return settings
    }

    mutating func jitter(_ node: YAMLNode) -> RetrySettings.Jitter? {
        guard let text = node.scalar, !node.isNull else {
            report(
                .error(
                    "invalid-type", "'jitter' must be none, full, equal or a percentage like \"20%\"", at: node.range))
            return nil
        }
        switch text {
        case "none": return RetrySettings.Jitter.none
        case "full": return .full
        case "equal": return .equal
        default:
            if text.hasSuffix("%"), let percent = Double(text.dropLast()), percent >= 0, percent <= 100 {
                return .proportional(percent / 100)
            }
            report(
                .error(
                    "invalid-value",
                    "'jitter' cannot be '\(text.truncatedForMessage)'; use none, full, equal or a percentage from \"0%\" to \"100%\"",
                    at: node.range))
            return nil
        }
    }

    mutating func budget(_ node: YAMLNode) -> RetrySettings.Budget?? {
        if node.scalar == "none" { return .some(nil) }
        guard let fields = mappingFields(node, "'budget'", allowed: Self.budgetKeys) else { return nil }
        var budget = RetrySettings().budget ?? RetrySettings.Budget(ratio: 0.2, min: 100)
        for (key, _, value) in fields {
            if key == "ratio" { budget.ratio = number(value, key, in: 0...1000) ?? budget.ratio }
            if key == "min" { budget.min = integer(value, key, in: 0...1_000_000) ?? budget.min }
        }
        return .some(budget)
    }

    mutating func methods(_ node: YAMLNode, _ key: String) -> [String]? {
        guard let items = list(node, key) else { return nil }
        var result: [String] = []
        for item in items {
            guard let text = string(item, key) else { continue }
            let upper = text.uppercased()
            guard Self.isHeaderName(upper) else {
                report(.error("invalid-value", "'\(text.truncatedForMessage)' is not an HTTP method", at: item.range))
                continue
            }
            result.append(upper)
        }
        return result
    }

    static func isHeaderName(_ text: String) -> Bool {
        !text.isEmpty
            && text.utf8.allSatisfy { byte in
                (0x30...0x39).contains(byte) || (0x41...0x5A).contains(byte) || (0x61...0x7A).contains(byte)
                    || "!#$%&'*+-.^_`|~".utf8.contains(byte)
            }
    }

    // MARK: - refresh

    mutating func refresh(
        _ node: YAMLNode, over base: RefreshSettings, what: String = "'refresh'", tuningOnly: Bool = false,
        extraKeys: [String] = [], path: String = "refresh"
    )
        -> RefreshSettings
    {
        var settings = base
        let allowed = (tuningOnly ? [] : Self.pluginKeys) + Self.refreshTuningKeys + extraKeys
        guard
            let (fields, misplaced) = pluginSectionFields(
                node, what, allowed: allowed, kind: tuningOnly ? nil : .refresh)
        else { return settings }
        if !tuningOnly, let plugin = pluginReference(.refresh, fields, misplaced: misplaced) {
            settings.plugin = plugin
        }
        for (key, _, value) in fields {
            locations["\(path).\(key)"] = value.range
            switch key {
            case "timeout": settings.timeout = duration(value, key).flatMap { $0 } ?? settings.timeout
            case "share-window": settings.shareWindow = duration(value, key).flatMap { $0 } ?? settings.shareWindow
            case "max-per-request": settings.maxPerRequest = integer(value, key, in: 0...100) ?? settings.maxPerRequest
            case "on-exhausted": settings.onExhausted = action(value, key) ?? settings.onExhausted
            case "on-failure": settings.onFailure = action(value, key) ?? settings.onFailure
            case "limit":
                if value.scalar == "none" {
                    settings.limit = nil
                } else if let limitFields = mappingFields(value, "'limit'", allowed: Self.limitKeys) {
                    var limit = settings.limit ?? RefreshSettings.Limit(count: 5, per: .seconds(30))
                    for (limitKey, _, limitValue) in limitFields {
                        if limitKey == "count" {
                            limit.count = integer(limitValue, limitKey, in: 1...1_000_000) ?? limit.count
                        }
                        if limitKey == "per" { limit.per = duration(limitValue, limitKey).flatMap { $0 } ?? limit.per }
                    }
                    settings.limit = limit
                }
            case "ahead": if let d = duration(value, key, allowNone: true) { settings.ahead = d }
            case "hold-new-requests": settings.holdNewRequests = boolean(value, key) ?? settings.holdNewRequests
            case "transient":
                if value.scalar == "none", value.isPlainScalar {
                    settings.transient = nil
                } else if let transientFields = mappingFields(value, "'transient'", allowed: Self.transientKeys) {
                    var transient = settings.transient ?? RefreshSettings.Transient()
                    for (transientKey, _, transientValue) in transientFields {
                        locations["\(path).transient.\(transientKey)"] = transientValue.range
                        switch transientKey {
                        case "initial":
                            transient.initial =
                                duration(transientValue, transientKey).flatMap { $0 } ?? transient.initial
                        case "max-delay":
                            transient.maxDelay =
                                duration(transientValue, transientKey).flatMap { $0 } ?? transient.maxDelay
                        case "retry-after":
                            if let text = transientValue.scalar, transientValue.isPlainScalar,
                                text == "honor" || text == "ignore"
                            {
                                transient.honorRetryAfter = text == "honor"
                            } else {
                                report(
                                    .error(
                                        "invalid-value",
                                        "'retry-after' must be honor or ignore, not \(transientValue.kindDescription)",
                                        at: transientValue.range))
                            }
                        default: break
                        }
                    }
                    settings.transient = transient
                }
            default: break
            }
        }
        return settings
    }

    // MARK: - logout

    mutating func logout(
        _ node: YAMLNode, over base: LogoutSettings, what: String = "'logout'", tuningOnly: Bool = false,
        extraKeys: [String] = [], path: String = "logout"
    )
        -> LogoutSettings
    {
        var settings = base
        let allowed = (tuningOnly ? [] : Self.pluginKeys) + Self.logoutTuningKeys + extraKeys
        guard
            let (fields, misplaced) = pluginSectionFields(
                node, what, allowed: allowed, kind: tuningOnly ? nil : .logout)
        else { return settings }
        if !tuningOnly, let plugin = pluginReference(.logout, fields, misplaced: misplaced) { settings.plugin = plugin }
        for (key, _, value) in fields {
            locations["\(path).\(key)"] = value.range
            switch key {
            case "cancel-in-flight": settings.cancelInFlight = boolean(value, key) ?? settings.cancelInFlight
            case "cooldown": settings.cooldown = duration(value, key).flatMap { $0 } ?? settings.cooldown
            default: break
            }
        }
        return settings
    }

    // MARK: - dispatch

    /// The `dispatch:` section.
    mutating func dispatch(_ node: YAMLNode) -> DispatchSettings {
        var settings = DispatchSettings()
        guard let fields = mappingFields(node, "'dispatch'", allowed: Self.dispatchKeys) else { return settings }
        for (key, _, value) in fields {
            locations["dispatch.\(key)"] = value.range
            if key == "max-in-flight-per-host" {
                if value.isPlainScalar, value.scalar == "unlimited" {
                    settings.maxInFlightPerHost = .unlimited
                } else if value.isPlainScalar, value.scalar == "auto" {
                    settings.maxInFlightPerHost = .auto
                } else if !value.isPlainScalar || !Self.isInteger(value.scalar ?? "") {
                    report(
                        .error(
                            "invalid-type",
                            "'\(key)' must be a whole number, auto or unlimited, not \(value.kindDescription)",
                            at: value.range))
                } else if let limit = integer(value, key, in: 1...1_000_000) {
                    settings.maxInFlightPerHost = .perHost(limit)
                }
            }
        }
        return settings
    }

    // MARK: - plugins

    /// A plugin-only section (`authorize:`, `store:`, one `observe:` entry).
    mutating func pluginSection(_ kind: PluginKind, _ node: YAMLNode, what: String) -> PluginReference? {
        guard let (fields, misplaced) = pluginSectionFields(node, what, allowed: Self.pluginKeys, kind: kind) else {
            return nil
        }
        guard let plugin = pluginReference(kind, fields, misplaced: misplaced) else {
            report(.error("missing-key", "\(what) needs 'use:' to name a \(kind.rawValue) plugin", at: node.range))
            return nil
        }
        return plugin
    }

    /// The fields of a section whose `use:` names a `kind` plugin (the keys in `allowed`), and
    /// the plugin's options written beside `with:` instead of under it, or without `with:`.
    ///
    /// Why: a `with:` block indented one level too little puts every option beside `with:`, and
    /// each was reported twice (an unknown key of the section, and a missing option of the
    /// plugin), none saying what was wrong. Those keys are one finding, "indent these under
    /// `with:`", and are then read as the plugin's options, so nothing else is reported about
    /// them. `kind` is `nil` for a section that names no plugin (a rule's `then:`).
    mutating func pluginSectionFields(
        _ node: YAMLNode, _ what: String, allowed: [String], kind: PluginKind?
    ) -> (fields: [(key: String, keyNode: YAMLNode, value: YAMLNode)], misplaced: [(String, YAMLNode, YAMLNode)])? {
        var misplaced: [(String, YAMLNode, YAMLNode)] = []
        if let kind, let pairs = node.pairs, let use = pairs.first(where: { $0.key.scalar == "use" }),
            let name = use.value.scalar, let found = catalog.schema(kind, name), let schema = found
        {
            let options = Set(schema.options.map(\.name)).union(schema.forbiddenSecrets.keys)
            for pair in pairs {
                guard let key = pair.key.scalar, !allowed.contains(key), options.contains(key) else { continue }
                misplaced.append((key, pair.key, pair.value))
            }
            if let first = misplaced.first {
                report(
                    Self.misplacedOptions(
                        misplaced.map(\.0), kind: kind, plugin: name, at: first.1.range,
                        withKey: pairs.first { $0.key.scalar == "with" }?.key,
                        others: misplaced.dropFirst().map { ($0.0, $0.1.range) }))
            }
        }
        let keys = misplaced.map(\.0)
        guard let fields = mappingFields(node, what, allowed: allowed + keys) else { return nil }
        return (fields.filter { !keys.contains($0.key) }, misplaced)
    }

    /// `'token-url' and 'client-id' are options of refresh plugin 'oauth2', written beside
    /// 'with:'; indent them under 'with:'` (or, without `with:`, write them under it).
    static func misplacedOptions(
        _ keys: [String], kind: PluginKind, plugin: String, at range: SourceRange, withKey: YAMLNode?,
        others: [(key: String, range: SourceRange)]
    ) -> Diagnostic {
        let quoted = keys.map { "'\($0.truncatedForMessage)'" }
        let listed =
            quoted.count == 1 ? quoted[0] : quoted.dropLast().joined(separator: ", ") + " and " + (quoted.last ?? "")
        let subject =
            keys.count == 1
            ? "\(listed) is an option of \(kind.rawValue) plugin '\(plugin.truncatedForMessage)'"
            : "\(listed) are options of \(kind.rawValue) plugin '\(plugin.truncatedForMessage)'"
        let pronoun = keys.count == 1 ? "it" : "them"
        let message =
            withKey != nil
            ? "\(subject), written beside 'with:'; indent \(pronoun) under 'with:'"
            : "\(subject); write \(pronoun) under 'with:', as in with: { \(keys[0].truncatedForMessage): … }"
        var notes = others.map { Diagnostic.Note(range: $0.range, message: "'\($0.key.truncatedForMessage)' is here") }
        if let withKey { notes.insert(Diagnostic.Note(range: withKey.range, message: "'with:' is here"), at: 0) }
        return .error("unknown-key", message, at: range, notes: notes)
    }

    /// Reads `use:` and `with:` from a section's fields and checks them against the catalog;
    /// `misplaced` are the plugin's options found beside `with:` (already reported), read as if
    /// written under it.
    mutating func pluginReference(
        _ kind: PluginKind, _ fields: [(key: String, keyNode: YAMLNode, value: YAMLNode)],
        misplaced: [(String, YAMLNode, YAMLNode)] = []
    ) -> PluginReference? {
        let useField = fields.first { $0.key == "use" }
        let withField = fields.first { $0.key == "with" }
        guard let useField else {
            if let withField {
                report(
                    .error(
                        "missing-key", "'with' gives options, but no plugin is named with 'use'",
                        at: withField.keyNode.range))
            }
            return nil
        }
        guard let name = string(useField.value, "use") else { return nil }
        var options: [String: PluginOption] = [:]
        var optionNodes: [(String, YAMLNode, YAMLNode)] = []
        if let withField {
            if isOptionMapping(withField.value), let pairs = withField.value.pairs {
                for pair in pairs {
                    guard let key = pair.key.scalar else { continue }
                    optionNodes.append((key, pair.key, pair.value))
                    options[key] = pluginOption(pair.value)
                }
            }
        }
        for (key, keyNode, value) in misplaced where options[key] == nil {
            optionNodes.append((key, keyNode, value))
            options[key] = pluginOption(value)
        }
        let reference = PluginReference(kind: kind, name: name, options: options, range: useField.value.range)
        guard let schema = catalog.schema(kind, name) else {
            let names = catalog.names(kind)
            let known = names.isEmpty ? "none are built in" : "known: \(names.joined(separator: ", "))"
            report(
                .error(
                    "unknown-plugin",
                    "unknown \(kind.rawValue) plugin '\(name.truncatedForMessage)'\(Suggestion.hint(for: name, in: names))"
                        + " (\(known); declare a host plugin with --plugin \(kind.rawValue):\(name.truncatedForMessage))",
                    at: useField.value.range))
            return reference
        }
        if let schema {
            checkOptions(
                optionNodes, schema: schema, plugin: name, kind: kind,
                at: withField?.keyNode.range ?? useField.value.range)
        }
        return reference
    }

    /// Whether `with:` is a mapping; reports anything else but null.
    private mutating func isOptionMapping(_ node: YAMLNode) -> Bool {
        if node.pairs != nil { return true }
        if !node.isNull {
            report(
                .error(
                    "invalid-type", "'with' must be a mapping of options, not \(node.kindDescription)", at: node.range))
        }
        return false
    }

    mutating func checkOptions(
        _ options: [(String, YAMLNode, YAMLNode)], schema: PluginSchema, plugin: String, kind: PluginKind,
        at range: SourceRange
    ) {
        let names = schema.options.map(\.name)
        for (key, keyNode, value) in options {
            if let instead = schema.forbiddenSecrets[key] {
                report(
                    .error(
                        "secret-in-policy",
                        "'\(key)' would put a secret in the policy file; store it in an environment variable and name that with '\(instead)'",
                        at: keyNode.range))
                continue
            }
            guard let option = schema.options.first(where: { $0.name == key }) else {
                let hint = Suggestion.hint(for: key, in: names)
                let known =
                    names.isEmpty
                    ? "it takes no options" : "it takes \(names.map { "'\($0)'" }.joined(separator: ", "))"
                report(
                    .error(
                        "unknown-plugin-option",
                        "\(kind.rawValue) plugin '\(plugin)' has no option '\(key.truncatedForMessage)'\(hint.isEmpty ? "; \(known)" : hint)",
                        at: keyNode.range))
                continue
            }
            checkOptionType(value, option)
        }
        for option in schema.options where option.required && !options.contains(where: { $0.0 == option.name }) {
            report(
                .error(
                    "missing-plugin-option",
                    "\(kind.rawValue) plugin '\(plugin)' needs the option '\(option.name)' (\(option.summary))",
                    at: range))
        }
    }

    mutating func checkOptionType(_ node: YAMLNode, _ option: PluginSchema.Option) {
        let key = option.name
        switch option.type {
        case .string:
            if let text = string(node, key), !option.values.isEmpty, !option.values.contains(text) {
                report(
                    .error(
                        "invalid-value",
                        "'\(key)' must be one of \(option.values.map { "'\($0)'" }.joined(separator: ", ")), not '\(text.truncatedForMessage)'"
                            + Suggestion.hint(for: text, in: option.values),
                        at: node.range))
            }
        case .url:
            guard let text = string(node, key) else { return }
            guard let url = TokenEndpoint.endpointURL(text) else {
                report(
                    .error(
                        "invalid-value",
                        "'\(key)' must be an http:// or https:// URL with a host, not '\(text.truncatedForMessage)'",
                        at: node.range))
                return
            }
            if let secret = Self.secretInURL(url) {
                report(
                    .error(
                        "secret-in-policy",
                        "'\(key)' carries \(secret) in the URL; a secret belongs in the environment",
                        at: node.range))
            }
            if url.scheme?.lowercased() == "http", let host = url.host, !Self.isLoopback(host) {
                report(
                    .warning(
                        "insecure-endpoint",
                        "'\(key)' sends tokens over plain http to '\(host.truncatedForMessage)'; use https (plain http is for loopback addresses only)",
                        at: node.range))
            }
        case .duration: _ = duration(node, key)
        case .integer: _ = integer(node, key, in: Int.min...Int.max)
        case .boolean: _ = boolean(node, key)
        case .stringMap:
            guard let pairs = node.pairs else {
                report(
                    .error("invalid-type", "'\(key)' must be a mapping, not \(node.kindDescription)", at: node.range))
                return
            }
            for pair in pairs where key == "headers" {
                guard let name = pair.key.scalar, let value = pair.value.scalar, Self.isCredentialHeader(name),
                    Self.holdsLiteralSecret(value)
                else { continue }
                report(
                    .error(
                        "secret-in-policy",
                        "the header '\(name.truncatedForMessage)' would put a credential in the policy file; write '{env:NAME}' and set NAME in the environment",
                        at: pair.value.range))
            }
            for pair in pairs where key == "body" {
                guard let name = pair.key.scalar, let value = pair.value.scalar, Self.isSecretName(name),
                    Self.holdsLiteralSecret(value)
                else { continue }
                report(
                    .error(
                        "secret-in-policy",
                        "the body field '\(name.truncatedForMessage)' would put a secret in the policy file; write '{env:NAME}' and set NAME in the environment",
                        at: pair.value.range))
            }
            for pair in pairs where pair.value.scalar == nil {
                report(
                    .error(
                        "invalid-type", "'\(key)' values must be texts, not \(pair.value.kindDescription)",
                        at: pair.value.range))
            }
        case .stringList:
            let items = list(node, key) ?? []
            var texts: [(String, YAMLNode)] = []
            for item in items { if let text = string(item, key) { texts.append((text, item)) } }
            if key == "command" { checkCommandSecrets(texts) }
        case .valuePath:
            if let text = string(node, key), ValuePath(text) == nil {
                report(
                    .error(
                        "invalid-value",
                        "'\(key)' must be body.<path> or header.<Name>, not '\(text.truncatedForMessage)'",
                        at: node.range))
            }
        }
    }

    /// Finds secrets written into a credential command's argv (`exec`): `--password hunter2`,
    /// `--client-secret=…`, `token=…`, an `Authorization: Bearer …` argument, a URL carrying one.
    /// The argv is in the policy file and in every process listing (`ps`); a secret belongs in a
    /// variable passed with `env:`, read by the command.
    mutating func checkCommandSecrets(_ arguments: [(String, YAMLNode)]) {
        func refuse(_ what: String, _ node: YAMLNode) {
            report(
                .error(
                    "secret-in-policy",
                    "the command argument \(what) would put a secret in the policy file and in process listings; pass it in a variable listed in 'env:' and let the command read it",
                    at: node.range))
        }
        var previousNamesSecret = false
        for (index, (text, node)) in arguments.enumerated() {
            defer { previousNamesSecret = index > 0 && Self.isSecretOption(text) }
            if index == 0 { continue }
            if previousNamesSecret, !text.hasPrefix("-"), !Self.looksLikePath(text) {
                refuse("after '\(arguments[index - 1].0.truncatedForMessage)'", node)
                continue
            }
            if let equals = text.firstIndex(of: "="), Self.isSecretOption(String(text[..<equals])),
                !Self.looksLikePath(String(text[text.index(after: equals)...]))
            {
                refuse("'\(String(text[..<equals]).truncatedForMessage)=…'", node)
                continue
            }
            if let colon = text.firstIndex(of: ":"), Self.isCredentialHeader(String(text[..<colon])),
                !text[text.index(after: colon)...].trimmingCharacters(in: .whitespaces).isEmpty
            {
                refuse("'\(String(text[..<colon]).truncatedForMessage): …'", node)
                continue
            }
            if let url = TokenEndpoint.endpointURL(text), let secret = Self.secretInURL(url) {
                refuse("carrying \(secret) in a URL", node)
            }
        }
    }

    /// An option whose name says it takes a secret (`--client-secret`, `--token`, `--password`,
    /// `api_key`), with any leading dashes; not one that takes where a secret is (`--token-file`,
    /// `--password-env`, `--secret-name`, `--key-id`).
    static func isSecretOption(_ text: String) -> Bool {
        let name = text.drop { $0 == "-" }.lowercased()
        guard !name.isEmpty, name.allSatisfy({ $0.isLetter || $0.isNumber || $0 == "-" || $0 == "_" }) else {
            return false
        }
        let folded = name.filter(\.isLetter)
        let pointers = [
            "file", "path", "env", "var", "name", "id", "url", "uri", "type", "stdin", "cmd", "command", "dir",
            "format", "ttl", "lifetime", "expiry", "cache", "helper", "store",
        ]
        if pointers.contains(where: { folded.hasSuffix($0) }) { return false }
        return isSecretName(name)
    }

    /// An argument that names a file rather than holding a value: `/run/secrets/x`, `~/.token`.
    static func looksLikePath(_ text: String) -> Bool {
        text.isEmpty || ["/", "./", "../", "~"].contains { text.hasPrefix($0) }
    }

    /// What secret a URL written in a policy carries, if any: a password in its user part, or a
    /// query parameter named like one.
    static func secretInURL(_ url: URL) -> String? {
        if let password = url.password(percentEncoded: true), !password.isEmpty { return "a password" }
        if let user = url.user(percentEncoded: true), !user.isEmpty {
            return "user information (a token or a user name)"
        }
        let components = URLComponents(url: url, resolvingAgainstBaseURL: false)
        for item in components?.queryItems ?? [] where isSecretName(item.name) && !(item.value ?? "").isEmpty {
            return "the query parameter '\(item.name.truncatedForMessage)'"
        }
        return nil
    }

    /// Names that hold secrets: `client_secret`, `password`, `api-key`, `access_token`, `token`,
    /// `X-Auth-Token`, `key`, `sig`, ….
    static func isSecretName(_ name: String) -> Bool {
        let folded = name.lowercased().filter { $0.isLetter }
        return ["secret", "password", "passwd", "apikey", "token", "credential", "signature", "privatekey"].contains {
            folded.contains($0)
        } || ["key", "sig", "auth", "pwd", "pass"].contains(folded)
    }

    /// Whether a header or body value written in the policy holds a secret itself, rather than
    /// naming one: anything but placeholders (`{env:NAME}`, `{file:PATH}`, `{refresh_token}`,
    /// `{access_token}`), optionally after one scheme word (`Bearer `, `Basic `) and joined by
    /// spaces or colons. `Basic LITERAL {env:X}` holds one; so does a value without placeholders.
    static func holdsLiteralSecret(_ value: String) -> Bool {
        // The literal runs around the placeholders: one more than there are placeholders.
        var runs: [String] = []
        var current = ""
        var rest = Substring(value)
        while let open = rest.firstIndex(of: "{"), let close = rest[open...].firstIndex(of: "}") {
            let inner = rest[rest.index(after: open)..<close]
            let isPlaceholder =
                inner == "refresh_token" || inner == "access_token"
                || ((inner.hasPrefix("env:") || inner.hasPrefix("file:")) && !inner.hasSuffix(":"))
            if isPlaceholder {
                runs.append(current + rest[..<open])
                current = ""
            } else {
                current += rest[...close]
            }
            rest = rest[rest.index(after: close)...]
        }
        runs.append(current + rest)
        guard let first = runs.first, runs.count > 1 else { return true }
        // Before the first placeholder: nothing, or one scheme word and a space (`Bearer `).
        // `Secret{env:X}` glues a literal to the secret: the literal is part of it.
        let scheme = first.trimmingCharacters(in: .whitespaces)
        guard scheme.allSatisfy({ $0.isLetter || $0 == "-" }), scheme.isEmpty || first.last == " " else {
            return true
        }
        return runs.dropFirst().contains { run in !run.allSatisfy { $0 == " " || $0 == ":" } }
    }

    /// `localhost` and the loopback addresses, where plain http never leaves the machine: an
    /// IPv4 address in 127.0.0.0/8 (four numbers, so `127.0.0.1.evil.example` is a name, not an
    /// address), `::1`, or `::ffff:127.x.x.x`.
    static func isLoopback(_ host: String) -> Bool {
        let bare = host.trimmingCharacters(in: CharacterSet(charactersIn: "[]")).lowercased()
        if bare == "localhost" || bare.hasSuffix(".localhost") { return true }
        var v4 = in_addr()
        if inet_pton(AF_INET, bare, &v4) == 1 {
            return withUnsafeBytes(of: &v4) { $0.first == 127 }
        }
        var v6 = in6_addr()
        guard inet_pton(AF_INET6, bare, &v6) == 1 else { return false }
        return withUnsafeBytes(of: &v6) { bytes in
            let loopback = bytes.prefix(15).allSatisfy { $0 == 0 } && bytes[15] == 1
            let mapped = bytes.prefix(10).allSatisfy { $0 == 0 } && bytes[10] == 0xFF && bytes[11] == 0xFF
            return loopback || (mapped && bytes[12] == 127)
        }
    }

    /// Request headers whose value is a credential.
    static func isCredentialHeader(_ name: String) -> Bool {
        let folded = name.lowercased()
        return ["authorization", "proxy-authorization", "cookie", "x-api-key", "api-key"].contains(folded)
            || isSecretName(folded)
    }

    func pluginOption(_ node: YAMLNode) -> PluginOption {
        switch node.value {
        case .scalar(let text, let style):
            if style == .plain, node.tag == nil {
                if text == "true" { return .bool(true) }
                if text == "false" { return .bool(false) }
                if Self.isInteger(text) || Double(text) != nil { return .number(text) }
            }
            return .string(text)
        case .sequence(let items): return .list(items.map(pluginOption))
        case .mapping(let pairs):
            var map: [String: PluginOption] = [:]
            for pair in pairs { if let key = pair.key.scalar { map[key] = pluginOption(pair.value) } }
            return .map(map)
        }
    }
}

/// `body.<dot.path>` or `header.<Name>`: where a value is read from a response.
package enum ValuePath: Sendable, Hashable {
    case body(JSONPath)
    case header(String)

    package init?(_ text: String) {
        if text.hasPrefix("body."), let path = JSONPath(String(text.dropFirst(5))) {
            self = .body(path)
        } else if text.hasPrefix("header."), PolicyDecoder.isHeaderName(String(text.dropFirst(7))) {
            self = .header(String(text.dropFirst(7)))
        } else {
            return nil
        }
    }
}
