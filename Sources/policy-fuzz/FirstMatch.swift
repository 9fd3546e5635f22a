import ResponsePolicy

/// The classifier's answer computed the slow, obvious way: walk the rules in order and return the
/// first whose `when:` holds by ``Condition/matches(status:code:headers:method:path:)``, the one
/// reference matcher (`shadowed-rule` and the soundness test use it too).
///
/// The engine's ``Classifier`` answers from decision tables instead (by status, by code, by error
/// class); the harness compares the two on every input, so a table that drops, reorders or
/// over-matches a rule is a finding even when nothing crashes.
enum FirstMatch {
    /// The index of the first rule matching a response, or `nil` (the response is delivered).
    static func response(
        _ rules: [Rule], status: Int, code: String?, headers: HTTPHeaders, method: String, path: String
    ) -> Int? {
        rules.firstIndex { $0.when.matches(status: status, code: code, headers: headers, method: method, path: path) }
    }

    /// The index of the first rule matching an attempt that failed with `errorClass`.
    static func error(_ rules: [Rule], _ errorClass: TransportErrorClass, method: String, path: String) -> Int? {
        rules.firstIndex { $0.when.matches(error: errorClass, method: method, path: path) }
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
}
