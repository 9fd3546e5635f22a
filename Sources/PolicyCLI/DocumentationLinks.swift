import Foundation

/// Where the `doc` link of a finding points (JSON `doc`, SARIF `properties.documentation` and
/// `helpUri`, the `see …` line of a GitHub annotation): the rule's section of lint-rules.md, at a
/// place that opens where this binary runs.
///
/// Why: the link was `docs/lint-rules.md#RULE`, a path in the repository that someone with the
/// installed binary or the .deb has no copy of. Now, in this order:
///
/// 1. `POLICY_DOCS_URL`, when set: a folder URL holding lint-rules.md, for a team that serves the
///    docs (`https://git.example.com/acme/response-policy/blob/v1.4/docs`);
/// 2. the docs installed beside the binary: `PREFIX/share/doc/policy/docs/lint-rules.md` for
///    `PREFIX/bin/policy` (`scripts/install.sh` and the .deb put them there), as a `file://` URL;
/// 3. a checkout the binary was built in (`REPO/.build…/policy` with `REPO/docs/lint-rules.md`);
/// 4. else `docs/lint-rules.md#RULE`, relative to a checkout of the repository.
struct DocumentationLinks: Sendable {
    /// The folder holding lint-rules.md, as a URL or a relative path, without a trailing slash.
    var base: String

    /// `BASE/lint-rules.md#RULE`.
    func lintRule(_ rule: String) -> String { "\(base)/lint-rules.md#\(rule)" }

    /// Whether the links are absolute URLs a web page can use (SARIF's `helpUri`).
    var isWebURL: Bool { base.hasPrefix("https://") || base.hasPrefix("http://") }

    /// The links for this process, found once.
    static let current = DocumentationLinks.find(
        environment: ProcessInfo.processInfo.environment, executable: executablePath())

    static func find(environment: [String: String], executable: String?) -> DocumentationLinks {
        if let url = environment["POLICY_DOCS_URL"], !url.isEmpty {
            return DocumentationLinks(base: url.hasSuffix("/") ? String(url.dropLast()) : url)
        }
        guard let executable else { return DocumentationLinks(base: "docs") }
        let bin = URL(fileURLWithPath: executable).deletingLastPathComponent()
        let installed = bin.deletingLastPathComponent().appendingPathComponent("share/doc/policy/docs")
        if FileManager.default.fileExists(atPath: installed.appendingPathComponent("lint-rules.md").path) {
            return DocumentationLinks(base: installed.standardizedFileURL.absoluteString.trimmingTrailingSlash)
        }
        // A build folder of a checkout: REPO/.build/…/policy (or .build-static and the like).
        var folder = bin
        while folder.path != "/", !folder.path.isEmpty {
            if folder.lastPathComponent.hasPrefix(".build") {
                let repository = folder.deletingLastPathComponent()
                let docs = repository.appendingPathComponent("docs")
                if FileManager.default.fileExists(atPath: repository.appendingPathComponent("Package.swift").path),
                    FileManager.default.fileExists(atPath: docs.appendingPathComponent("lint-rules.md").path)
                {
                    return DocumentationLinks(base: docs.standardizedFileURL.absoluteString.trimmingTrailingSlash)
                }
                break
            }
            folder.deleteLastPathComponent()
        }
        return DocumentationLinks(base: "docs")
    }

    /// This process's executable, symbolic links resolved (`/usr/local/bin/policy` may be a link
    /// into a prefix of its own).
    static func executablePath() -> String? {
        #if os(Linux)
            if let path = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe") { return path }
        #endif
        return Bundle.main.executableURL?.resolvingSymlinksInPath().path
    }
}

extension String {
    fileprivate var trimmingTrailingSlash: String { hasSuffix("/") ? String(dropLast()) : self }
}
