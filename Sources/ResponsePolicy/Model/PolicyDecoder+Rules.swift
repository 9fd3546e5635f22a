import Foundation

/// The sections a rule's `then:` overrides are applied over.
struct SectionScope {
    var retry: RetrySettings
    var refresh: RefreshSettings
    var logout: LogoutSettings
}

extension PolicyDecoder {
    package static let topLevelKeys = [
        "policy", "name", "classify", "rules", "refresh", "logout", "retry", "authorize", "store", "observe", "routes",
        "dispatch", "coordination",
    ]
    package static let ruleKeys = ["name", "when", "then"]
    package static let whenKeys = ["status", "code", "header", "error", "method", "path"]
    package static let routeKeys = ["match", "rules", "classify", "refresh", "logout", "retry", "authorize"]
    package static let classifyKeys = ["code", "use", "with"]
    package static let matchKeys = ["path", "method"]

    // MARK: - rules

    mutating func rules(_ node: YAMLNode, scope: SectionScope, namePrefix: String = "rule") -> [Rule] {
        guard let items = node.items else {
            if !node.isNull {
                report(
                    .error(
                        "invalid-type", "'rules' must be a list of rules, not \(node.kindDescription)", at: node.range))
            }
            return []
        }
        var result: [Rule] = []
        result.reserveCapacity(items.count)
        for (index, item) in items.enumerated() {
            if let rule = rule(item, index: index, scope: scope, namePrefix: namePrefix) { result.append(rule) }
        }
        return result
    }

    mutating func rule(_ node: YAMLNode, index: Int, scope: SectionScope, namePrefix: String) -> Rule? {
        guard let pairs = mappingPairs(node, "a rule") else { return nil }
        // The default name (`rule-3`) only for a rule that gives none.
        var given: String?
        var condition: Condition?
        var thenNode: YAMLNode?
        var source = RuleSource()
        var hasWhen = false
        for pair in pairs {
            guard let key = fieldKey(pair, "a rule", allowed: Self.ruleKeys) else { continue }
            let value = pair.value
            switch key {
            case "name":
                if let text = string(value, key) {
                    if Self.isPolicyName(text) {
                        given = text
                        source.name = value.range
                    } else {
                        report(
                            .error(
                                "invalid-name",
                                "rule name '\(text.truncatedForMessage)' must be lower-case letters, digits and '-'",
                                at: value.range))
                    }
                }
            case "when":
                hasWhen = true
                condition = self.condition(value)
                source.when = value.range
                let codeNode = value.pairs?.first(where: { $0.key.scalar == "code" })?.value
                for item in codeNode?.items ?? [] {
                    if let code = item.scalar, source.codes[code] == nil { source.codes[code] = item.range }
                }
                if let single = codeNode, let code = single.scalar {
                    source.codes[code] = single.range
                }
            case "then":
                thenNode = value
                source.then = value.range
            default: break
            }
        }
        let name = given ?? "\(namePrefix)-\(index + 1)"
        if !hasWhen {
            report(.error("missing-key", "rule '\(name)' needs 'when:' to say what it matches", at: node.range))
        }
        guard let thenNode else {
            report(
                .error(
                    "missing-key", "rule '\(name)' needs 'then:' (deliver, fail, retry, refresh or logout)",
                    at: node.range))
            return nil
        }
        guard let condition,
            var rule = then(
                thenNode, rule: Rule(name: name, when: condition, action: .deliver, range: node.range), scope: scope)
        else { return nil }
        rule.range = node.range
        let keys = rule.source.keys
        rule.source = source
        rule.source.keys = keys
        return rule
    }

    /// Reads `then:` and resolves its overrides over `scope`.
    mutating func then(_ node: YAMLNode, rule: consuming Rule, scope: SectionScope) -> Rule? {
        if node.scalar != nil {
            guard let action = choice(node, "then", ActionKind.self) else { return nil }
            rule.action = action
            return rule
        }
        guard let pairs = node.pairs else {
            report(
                .error(
                    "invalid-type", "'then' must be an action or a mapping with 'do:', not \(node.kindDescription)",
                    at: node.range))
            return nil
        }
        guard let doPair = pairs.first(where: { $0.key.scalar == "do" }) else {
            report(.error("missing-key", "a 'then:' mapping needs 'do:' to name the action", at: node.range))
            return nil
        }
        guard let action = choice(doPair.value, "do", ActionKind.self) else { return nil }
        rule.action = action
        // Kept with the rule for as long as the policy lives: a copy of its own, so that the
        // rule does not keep the whole file's nodes alive.
        rule.overrides = node.detached()
        apply(overrides: node, to: &rule, scope: scope)
        return rule
    }

    /// Applies a `then:` mapping's keys over the section its action uses.
    mutating func apply(overrides node: YAMLNode, to rule: inout Rule, scope: SectionScope) {
        let what = "'then' of a \(rule.action.rawValue) rule"
        let saved = locations
        let path = "then"
        switch rule.action {
        case .retry: rule.retry = retry(node, over: scope.retry, what: what, extraKeys: ["do"], path: path)
        case .refresh:
            rule.refresh = refresh(
                node, over: scope.refresh, what: what, tuningOnly: true, extraKeys: ["do"], path: path)
        case .logout:
            rule.logout = logout(node, over: scope.logout, what: what, tuningOnly: true, extraKeys: ["do"], path: path)
        case .deliver, .fail: _ = mappingFields(node, what, allowed: ["do"])
        }
        refuseRequestWide(in: node, rule: &rule, scope: scope)
        for (key, range) in locations where key.hasPrefix("then.") {
            rule.source.keys[String(key.dropFirst(5))] = range
        }
        locations = saved
    }

    /// Keys of a section that apply to the whole request, before any rule has matched: the
    /// deadline and the attempt timeout are armed when the request starts and before each
    /// attempt; refreshing ahead of expiry and holding requests during a refresh happen before a
    /// request is sent. A rule cannot change them, so a `then:` that writes one is refused rather
    /// than accepted and ignored. (A route's sections set them for its requests.)
    static let requestWideKeys: [ActionKind: [String]] = [
        .retry: RetrySettings.requestWideNames, .refresh: RefreshSettings.requestWideNames,
        .logout: LogoutSettings.requestWideNames,
    ]

    /// Reports every request-wide key a rule's `then:` writes, at the key, and keeps the
    /// scope's value for it, so the compiled rule holds what the engine runs.
    mutating func refuseRequestWide(in node: YAMLNode, rule: inout Rule, scope: SectionScope) {
        guard let keys = Self.requestWideKeys[rule.action], let pairs = node.pairs else { return }
        for pair in pairs {
            guard let key = pair.key.scalar, keys.contains(key) else { continue }
            let section = rule.action.rawValue
            report(
                .error(
                    "request-wide-override",
                    "'\(key)' applies to the whole request, not to one rule; set it in '\(section):' or in a route's '\(section):'",
                    at: pair.key.range))
        }
        if let retry = rule.retry { rule.retry = retry.withRequestWide(of: scope.retry) }
        if let refresh = rule.refresh { rule.refresh = refresh.withRequestWide(of: scope.refresh) }
        if let logout = rule.logout { rule.logout = logout.withRequestWide(of: scope.logout) }
    }

    mutating func condition(_ node: YAMLNode) -> Condition? {
        guard let pairs = mappingPairs(node, "'when'") else { return nil }
        var condition = Condition()
        for pair in pairs {
            guard let key = fieldKey(pair, "'when'", allowed: Self.whenKeys) else { continue }
            let value = pair.value
            switch key {
            case "status": condition.statuses = statuses(value)
            case "code":
                if let (codes, ranges) = codes(value) {
                    condition.codes = codes
                    condition.codeRanges = ranges.isEmpty ? nil : ranges
                }
            case "header":
                guard let pairs = value.pairs else {
                    report(
                        .error(
                            "invalid-type", "'header' must map header names to values, like { X-Reason: expired }",
                            at: value.range))
                    continue
                }
                var headers: [Condition.HeaderMatch] = []
                for pair in pairs {
                    guard let name = pair.key.scalar, Self.isHeaderName(name) else {
                        report(
                            .error(
                                "invalid-value", "'\(pair.key.scalar?.truncatedForMessage ?? "")' is not a header name",
                                at: pair.key.range))
                        continue
                    }
                    if let glob = glob(pair.value, name) { headers.append(.init(name: name, value: glob)) }
                }
                condition.headers = headers
            case "error":
                var errors: [Condition.ErrorMatch] = []
                for item in list(value, key) ?? [] {
                    if let match = choice(item, key, Condition.ErrorMatch.self) { errors.append(match) }
                }
                condition.errors = errors
            case "method": condition.methods = methods(value, key)
            case "path": if let glob = glob(value, key) { condition.path = glob }
            default: break
            }
        }
        return condition
    }

    /// A glob; a pattern longer than ``Glob/maxLength`` is an error (matching stays bounded). It
    /// is still returned, as a glob that matches nothing (``Glob/init(rejected:)``): without its
    /// path the rule would match every request and seem to shadow the rules after it.
    mutating func glob(_ node: YAMLNode, _ key: String) -> Glob? {
        guard let text = string(node, key) else { return nil }
        let length = text.unicodeScalars.count
        if length > Glob.maxLength {
            report(
                .error(
                    "invalid-value",
                    "'\(key)' is a pattern of \(length) characters; at most \(Glob.maxLength) are allowed",
                    at: node.range))
            return Glob(rejected: text)
        }
        return Glob(text)
    }

    mutating func statuses(_ node: YAMLNode) -> [StatusRange]? {
        guard let items = list(node, "status") else { return nil }
        var result: [StatusRange] = []
        for item in items {
            guard let text = item.scalar, !item.isNull else {
                report(
                    .error(
                        "invalid-type",
                        "a status must be a code like 503 or a range like \"500-599\", not \(item.kindDescription)",
                        at: item.range))
                continue
            }
            // A bare code (nearly every status written): read without splitting, as the split
            // below would read it (one part, no spaces to trim).
            if !text.utf8.contains(where: { $0 == UInt8(ascii: "-") || $0 == UInt8(ascii: " ") }),
                let code = Int(text), (100...599).contains(code)
            {
                result.append(StatusRange(code))
                continue
            }
            let parts = text.split(separator: "-", omittingEmptySubsequences: false).map { $0.trimmingSpaces }
            let bounds = parts.map { Int($0) }
            if parts.count == 1, let code = bounds[0], item.isPlainScalar || item.scalar != nil {
                if (100...599).contains(code) {
                    result.append(StatusRange(code))
                } else {
                    report(
                        .error(
                            "invalid-status",
                            "status \(text.truncatedForMessage) is not an HTTP status; use 100 to 599", at: item.range))
                }
            } else if parts.count == 2, let low = bounds[0], let high = bounds[1] {
                if !(100...599).contains(low) || !(100...599).contains(high) {
                    report(
                        .error(
                            "invalid-status", "status range '\(text.truncatedForMessage)' must stay within 100-599",
                            at: item.range))
                } else if low > high {
                    report(
                        .error(
                            "invalid-status",
                            "status range '\(text.truncatedForMessage)' is backwards; write \"\(high)-\(low)\"",
                            at: item.range))
                } else {
                    result.append(StatusRange(low, high))
                }
            } else {
                report(
                    .error(
                        "invalid-status",
                        "'\(text.truncatedForMessage)' is not a status; write a code like 503 or a range like \"500-599\"",
                        at: item.range))
            }
        }
        return result
    }

    /// Business codes: texts compared as text, and `"a-b"` ranges of integer codes.
    mutating func codes(_ node: YAMLNode) -> ([String], [CodeRange])? {
        guard let items = list(node, "code") else { return nil }
        var result: [String] = []
        var ranges: [CodeRange] = []
        for item in items {
            guard let text = item.scalar, !item.isNull, !text.isEmpty else {
                report(
                    .error(
                        "invalid-type", "a business code must be a number or a text, not \(item.kindDescription)",
                        at: item.range))
                continue
            }
            // The byte check first: Foundation's `range(of:)` is slow, and nearly no code has a dot.
            if text.utf8.contains(UInt8(ascii: ".")), let dots = text.range(of: ".."),
                CodeTable.canonicalInteger(String(text[..<dots.lowerBound])) != nil
            {
                let high = text[dots.upperBound...]
                report(
                    .error(
                        "invalid-code",
                        "'\(text.truncatedForMessage)' is not a code range; write \"\(text[..<dots.lowerBound])-\(high)\"",
                        at: item.range))
                continue
            }
            if let range = Self.codeRange(text) {
                guard range.lower <= range.upper else {
                    report(
                        .error(
                            "invalid-code",
                            "code range '\(text.truncatedForMessage)' is backwards; write \"\(range.upper)-\(range.lower)\"",
                            at: item.range))
                    continue
                }
                ranges.append(range)
                continue
            }
            result.append(text)
        }
        return (result, ranges)
    }

    /// `"1400-1499"` (either bound may be negative: `"-10--1"`) as a range of integer codes.
    static func codeRange(_ text: String) -> CodeRange? {
        // No '-' at all (nearly every code): not a range, and no byte array to make.
        guard text.utf8.contains(UInt8(ascii: "-")) else { return nil }
        let bytes = Array(text.utf8)
        guard bytes.count >= 3 else { return nil }
        // The separating '-' is the first one after the first digit.
        guard let firstDigit = bytes.firstIndex(where: { $0 >= 0x30 && $0 <= 0x39 }),
            let dash = bytes[firstDigit...].firstIndex(of: UInt8(ascii: "-"))
        else { return nil }
        let low = String(decoding: bytes[..<dash], as: UTF8.self)
        let high = String(decoding: bytes[(dash + 1)...], as: UTF8.self)
        guard let lower = CodeTable.canonicalInteger(low), let upper = CodeTable.canonicalInteger(high) else {
            return nil
        }
        return CodeRange(lower, upper)
    }

    static func isPolicyName(_ text: String) -> Bool {
        !text.isEmpty && text.utf8.count <= 128
            && text.utf8.allSatisfy { (0x61...0x7A).contains($0) || (0x30...0x39).contains($0) || $0 == 0x2D }
    }

    // MARK: - classify

    mutating func classify(_ node: YAMLNode) -> CodeSource? {
        guard
            let (fields, misplaced) = pluginSectionFields(
                node, "'classify'", allowed: Self.classifyKeys, kind: .extract)
        else { return nil }
        if let plugin = pluginReference(.extract, fields, misplaced: misplaced) {
            if let code = fields.first(where: { $0.key == "code" }) {
                report(
                    .error(
                        "conflicting-keys", "'classify' takes either 'code:' or a plugin with 'use:', not both",
                        at: code.keyNode.range))
            }
            return .plugin(plugin)
        }
        guard let code = fields.first(where: { $0.key == "code" }) else {
            report(.error("missing-key", "'classify' needs 'code:', like code: body.status", at: node.range))
            return nil
        }
        guard let text = string(code.value, "code") else { return nil }
        switch ValuePath(text) {
        case .body:
            let path = String(text.dropFirst(5))
            if let problem = Self.bodyPathProblem(path) {
                report(.error("invalid-value", problem, at: code.value.range))
                return nil
            }
            return .body(path)
        case .header(let name): return .header(name)
        case nil:
            report(
                .error(
                    "invalid-value",
                    "'code' must be body.<path> (a JSON field, like body.status or body.errors.0.code) or header.<Name>, not '\(text.truncatedForMessage)'",
                    at: code.value.range))
            return nil
        }
    }

    /// Why a `body.<path>` can never find a code, written for the person who wrote it: paths
    /// from other languages (`status[0]`, `*`, `$.status`), `__proto__` (which JavaScript
    /// servers cannot send and JSON parsers treat apart), and a field name with spaces or control
    /// characters at its ends (a typo: JSON servers do not name fields so).
    static func bodyPathProblem(_ path: String) -> String? {
        if path.contains("[") || path.contains("]") {
            var fixed = ""
            for character in path {
                switch character {
                case "[": fixed += "."
                case "]", "\"", "'": continue
                default: fixed.append(character)
                }
            }
            return "'code' reads a field or an array item after a dot: write 'body.\(fixed.truncatedForMessage)', "
                + "not 'body.\(path.truncatedForMessage)'"
        }
        let segments = path.split(separator: ".", omittingEmptySubsequences: false)
        if segments.first == "$" {
            return
                "'code' starts at the body: write 'body.\(segments.dropFirst().joined(separator: ".").truncatedForMessage)', without '$'"
        }
        for segment in segments {
            if segment.contains("*") {
                let wildcard = String(segment).truncatedForMessage
                return "'code' names one field; a wildcard ('\(wildcard)') matches no field here: "
                    + "name it, like body.status or body.errors.0.code"
            }
            if segment == "__proto__" {
                return "'__proto__' is not a field a server can send: JavaScript's JSON.parse and most JSON libraries "
                    + "treat it apart, so 'body.\(path.truncatedForMessage)' never finds a code"
            }
            if let first = segment.unicodeScalars.first, let last = segment.unicodeScalars.last,
                first.properties.isWhitespace || last.properties.isWhitespace
                    || segment.unicodeScalars.contains(where: { $0.properties.generalCategory == .control })
            {
                return
                    "the field '\(String(segment).truncatedForMessage)' in 'code' has a space or a control character "
                    + "at its end; write the field's name as the server sends it"
            }
        }
        return nil
    }

    // MARK: - routes

    mutating func routes(_ node: YAMLNode, top: PolicyParts) -> [Route] {
        guard let items = node.items else {
            if !node.isNull {
                report(.error("invalid-type", "'routes' must be a list, not \(node.kindDescription)", at: node.range))
            }
            return []
        }
        var routes: [Route] = []
        for (index, item) in items.enumerated() {
            guard let fields = mappingFields(item, "a route", allowed: Self.routeKeys) else { continue }
            var route = Route(
                path: nil, methods: nil, rules: nil, classify: nil, refresh: top.refresh, logout: top.logout,
                retry: top.retry, authorize: top.authorize, range: item.range)
            guard let match = fields.first(where: { $0.key == "match" }) else {
                report(.error("missing-key", "a route needs 'match:' with a path and/or method", at: item.range))
                continue
            }
            if let matchFields = mappingFields(match.value, "'match'", allowed: Self.matchKeys) {
                for (key, _, value) in matchFields {
                    if key == "path", let glob = glob(value, key) { route.path = glob }
                    if key == "method" { route.methods = methods(value, key) }
                }
            }
            for (key, _, value) in fields {
                switch key {
                case "classify": route.classify = .some(value.isNull ? nil : classify(value))
                case "refresh": route.refresh = refresh(value, over: top.refresh, path: "routes.\(index + 1).refresh")
                case "logout": route.logout = logout(value, over: top.logout, path: "routes.\(index + 1).logout")
                case "retry": route.retry = retry(value, over: top.retry, path: "routes.\(index + 1).retry")
                case "authorize":
                    route.authorize = pluginSection(.authorize, value, what: "'authorize'") ?? route.authorize
                default: break
                }
            }
            if let rulesField = fields.first(where: { $0.key == "rules" }) {
                let scope = SectionScope(retry: route.retry, refresh: route.refresh, logout: route.logout)
                route.rules = rules(rulesField.value, scope: scope, namePrefix: "route-\(index + 1)-rule")
            }
            routes.append(route)
        }
        return routes
    }
}

/// The top-level sections as decoded, before the policy is assembled.
struct PolicyParts {
    var name = ""
    var classify: CodeSource?
    var rules: [Rule] = []
    var refresh = RefreshSettings()
    var logout = LogoutSettings()
    var retry = RetrySettings()
    var authorize = PluginReference(kind: .authorize, name: "bearer")
    var store = PluginReference(kind: .store, name: "memory")
    var observe: [PluginReference] = []
    var coordination = PluginReference(kind: .coordination, name: "local")
    var routes: [Route] = []
    var dispatch = DispatchSettings()
    /// Which top-level sections were written, with the range of their key (for lint).
    var sections: [String: SourceRange] = [:]
    /// Where section keys were written (see ``PolicyDecoder/locations``).
    var locations: [String: SourceRange] = [:]
    var rootRange = SourceRange.fileStart
}

extension PolicyDecoder {
    /// Decodes a whole policy document.
    mutating func policy(_ root: YAMLNode) -> PolicyParts? {
        guard root.pairs != nil else {
            report(
                .error(
                    "invalid-root",
                    "a policy file must be a mapping with 'policy: 1' and 'name:', not \(root.kindDescription)",
                    at: root.range))
            return nil
        }
        var parts = PolicyParts()
        parts.rootRange = root.range
        guard let fields = mappingFields(root, "a policy", allowed: Self.topLevelKeys, ignorePrefix: "x-") else {
            return nil
        }
        func field(_ key: String) -> YAMLNode? { fields.first { $0.key == key }?.value }
        for (key, keyNode, _) in fields { parts.sections[key] = keyNode.range }

        if let version = field("policy") {
            if let number = integer(version, "policy", in: Int.min...Int.max), number != 1 {
                report(
                    .error(
                        "unsupported-version",
                        number > 1
                            ? "this tool reads policy schema 1; 'policy: \(number)' needs a newer version of the tool"
                            : "this tool reads policy schema 1, not \(number); write policy: 1",
                        at: version.range))
            }
        } else {
            report(
                .error(
                    "missing-key", "missing 'policy: 1' (the schema version) at the top of the file",
                    at: SourceRange(start: root.range.start, end: root.range.start)))
        }
        if let name = field("name") {
            if let text = string(name, "name") {
                if Self.isPolicyName(text) {
                    parts.name = text
                } else {
                    report(
                        .error(
                            "invalid-name",
                            "policy name '\(text.truncatedForMessage)' must use only lower-case letters, digits and '-'",
                            at: name.range))
                }
            }
        } else {
            report(
                .error(
                    "missing-key", "missing 'name:' (lower-case letters, digits and '-')",
                    at: SourceRange(start: root.range.start, end: root.range.start)))
        }
        if let node = field("classify") { parts.classify = classify(node) }
        if let node = field("retry") { parts.retry = retry(node, over: parts.retry) }
        if let node = field("refresh") { parts.refresh = refresh(node, over: parts.refresh) }
        if let node = field("logout") { parts.logout = logout(node, over: parts.logout) }
        if let node = field("authorize") {
            parts.authorize = pluginSection(.authorize, node, what: "'authorize'") ?? parts.authorize
        }
        if let node = field("store") { parts.store = pluginSection(.store, node, what: "'store'") ?? parts.store }
        if let node = field("observe") {
            for item in list(node, "observe") ?? [] {
                if let plugin = pluginSection(.observe, item, what: "an 'observe' entry") {
                    parts.observe.append(plugin)
                }
            }
        }
        if let node = field("dispatch") { parts.dispatch = dispatch(node) }
        if let node = field("coordination") { parts.coordination = coordination(node) ?? parts.coordination }
        if let node = field("rules") {
            parts.rules = rules(
                node, scope: SectionScope(retry: parts.retry, refresh: parts.refresh, logout: parts.logout))
        }
        if let node = field("routes") { parts.routes = routes(node, top: parts) }
        parts.locations = locations
        return parts
    }
}

extension Substring {
    var trimmingSpaces: Substring {
        var text = self
        while text.first == " " { text.removeFirst() }
        while text.last == " " { text.removeLast() }
        return text
    }
}
