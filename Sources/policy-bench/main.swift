import Foundation
import ResponsePolicy

// policy-bench: each result is measured next to its baseline in the same run, and reported as a
// ratio, because these machines are noisy. `--json` for machines, a table otherwise; `--quick`
// runs tiny counts (the test suite uses it to keep the benchmark working).

let arguments = Set(CommandLine.arguments.dropFirst())
let quick = arguments.contains("--quick")
let json = arguments.contains("--json")
if arguments.contains("--help") || arguments.contains("-h") {
    print(
        """
        OVERVIEW: Benchmarks of the classification path and the engine, each against a baseline.

        USAGE: swift run -c release policy-bench [--json] [--quick]

        OPTIONS:
          --json                  Print {"results":[...]} instead of a table.
          --quick                 Tiny counts: checks the benchmark runs, measures nothing.
          -h, --help              Show help information.
        """)
    exit(0)
}

var results: [BenchResult] = []
results += Benchmarks.classify(quick: quick)
results.append(Benchmarks.decide(quick: quick))
results.append(await Benchmarks.storm(quick: quick))
results.append(await Benchmarks.engineOverhead(quick: quick))
results.append(Benchmarks.loadDefault(quick: quick))

if json {
    print("{\"results\":[" + results.map(\.json).joined(separator: ",") + "]}")
} else {
    print(BenchResult.table(results))
}
