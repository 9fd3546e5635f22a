import Foundation
import ResponsePolicy

/// libFuzzer's entry point. Built with `scripts/fuzz.sh` (`-sanitize=fuzzer,address`), where
/// libFuzzer supplies `main`.
@_cdecl("LLVMFuzzerTestOneInput")
public func llvmFuzzerTestOneInput(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    FuzzHarness.run(UnsafeRawBufferPointer(start: data, count: size))
    return 0
}

#if !LIBFUZZER
    /// Without libFuzzer (a plain `swift build`), `policy-fuzz FILE|DIR...` replays inputs through the
    /// same harness and prints what each did: the way to look at a crash file with a Swift backtrace,
    /// and to read the diagnostics a regression test should expect.
    @main
    struct PolicyFuzzReplay {
        static func main() {
            let paths = Array(CommandLine.arguments.dropFirst())
            guard !paths.isEmpty, paths.first != "-h", paths.first != "--help" else {
                print(
                    """
                    OVERVIEW: Replay fuzz inputs through the policy-fuzz harness and print what each did.

                    USAGE: policy-fuzz FILE|DIR...

                    An input is POLICY [NUL BODY [NUL REQUEST]] (see FuzzInput); inputs of up to 1 KiB are
                    also printed in base64, ready for FuzzRegressionTests.
                    """)
                return
            }
            var failed = false
            for path in paths {
                for file in files(at: path) {
                    guard let data = FileManager.default.contents(atPath: file) else {
                        FileHandle.standardError.write(Data("policy-fuzz: cannot read '\(file)'\n".utf8))
                        failed = true
                        continue
                    }
                    let report = data.withUnsafeBytes { FuzzHarness.run($0) }
                    let base64 = data.count <= 1024 ? ", base64 " + data.base64EncodedString() : ""
                    print("== \(file) (\(data.count) bytes\(base64))")
                    print(describe(report))
                }
            }
            if failed { exit(1) }
        }

        static func files(at path: String) -> [String] {
            var isDirectory: ObjCBool = false
            guard FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory), isDirectory.boolValue else {
                return [path]
            }
            let names = (try? FileManager.default.contentsOfDirectory(atPath: path)) ?? []
            return names.sorted().map { path + "/" + $0 }
        }

        static func describe(_ report: FuzzReport) -> String {
            var lines = ["policy: " + (report.compiled ? "compiled" : "not compiled")]
            lines += report.policyDiagnostics.map { "  " + $0.description }
            lines.append("script:")
            lines += report.scriptDiagnostics.map { "  " + $0.description }
            lines += report.decisions.map { "decision: " + $0 }
            let codes = zip(FuzzHarness.scannerPaths, report.scannedCodes).compactMap { path, code in
                code.map { "\(path)='\($0)'" }
            }
            lines.append("scanner: " + (codes.isEmpty ? "no code" : codes.joined(separator: " ")))
            return lines.joined(separator: "\n")
        }
    }
#endif
