import ResponsePolicy

/// The classifier's answer computed the slow, obvious way: walk the rules in order and return the
/// first whose `when:` holds, exactly as the README states the semantics.
///
/// The engine's ``Classifier`` answers from decision tables instead (by status, by code, by error
/// class); the harness compares the two on every input, so a table that drops, reorders or
/// over-matches a rule is a finding even when nothing crashes.
enum FirstMatch {
    /// The index of the first rule matching a response, or `nil` (the response is delivered).
    static func response(
        _ rules: [Rule], status: Int, code: String?, headers: HTTPHeaders, method: String, path: String
    ) -> Int? {
        rules.firstIndex { rule in
            let when = rule.when
            guard when.matchesResponses else { return false }
            if let codes = when.codes {
                guard let code, codes.contains(code) else { return false }
                if let statuses = when.statuses, !statuses.contains(where: { $0.contains(status) }) { return false }
            } else if let statuses = when.statuses {
                guard statuses.contains(where: { $0.contains(status) }) else { return false }
            }
            return requestMatches(when, method: method, path: path) && headersMatch(when, headers)
        }
    }

    /// The index of the first rule matching an attempt that failed with `errorClass`.
    static func error(_ rules: [Rule], _ errorClass: TransportErrorClass, method: String, path: String) -> Int? {
        rules.firstIndex { rule in
            guard let errors = rule.when.errors else { return false }
            let matches = errors.contains { $0 == .any || $0.rawValue == errorClass.rawValue }
            return matches && requestMatches(rule.when, method: method, path: path)
        }
    }

    /// The first route whose `match:` holds, else the top level (the last scope).
    static func scope(_ scopes: [RuleGraph.Scope], method: String, path: String) -> Int {
        scopes.firstIndex { scope in
            guard let route = scope.route else { return true }
            if let methods = route.methods, !methods.contains(method) { return false }
            if let glob = route.path, !glob.matches(path) { return false }
            return true
        } ?? scopes.count - 1
    }

    private static func requestMatches(_ when: Condition, method: String, path: String) -> Bool {
        if let methods = when.methods, !methods.contains(method) { return false }
        if let glob = when.path, !glob.matches(path) { return false }
        return true
    }

    private static func headersMatch(_ when: Condition, _ headers: HTTPHeaders) -> Bool {
        (when.headers ?? []).allSatisfy { header in
            headers[header.name].map { header.value.matches($0) } ?? false
        }
    }
}
