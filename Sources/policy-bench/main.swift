import Foundation
import ResponsePolicy

// policy-bench: each result is measured next to its baseline in the same run, and reported as a
// ratio, because these machines are noisy. `--json` for machines, a table otherwise; `--quick`
// runs tiny counts (the test suite uses it to keep the benchmark working).

let argv = Array(CommandLine.arguments.dropFirst())
let arguments = Set(argv)
/// The word after `option` on the command line (`--reps 3`), if there is one.
func value(_ option: String) -> String? {
    argv.firstIndex(of: option).flatMap { $0 + 1 < argv.count ? argv[$0 + 1] : nil }
}
/// `--only NAME`: run one benchmark (for profiling it).
let only = value("--only")
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
                                  or the one named <name> (engine-overhead, storm-10k,
                                  lint-20k, lint-100k, diff-1k, scale, hostile-header, ...).
                                  lint-100k runs in a full run or on request, not with --quick.
                                  Every row has a baseline from the same run and its ratio;
                                  the machine's load at start and end is printed with them.
                                  'replay' replays HAR files of 100,000 and 1,000,000
                                  requests, each in a child process, for peak RSS.
                                  'coordination' (not in the default run) measures fleet
                                  coordination against a redis-server it starts.
                                  'storm-http' (not in the default run) storms through
                                  URLSessionTransport against scripts/storm-server.py
                                  (run from the repository root).
                                  'transport' (not in the default run) sends GET and POST,
                                  sequential and 16 at once, over HTTP, TLS and HTTP/2
                                  through a loopback nginx it starts, with raw URLSession
                                  and raw libcurl as baselines in the same run, and raw
                                  libcurl awaited from a task (async-libcurl: the floor
                                  under any async transport on libcurl; async-libcurl-socket:
                                  the same sending on the caller's thread, one hop less).
                                  --clients a,b picks clients (engine+curl,
                                  engine+curl-executor, curl-executor, engine+urlsession,
                                  raw-urlsession, raw-libcurl, async-libcurl,
                                  async-libcurl-socket);
                                  --requests n per measure;
                                  --goaway-after n: nginx closes each connection after n
                                  requests (GOAWAY over HTTP/2), as load balancers do.
          --install-ca            transport: add its self-signed certificate to the system
                                  bundle for the run (root; URLSession on Linux trusts no
                                  other), taken out at the end. Without it the URLSession
                                  TLS figures are failed handshakes.
          --transport <t>         storm-http's transport: urlsession (default) or curl.
          --reps <n>              Repetitions of each storm-http storm, or of each transport
                                  row with its clients taking turns (median): 5.
          --baseline-reps <n>     Repetitions of its baseline (dispatch: unlimited): as --reps.
          --sizes <n,n>           storm-http's storm sizes: 1000,5000.
          -h, --help              Show help information.
        """)
    exit(0)
}

if let index = argv.firstIndex(of: "--peak-rss"), index + 2 < argv.count {
    // The child process of the lint row's memory figures.
    print(Int(Benchmarks.peakRSS(mode: argv[index + 1], path: argv[index + 2])))
    exit(0)
}

if let index = argv.firstIndex(of: "--replay-run"), index + 1 < argv.count {
    // The child process of the replay row: replays a HAR file, prints its peak RSS and wall time.
    print(Benchmarks.replayRun(path: argv[index + 1]))
    exit(0)
}

if let index = argv.firstIndex(of: "--bare-task-bytes"), index + 1 < argv.count, let count = Int(argv[index + 1]) {
    // The child process of storm-10k's memory baseline.
    print(await Benchmarks.bareTaskBytes(count: count))
    exit(0)
}

// The machine's load at the start and the end, printed with the results: these machines are
// shared, and a ratio measured while something else ran is read with that in mind.
let loadAtStart = machineLoad()
var results: [BenchResult] = []
if wanted("classify") { results += Benchmarks.classify(quick: quick) }
if wanted("decide") { results.append(Benchmarks.decide(quick: quick)) }
/// `--only storm-http`: the storms through URLSession against a loopback server (heavy; never in the default run).
let stormHTTP = only.map { $0.hasPrefix("storm-http") } == true
if wanted("storm"), !stormHTTP { results.append(await Benchmarks.storm(quick: quick)) }
if wanted("storm"), !stormHTTP { results.append(await Benchmarks.storm(quick: quick, dispatch: 6)) }
if stormHTTP {
    let reps = value("--reps").flatMap { Int($0) } ?? 5
    let sizes = value("--sizes").map { $0.split(separator: ",").compactMap { Int($0) } }
    results += await Benchmarks.stormHTTP(
        quick: quick, repetitions: max(1, reps), baselineRepetitions: value("--baseline-reps").flatMap { Int($0) },
        sizes: sizes, curl: value("--transport") == "curl")
}
// Needs nginx (nginx-light, libnginx-mod-http-echo): only on request, `--only transport`.
if only.map({ $0.hasPrefix("transport") }) == true {
    let clients = value("--clients").map {
        Set($0.split(separator: ",").compactMap { Benchmarks.Client(rawValue: String($0)) })
    }
    results += await Benchmarks.transport(
        quick: quick, installCA: arguments.contains("--install-ca"), only: only ?? "transport",
        clients: clients ?? Set(Benchmarks.Client.allCases), requests: value("--requests").flatMap { Int($0) },
        repetitions: max(1, value("--reps").flatMap { Int($0) } ?? (quick ? 1 : 5)),
        goawayAfter: value("--goaway-after").flatMap { Int($0) })
}
if wanted("engine") { results.append(await Benchmarks.engineOverhead(quick: quick)) }
if wanted("engine-overhead-metrics") { results.append(await Benchmarks.engineOverheadWithMetrics(quick: quick)) }
if wanted("replay") { results.append(Benchmarks.replay(quick: quick)) }
if wanted("load") { results.append(Benchmarks.loadDefault(quick: quick)) }
if wanted("lint-20k") { results.append(Benchmarks.lint(quick: quick, count: 20_000, memory: true)) }
// 100,000 rules: seconds, so only on request (`--only lint-100k`) or in a full run without --quick;
// with its peak RSS, so memory proportional to the file can be read beside lint-20k's.
if only.map({ "lint-100k".hasPrefix($0) }) ?? !quick {
    results.append(Benchmarks.lint(quick: quick, count: 100_000, memory: true))
}
if wanted("diff") { results.append(Benchmarks.diff(quick: quick)) }
if wanted("scale") { results += Benchmarks.scale(quick: quick) }
if wanted("hostile") { results.append(Benchmarks.hostileHeader(quick: quick)) }
// Needs a redis-server it starts itself, so only on request: `--only coordination`.
if only.map({ "coordination".hasPrefix($0) || $0.hasPrefix("coordination") }) == true {
    results += await Benchmarks.coordination(quick: quick)
}

let loadAtEnd = machineLoad()
if json {
    print(
        "{\"load\":{\"start\":\"\(loadAtStart)\",\"end\":\"\(loadAtEnd)\",\"cores\":\(ProcessInfo.processInfo.activeProcessorCount)},"
            + "\"results\":[" + results.map(\.json).joined(separator: ",") + "]}")
} else {
    print(
        "machine load (1, 5, 15 min averages; /proc/loadavg) at start: \(loadAtStart), at end: \(loadAtEnd), "
            + "cores: \(ProcessInfo.processInfo.activeProcessorCount)")
    print(BenchResult.table(results))
}
