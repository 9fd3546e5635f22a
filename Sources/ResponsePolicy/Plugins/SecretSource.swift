import Foundation

/// Where plugins read secrets named in a policy: an environment variable, or a file such as a
/// mounted Kubernetes or Docker secret.
///
/// Why files are checked: a secret file that anyone on the machine can read is a leaked secret,
/// so, as ssh does with private keys, a file readable by its group or by others is refused. Only
/// regular files are read (a FIFO would block the engine's start forever), at most 64 KiB, and one
/// trailing newline (`\n` or `\r\n`) is trimmed, since `echo secret > file` writes one.
///
/// Secrets are read once, when the plugin is made, so a missing one fails at start (see
/// ``PolicyEngine/problems``), not at the first refresh. Errors name the variable or the path,
/// never a value.
enum SecretSource {
    /// The largest secret file read.
    static let maxFileBytes = 65_536

    /// The value of the environment variable `name`.
    ///
    /// - Throws: ``PluginError`` when it is unset or empty; `what` says where it was named.
    static func environment(
        _ name: String, _ configuration: PluginConfiguration, kind: PluginKind, namedBy what: String
    ) throws(PluginError) -> String {
        guard let value = configuration.environment[name], !value.isEmpty else {
            throw PluginError(
                kind: kind, name: configuration.name,
                reason: "the environment variable '\(name)' named by \(what) is not set")
        }
        return value
    }

    /// The contents of the secret file at `path`, one trailing newline trimmed.
    ///
    /// - Throws: ``PluginError`` when it does not exist, is not a regular file, is readable by
    ///   group or others, cannot be read, is larger than 64 KiB, is not UTF-8 or is empty.
    static func file(
        _ path: String, _ configuration: PluginConfiguration, kind: PluginKind, namedBy what: String
    ) throws(PluginError) -> String {
        func failure(_ why: String) -> PluginError {
            PluginError(kind: kind, name: configuration.name, reason: "the file '\(path)' named by \(what) \(why)")
        }
        // Through SafeFile: a link only when it is this user's or root's (a Kubernetes Secret's
        // mount), opened without following a swapped link and without waiting on a FIFO, then
        // checked with fstat before a byte is read.
        let descriptor: Int32
        let info: stat
        switch SafeFile.open(path, owner: .userOrRoot) {
        case .failure(let refusal):
            if refusal.missing { throw failure("does not exist") }
            if refusal.reason == "it is a directory" || refusal.reason == "it is not a regular file" {
                throw failure("is not a regular file")
            }
            throw failure("cannot be used: " + refusal.reason)
        case .success(let opened): (descriptor, info) = (opened.descriptor, opened.status)
        }
        defer { close(descriptor) }
        guard info.st_mode & 0o044 == 0 else {
            throw failure(
                "is readable by its group or others (mode \(String(info.st_mode & 0o777, radix: 8))); "
                    + "chmod 600 it")
        }
        guard Int(info.st_size) <= maxFileBytes else { throw failure("is larger than 64 KiB") }
        let data: Data
        switch SafeFile.read(descriptor, limit: maxFileBytes) {
        case .failure: throw failure("cannot be read")
        case .success(let bytes): data = Data(bytes)
        }
        guard data.count <= maxFileBytes else { throw failure("is larger than 64 KiB") }
        guard var text = String(data: data, encoding: .utf8) else { throw failure("is not UTF-8 text") }
        if text.hasSuffix("\r\n") {
            text.removeLast(1)  // "\r\n" is one Character
        } else if text.hasSuffix("\n") {
            text.removeLast()
        }
        guard !text.isEmpty else { throw failure("is empty") }
        return text
    }

    /// One of `*-env` and `*-file` (e.g. `client-secret-env`, `client-secret-file`), `nil` when
    /// neither is given.
    ///
    /// - Throws: ``PluginError`` when both are given, or the one given cannot be read.
    static func option(
        _ base: String, _ configuration: PluginConfiguration, kind: PluginKind
    ) throws(PluginError) -> String? {
        let variable = configuration.string(base + "-env")
        let path = configuration.string(base + "-file")
        switch (variable, path) {
        case (nil, nil): return nil
        case (let variable?, nil): return try environment(variable, configuration, kind: kind, namedBy: "'\(base)-env'")
        case (nil, let path?): return try file(path, configuration, kind: kind, namedBy: "'\(base)-file'")
        case (.some, .some):
            throw PluginError(
                kind: kind, name: configuration.name, reason: "give one of '\(base)-env' and '\(base)-file', not both")
        }
    }
}

extension SecretSource {
    /// Every secret a plugin's options name that cannot be read, each as the reason the plugin's
    /// factory would give: `*-env` and `*-file` options, and `{env:…}` / `{file:…}` in any text
    /// (the `http` plugin's `body:` fields and `headers:` named as it names them).
    ///
    /// Why: a factory stops at the first secret it cannot read, so fixing a deployment took one
    /// run of `policy lint --check-env` per missing variable. This lists them all at once; the
    /// factory still decides whether the plugin can be made.
    static func problems(in configuration: PluginConfiguration, kind: PluginKind) -> [String] {
        var reasons: [String] = []
        func note(_ error: PluginError) {
            if !reasons.contains(error.reason) { reasons.append(error.reason) }
        }
        func scan(_ option: PluginOption, _ what: String) {
            switch option {
            case .string(let text) where text.contains("{env:") || text.contains("{file:"):
                do { _ = try TemplateText(text, configuration, kind: kind, in: what) } catch { note(error) }
            case .list(let items):
                for item in items { scan(item, what) }
            case .map(let fields):
                for name in fields.keys.sorted() {
                    if let value = fields[name] { scan(value, what) }
                }
            default: break
            }
        }
        for key in configuration.options.keys.sorted() {
            guard let option = configuration.options[key] else { continue }
            if key.hasSuffix("-env"), let name = option.string {
                do { _ = try environment(name, configuration, kind: kind, namedBy: "'\(key)'") } catch { note(error) }
            } else if key.hasSuffix("-file"), let path = option.string {
                do { _ = try file(path, configuration, kind: kind, namedBy: "'\(key)'") } catch { note(error) }
            } else if case .map(let fields) = option, key == "body" || key == "headers" {
                for name in fields.keys.sorted() {
                    guard let value = fields[name] else { continue }
                    scan(value, key == "body" ? "the body field '\(name)'" : "the header '\(name)'")
                }
            } else {
                scan(option, "the option '\(key)'")
            }
        }
        return reasons
    }
}

/// A text from a policy with its placeholders resolved as far as they can be when the plugin is
/// made: `{env:NAME}` and `{file:PATH}` are read then (and fail then); `{refresh_token}` and
/// `{access_token}` stay as parts filled in per request.
///
/// Parts, rather than a text substituted twice, so a secret that happens to contain
/// `{refresh_token}` is sent as written and never expanded.
struct TemplateText: Sendable, Hashable {
    enum Part: Sendable, Hashable {
        case literal(String)
        case refreshToken
        case accessToken
    }

    var parts: [Part]

    /// Whether the text needs the stored credentials.
    var usesCredentials: Bool { parts.contains { !$0.isLiteral } }

    /// Resolves `{env:…}` and `{file:…}` in `text`.
    ///
    /// A value read for a header (`what` names one: `the header 'X-Api-Key'`, or `header` says
    /// so) must not hold a control character (CR, LF, NUL, ESC, DEL…; a tab is allowed, as RFC
    /// 9110 §5.5 allows it): it would split the request's headers or make the transport drop
    /// the request, which then went out unsigned. It is refused when the plugin is made, so
    /// `policy lint --check-env` reports it and an engine refuses to start with it.
    ///
    /// - Parameters:
    ///   - what: where the text was written, for errors (`the header 'X-Api-Key'`).
    ///   - header: whether the text is a header's value; by default, whether `what` names one.
    /// - Throws: ``PluginError`` naming the variable or file (never a value).
    init(
        _ text: String, _ configuration: PluginConfiguration, kind: PluginKind, in what: String,
        header: Bool? = nil
    ) throws(PluginError) {
        let isHeader = header ?? what.hasPrefix("the header ")
        func checked(_ value: String, _ source: String) throws(PluginError) -> String {
            guard isHeader, let bad = value.unicodeScalars.first(where: Self.isControl) else { return value }
            throw PluginError(
                kind: kind, name: configuration.name,
                reason: "\(source) named by \(what) holds a control character (\(Self.name(of: bad))); "
                    + "a header value cannot carry one")
        }
        var parts: [Part] = []
        var literal = ""
        var rest = Substring(text)
        while let open = rest.firstIndex(of: "{") {
            literal += rest[..<open]
            let tail = rest[open...]
            if tail.hasPrefix("{refresh_token}") {
                parts.append(.literal(literal))
                literal = ""
                parts.append(.refreshToken)
                rest = tail.dropFirst("{refresh_token}".count)
            } else if tail.hasPrefix("{access_token}") {
                parts.append(.literal(literal))
                literal = ""
                parts.append(.accessToken)
                rest = tail.dropFirst("{access_token}".count)
            } else if tail.hasPrefix("{env:") || tail.hasPrefix("{file:"),
                let close = tail.firstIndex(of: "}")
            {
                let isEnv = tail.hasPrefix("{env:")
                let name = String(tail[tail.index(open, offsetBy: isEnv ? 5 : 6)..<close])
                if isEnv {
                    literal += try checked(
                        SecretSource.environment(name, configuration, kind: kind, namedBy: what),
                        "the environment variable '\(name)'")
                } else {
                    literal += try checked(
                        SecretSource.file(name, configuration, kind: kind, namedBy: what), "the file '\(name)'")
                }
                rest = tail[tail.index(after: close)...]
            } else {
                literal += "{"
                rest = tail.dropFirst()
            }
        }
        literal += rest
        parts.append(.literal(literal))
        self.parts = parts.filter { $0 != .literal("") }
    }

    /// A character a header value cannot carry: C0 controls but the tab, and DEL.
    static func isControl(_ scalar: Unicode.Scalar) -> Bool {
        (scalar.value < 0x20 && scalar != "\t") || scalar.value == 0x7F
    }

    /// `CR`, `LF`, `NUL`, `ESC`, `DEL` or `U+0001`: a control character's name, never the value.
    static func name(of scalar: Unicode.Scalar) -> String {
        switch scalar.value {
        case 0x0D: return "CR"
        case 0x0A: return "LF"
        case 0x00: return "NUL"
        case 0x1B: return "ESC"
        case 0x7F: return "DEL"
        default:
            return "U+" + String(repeating: "0", count: 4 - String(scalar.value, radix: 16).count)
                + String(scalar.value, radix: 16, uppercase: true)
        }
    }

    /// The text for one request.
    ///
    /// - Throws: ``RefreshFailure`` when it names a token the credentials do not have.
    func resolve(_ credentials: Credentials?) throws(RefreshFailure) -> String {
        var out = ""
        for part in parts {
            switch part {
            case .literal(let text): out += text
            case .refreshToken:
                guard let token = credentials?.refreshToken, !token.isEmpty else {
                    throw RefreshFailure("there is no refresh token to send")
                }
                out += token
            case .accessToken:
                guard let token = credentials?.accessToken, !token.isEmpty else {
                    throw RefreshFailure("there is no access token to send")
                }
                out += token
            }
        }
        return out
    }
}

extension TemplateText.Part {
    var isLiteral: Bool {
        if case .literal = self { return true }
        return false
    }
}

/// The transport of a plugin made only to be checked (`policy lint --check-env`) or made outside
/// an engine; it is never meant to be called.
struct NoTransport: Transport {
    func send(_ request: HTTPRequest) async throws -> HTTPResponse {
        throw TransportError(.connection, "this plugin was made without a transport")
    }
}
