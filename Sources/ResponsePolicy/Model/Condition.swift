/// The `when:` of a rule.
///
/// `status`, `code` and `header` describe a response; `error` describes an attempt that got no
/// response; `method` and `path` describe the request. All given keys must hold, except that
/// the response keys and `error` are alternatives: `{ status: [503], error: [timeout] }` matches
/// a 503 *or* a timeout. A rule with neither response keys nor `error` matches every response
/// (never a failed attempt: name the error classes, or `any`, for that).
package struct Condition: Sendable, Hashable {
    package struct HeaderMatch: Sendable, Hashable {
        package var name: String
        package var value: Glob
        package init(name: String, value: Glob) {
            self.name = name
            self.value = value
        }
    }

    /// The `error:` classes; `any` matches every class.
    package enum ErrorMatch: String, Sendable, Hashable, CaseIterable {
        case timeout, connection, dns, tls, any
        case tooLarge = "too-large"

        func matches(_ errorClass: TransportErrorClass) -> Bool {
            self == .any || rawValue == errorClass.rawValue
        }
    }

    package var statuses: [StatusRange]?
    /// The business codes matched as text (`1401` matches `"1401"`). Non-`nil` whenever the
    /// condition constrains the code, also when it names only ranges (then it is empty).
    package var codes: [String]?
    /// Integer business code ranges, written `"1400-1499"`: a code matches when its text is an
    /// integer (no leading zero) within one of them.
    package var codeRanges: [CodeRange]?
    package var headers: [HeaderMatch]?
    package var errors: [ErrorMatch]?
    package var methods: [String]?
    package var path: Glob?

    package init(
        statuses: [StatusRange]? = nil, codes: [String]? = nil, headers: [HeaderMatch]? = nil,
        errors: [ErrorMatch]? = nil, methods: [String]? = nil, path: Glob? = nil, codeRanges: [CodeRange]? = nil
    ) {
        self.statuses = statuses
        self.codes = codes ?? (codeRanges == nil ? nil : [])
        self.codeRanges = codeRanges
        self.headers = headers
        self.errors = errors
        self.methods = methods
        self.path = path
    }

    /// True when the condition says something about responses (or says nothing about errors).
    package var matchesResponses: Bool { statuses != nil || codes != nil || headers != nil || errors == nil }

    package var matchesErrors: Bool { errors != nil }

    /// Whether a business code's text satisfies the `code:` constraint (`true` without one).
    package func codeMatches(_ code: String?) -> Bool {
        guard codes != nil || codeRanges != nil else { return true }
        guard let code else { return false }
        if codes?.contains(code) == true { return true }
        guard let ranges = codeRanges, let value = CodeTable.canonicalInteger(code) else { return false }
        return ranges.contains { $0.contains(value) }
    }

    /// The reference answer to "does this condition hold for this response": a plain reading of
    /// the rules' semantics, one condition at a time. The engine uses the ``Classifier``'s
    /// tables; `shadowed-rule`, the soundness test and the fuzz oracle check against this.
    package func matches(
        status: Int, code: String?, headers responseHeaders: HTTPHeaders, method: String, path requestPath: String
    ) -> Bool {
        guard matchesResponses, requestMatches(method: method, path: requestPath) else { return false }
        if let statuses, !statuses.contains(where: { $0.contains(status) }) { return false }
        return codeMatches(code) && headersMatch(responseHeaders)
    }

    /// The reference answer for an attempt that got no response.
    package func matches(error errorClass: TransportErrorClass, method: String, path requestPath: String) -> Bool {
        errorMatches(errorClass) && requestMatches(method: method, path: requestPath)
    }

    func requestMatches(method: String, path requestPath: String) -> Bool {
        if let methods, !methods.contains(method) { return false }
        if let path, !path.matches(requestPath) { return false }
        return true
    }

    func errorMatches(_ errorClass: TransportErrorClass) -> Bool {
        errors?.contains { $0.matches(errorClass) } ?? false
    }

    /// Header conditions only; status and code are checked by the classifier's tables.
    package func headersMatch(_ responseHeaders: HTTPHeaders) -> Bool {
        guard let headers else { return true }
        for header in headers {
            guard let value = responseHeaders[header.name], header.value.matches(value) else { return false }
        }
        return true
    }
}
