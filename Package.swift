// swift-tools-version:6.0
import PackageDescription

let package = Package(
    name: "ResponsePolicy",
    platforms: [.macOS(.v15)],
    products: [
        .library(name: "ResponsePolicy", targets: ["ResponsePolicy"]),
        .library(name: "ResponsePolicyURLSession", targets: ["ResponsePolicyURLSession"]),
        .executable(name: "policy", targets: ["policy"]),
        .executable(name: "policy-bench", targets: ["policy-bench"]),
    ],
    targets: [
        .systemLibrary(
            name: "CYAML",
            pkgConfig: "yaml-0.1",
            providers: [.apt(["libyaml-dev"])]
        ),
        // No pkgConfig: hiredis.pc adds -D_FILE_OFFSET_BITS=64, which SwiftPM refuses with a
        // warning on every build; the header is found as <hiredis/hiredis.h> in the system path.
        .systemLibrary(
            name: "CHiredis",
            providers: [.apt(["libhiredis-dev"])]
        ),
        .target(name: "ResponsePolicy", dependencies: ["CYAML", "CHiredis"]),
        .target(name: "ResponsePolicyURLSession", dependencies: ["ResponsePolicy"]),
        .target(name: "PolicyCLI", dependencies: ["ResponsePolicy", "ResponsePolicyURLSession"]),
        // C: a pre-initializer that sets SWIFT_BACKTRACE before the Swift runtime reads it.
        .target(name: "PolicyStartup"),
        .executableTarget(name: "policy", dependencies: ["PolicyCLI", "PolicyStartup"]),
        .executableTarget(name: "policy-bench", dependencies: ["ResponsePolicy", "ResponsePolicyURLSession"]),
        // Test helper: one coordinator in a child process, driven over stdin/stdout by the
        // multi-process coordination tests (killed with SIGKILL mid-refresh).
        .executableTarget(name: "coordinator-probe", dependencies: ["ResponsePolicy"], path: "Tests/CoordinatorProbe"),
        // libFuzzer harness; scripts/fuzz.sh builds it with -sanitize=fuzzer,address. A plain build
        // is a replayer: `swift run policy-fuzz FILE...`.
        .executableTarget(name: "policy-fuzz", dependencies: ["ResponsePolicy"]),
        .executableTarget(
            name: "embedding-example",
            dependencies: ["ResponsePolicy", "ResponsePolicyURLSession"],
            path: "examples/embedding",
            exclude: ["policy.yaml"]
        ),
        // Shared by the test targets only: keeps real-time tests apart from storm tests.
        .target(name: "TestGate", path: "Tests/TestGate"),
        .testTarget(name: "ResponsePolicyTests", dependencies: ["ResponsePolicy", "policy-fuzz", "TestGate"]),
        .testTarget(name: "PolicyCLITests", dependencies: ["PolicyCLI", "ResponsePolicy", "TestGate"]),
        .testTarget(
            name: "ResponsePolicyURLSessionTests",
            dependencies: ["ResponsePolicyURLSession", "ResponsePolicy", "TestGate"],
            resources: [.copy("Fixtures")]
        ),
    ],
    swiftLanguageModes: [.v6]
)
