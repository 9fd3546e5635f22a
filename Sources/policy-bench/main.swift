import Foundation
import ResponsePolicy

// policy-bench: each result is measured next to its baseline in the same run, and reported as a
// ratio, because these machines are noisy. `--json` for machines, a table otherwise; `--quick`
// runs tiny counts (the test suite uses it to keep the benchmark working).

let argv = Array(CommandLine.arguments.dropFirst())
let arguments = Set(argv)
/// `--only NAME`: run one benchmark (for profiling it).
let only: String? = argv.firstIndex(of: "--only").flatMap { $0 + 1 < argv.count ? argv[$0 + 1] : nil }
/// Whether to run the group of results named `group` (`classify` makes `classify-1k-first` and
/// `-last`): `--only` may name the group, a prefix of it, or a result in it.
func wanted(_ group: String) -> Bool { only.map { group.hasPrefix($0) || $0.hasPrefix(group) } ?? true }
let quick = arguments.contains("--quick")
let json = arguments.contains("--json")
if arguments.contains("--help") || arguments.contains("-h") {
    print(
        """
        OVERVIEW: Benchmarks of the classification path and the engine, each against a baseline.

        USAGE: swift run -c release policy-bench [--json] [--quick] [--only <name>] [--reps <n>]

        OPTIONS:
          --json                  Print {"results":[...]} instead of a table.
          --quick                 Tiny counts: checks the benchmark runs, measures nothing.
          --only <name>           Run only the benchmarks whose name starts with <name>,
                                  or the one named <name> (engine-overhead, storm-10k, ...).
                                  'coordination' (not in the default run) measures fleet
                                  coordination against a redis-server it starts.
                                  'storm-http' (not in the default run) storms through
                                  URLSessionTransport against scripts/storm-server.py
                                  (run from the repository root).
          --reps <n>              Repetitions of each storm-http storm (median): 5.
          --baseline-reps <n>     Repetitions of its baseline (dispatch: unlimited): as --reps.
          --sizes <n,n>           storm-http's storm sizes: 1000,5000.
          -h, --help              Show help information.
        """)
    exit(0)
}

if let index = argv.firstIndex(of: "--bare-task-bytes"), index + 1 < argv.count, let count = Int(argv[index + 1]) {
    // The child process of storm-10k's memory baseline.
    print(await Benchmarks.bareTaskBytes(count: count))
    exit(0)
}

var results: [BenchResult] = []
if wanted("classify") { results += Benchmarks.classify(quick: quick) }
if wanted("decide") { results.append(Benchmarks.decide(quick: quick)) }
/// `--only storm-http`: the storms through URLSession against a loopback server (heavy; never in the default run).
let stormHTTP = only.map { $0.hasPrefix("storm-http") } == true
if wanted("storm"), !stormHTTP { results.append(await Benchmarks.storm(quick: quick)) }
if wanted("storm"), !stormHTTP { results.append(await Benchmarks.storm(quick: quick, dispatch: 6)) }
if stormHTTP {
    func value(_ option: String) -> String? {
        argv.firstIndex(of: option).flatMap { $0 + 1 < argv.count ? argv[$0 + 1] : nil }
    }
    let reps = value("--reps").flatMap { Int($0) } ?? 5
    let sizes = value("--sizes").map { $0.split(separator: ",").compactMap { Int($0) } }
    results += await Benchmarks.stormHTTP(
        quick: quick, repetitions: max(1, reps), baselineRepetitions: value("--baseline-reps").flatMap { Int($0) },
        sizes: sizes)
}
if wanted("engine") { results.append(await Benchmarks.engineOverhead(quick: quick)) }
if wanted("load") { results.append(Benchmarks.loadDefault(quick: quick)) }
// Needs a redis-server it starts itself, so only on request: `--only coordination`.
if only.map({ "coordination".hasPrefix($0) || $0.hasPrefix("coordination") }) == true {
    results += await Benchmarks.coordination(quick: quick)
}

if json {
    print("{\"results\":[" + results.map(\.json).joined(separator: ",") + "]}")
} else {
    print(BenchResult.table(results))
}
