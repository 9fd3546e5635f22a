// swift-tools-version:6.0
// A service that depends on ResponsePolicy the way your own package does. CI builds it:
//
//     swift build --package-path examples/service
//
// In your Package.swift, with the repository as a URL dependency:
//
//     .package(url: "https://<your git host>/response-policy.git", from: "1.0.0"),
//     ...
//     .product(name: "ResponsePolicy", package: "response-policy"),
//     .product(name: "ResponsePolicyURLSession", package: "response-policy"),
//
// `package:` is the dependency's *identity*: the last path component of its URL without `.git`,
// or, for `.package(path:)`, the name of the folder it is in. It is not the `name:` in the
// dependency's own manifest ("ResponsePolicy"); using that fails with "unknown package".
import Foundation
import PackageDescription

// This example sits two folders below the repository, whose folder name depends on where it was
// cloned, so the identity is computed here; yours is a fixed string.
let repository = URL(fileURLWithPath: Context.packageDirectory).deletingLastPathComponent()
    .deletingLastPathComponent().standardizedFileURL
let identity = repository.lastPathComponent

let package = Package(
    name: "Service",
    platforms: [.macOS(.v15)],
    dependencies: [.package(path: repository.path)],
    targets: [
        .executableTarget(
            name: "Service",
            dependencies: [
                .product(name: "ResponsePolicy", package: identity),
                .product(name: "ResponsePolicyURLSession", package: identity),
            ]
        )
    ],
    swiftLanguageModes: [.v6]
)
