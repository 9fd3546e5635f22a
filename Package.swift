// swift-tools-version:6.0
import PackageDescription

let package = Package(
    name: "ResponsePolicy",
    platforms: [.macOS(.v15)],
    products: [
        .library(name: "ResponsePolicy", targets: ["ResponsePolicy"]),
        .library(name: "ResponsePolicyURLSession", targets: ["ResponsePolicyURLSession"]),
        // A transport on libcurl's multi interface (libcurl4-openssl-dev to build): the only product that links libcurl
        // directly (FoundationNetworking links it too, under ResponsePolicyURLSession).
        .library(name: "ResponsePolicyCurl", targets: ["ResponsePolicyCurl"]),
        // `coordination: redis`: the only product that links hiredis (libhiredis-dev to build).
        .library(name: "ResponsePolicyRedis", targets: ["ResponsePolicyRedis"]),
        // For a service's own tests: a virtual clock, seeded randomness, the simulator.
        .library(name: "ResponsePolicyTesting", targets: ["ResponsePolicyTesting"]),
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
        .systemLibrary(
            name: "CCurl",
            pkgConfig: "libcurl",
            providers: [.apt(["libcurl4-openssl-dev"])]
        ),
        // The core links libyaml alone: a service with `coordination: local` or `file` needs no hiredis.
        .target(name: "ResponsePolicy", dependencies: ["CYAML"], exclude: ["Engine/README.md"]),
        .target(name: "ResponsePolicyRedis", dependencies: ["ResponsePolicy", "CHiredis"]),
        .target(name: "ResponsePolicyURLSession", dependencies: ["ResponsePolicy"]),
        .target(name: "ResponsePolicyCurl", dependencies: ["ResponsePolicy", "CCurl"]),
        .target(name: "ResponsePolicyTesting", dependencies: ["ResponsePolicy"]),
        .target(
            name: "PolicyCLI",
            dependencies: ["ResponsePolicy", "ResponsePolicyURLSession", "ResponsePolicyCurl", "ResponsePolicyTesting"]),
        // C: a pre-initializer that sets SWIFT_BACKTRACE before the Swift runtime reads it.
        .target(name: "PolicyStartup"),
        // C: glibc's mallinfo2 for policy-bench's retained-memory figures (malloc.h is not in Glibc's module).
        .target(name: "BenchHeap"),
        // policy installs `coordination: redis` at start (RedisCoordination.install()).
        .executableTarget(name: "policy", dependencies: ["PolicyCLI", "PolicyStartup", "ResponsePolicyRedis"]),
        .executableTarget(
            name: "policy-bench",
            dependencies: [
                "ResponsePolicy", "ResponsePolicyURLSession", "ResponsePolicyCurl", "ResponsePolicyRedis", "CCurl",
                "ResponsePolicyTesting", "PolicyCLI", "BenchHeap",
            ]),
        // Test helper: one coordinator in a child process, driven over stdin/stdout by the
        // multi-process coordination tests (killed with SIGKILL mid-refresh).
        .executableTarget(
            name: "coordinator-probe", dependencies: ["ResponsePolicy", "ResponsePolicyRedis"],
            path: "Tests/CoordinatorProbe"),
        // libFuzzer harness; scripts/fuzz.sh builds it with -sanitize=fuzzer,address. A plain build
        // is a replayer: `swift run policy-fuzz FILE...`.
        .executableTarget(name: "policy-fuzz", dependencies: ["ResponsePolicy", "ResponsePolicyTesting"]),
        .executableTarget(
            name: "embedding-example",
            dependencies: ["ResponsePolicy", "ResponsePolicyURLSession"],
            path: "examples/embedding",
            exclude: ["policy.yaml", "plugins.yaml"]
        ),
        // The Swift snippets of README.md and docs/, compiled by every build; DocsTests checks that
        // each block the documentation shows is a region of these files.
        .target(
            name: "DocsSnippets", dependencies: ["ResponsePolicy", "ResponsePolicyURLSession"], path: "docs/snippets"),
        // Shared by the test targets only: keeps real-time tests apart from storm tests.
        .target(name: "TestGate", path: "Tests/TestGate"),
        // Shared by the test targets: a redis-server of the test's own (over plain sockets, no
        // hiredis), engine doubles, the seeded generator, the repository root, real-time checks.
        .target(
            name: "TestSupport", dependencies: ["ResponsePolicy"], path: "Tests/TestSupport"),
        .testTarget(
            name: "ResponsePolicyTests",
            dependencies: [
                "ResponsePolicy", "ResponsePolicyTesting", "policy-fuzz", "TestGate", "TestSupport",
            ]),
        // Everything that needs hiredis: the Redis store, processes on it, the backends' conformance.
        .testTarget(
            name: "ResponsePolicyRedisTests",
            dependencies: [
                "ResponsePolicyRedis", "ResponsePolicy", "ResponsePolicyTesting", "TestGate", "TestSupport",
            ]),
        .testTarget(
            name: "PolicyCLITests",
            dependencies: [
                "PolicyCLI", "ResponsePolicy", "ResponsePolicyRedis", "ResponsePolicyTesting", "TestGate",
                "TestSupport",
            ]),
        .testTarget(
            name: "ResponsePolicyURLSessionTests",
            dependencies: [
                "ResponsePolicyURLSession", "ResponsePolicyCurl", "ResponsePolicy", "ResponsePolicyTesting", "TestGate",
                "TestSupport",
            ],
            resources: [.copy("Fixtures")]
        ),
    ],
    swiftLanguageModes: [.v6]
)

// Stricter settings for every Swift target (issue 31): `any` spelled out on every existential, and a
// member found only through a module the file imports (not through another file's import).
for target in package.targets where target.type != .system && !["PolicyStartup", "BenchHeap"].contains(target.name) {
    target.swiftSettings =
        (target.swiftSettings ?? []) + [
            .enableUpcomingFeature("ExistentialAny"), .enableUpcomingFeature("MemberImportVisibility"),
        ]
}
