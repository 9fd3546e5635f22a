#!/usr/bin/env bash
# Fuzzes policy loading, lint and classification with libFuzzer and AddressSanitizer.
#
# Builds the `policy-fuzz` target with the toolchain's own libFuzzer (-sanitize=fuzzer,address;
# the runtime ships with Swift in usr/lib/clang/*/lib/linux, nothing else to install), then runs
# it for SECONDS over the seed corpus in Tests/Fuzz/corpus with the dictionary Tests/Fuzz/policy.dict.
# What one input exercises is documented on `FuzzHarness` (Sources/policy-fuzz/FuzzHarness.swift).
#
# Usage: scripts/fuzz.sh [SECONDS]          (60 by default)
#   FUZZ_CONFIG=debug scripts/fuzz.sh 60     build in debug: ~20 s to build instead of ~45 s, half the
#                                            executions per second, and `assert`s active (release by default)
#   FUZZ_CORPUS=DIR scripts/fuzz.sh 600      keep the inputs libFuzzer finds in DIR and start from them
#                                            next time (by default they go to a temporary folder, and
#                                            nothing is written into the repository)
#   FUZZ_ARGS='-jobs=2 -workers=2' scripts/fuzz.sh 600   extra libFuzzer flags
#
# Exit status: 0 when the run found nothing; non-zero on a crash, sanitizer report, oracle failure,
# timeout (an input taking over 10 s) or out-of-memory (over 2 GB), with the input saved in
# fuzz-artifacts/ (crash-*, timeout-*, oom-*). Replay one with a Swift backtrace:
#   swift run policy-fuzz fuzz-artifacts/crash-<hash>
# and shrink it first with (SWIFT_BACKTRACE=enable=no so each crash exits at once):
#   SWIFT_BACKTRACE=enable=no .build-fuzz/release/policy-fuzz -minimize_crash=1 -runs=20000 \
#       -exact_artifact_path=min fuzz-artifacts/crash-<hash>
set -euo pipefail

DURATION="${1:-60}"
CONFIG="${FUZZ_CONFIG:-release}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

if ! [[ "$DURATION" =~ ^[0-9]+$ ]]; then
    echo "fuzz: SECONDS must be a whole number, not '$DURATION'" >&2
    exit 2
fi

swift_bin="$(dirname "$(readlink -f "$(command -v swift)")")"
if ! ls "$swift_bin"/../lib/clang/*/lib/linux/libclang_rt.fuzzer-*.a >/dev/null 2>&1; then
    echo "fuzz: this Swift toolchain has no libFuzzer runtime (usr/lib/clang/*/lib/linux/libclang_rt.fuzzer-*.a)" >&2
    exit 2
fi

# --sanitize=fuzzer tells SwiftPM to link with libFuzzer's main instead of the target's; the
# -Xswiftc flag repeats it together with address so every module is instrumented for both (the
# driver keeps only the last -sanitize= it is given). -DLIBFUZZER drops the replayer's @main.
# The toolchain's lld links quietly where gold warns about ASan's local symbols.
build=(swift build --product policy-fuzz --scratch-path .build-fuzz -c "$CONFIG" --sanitize=fuzzer
    -Xswiftc -sanitize=fuzzer,address -Xswiftc -DLIBFUZZER -Xswiftc -use-ld=lld)
echo "== building: ${build[*]}"
start=$(date +%s)
"${build[@]}"
echo "== built in $(($(date +%s) - start)) s"
binary="$("${build[@]}" --show-bin-path)/policy-fuzz"

work="$(mktemp -d "${TMPDIR:-/tmp}/policy-fuzz.XXXXXX")"
trap 'rm -rf "$work"' EXIT
corpus="${FUZZ_CORPUS:-$work/corpus}"
mkdir -p "$corpus" fuzz-artifacts

# libFuzzer writes new inputs into the first folder only; the seeds are read from the second.
# The Swift runtime's own crash handler would hold a crashing process for up to 30 s while it
# symbolicates; libFuzzer and ASan print the stack themselves, so it is turned off.
export SWIFT_BACKTRACE=enable=no
if [[ -z "${ASAN_SYMBOLIZER_PATH:-}" && -x "$swift_bin/llvm-symbolizer" ]]; then
    export ASAN_SYMBOLIZER_PATH="$swift_bin/llvm-symbolizer"
fi
echo "== fuzzing for $DURATION s (artifacts go to fuzz-artifacts/)"
# Lines about each input added to the corpus (NEW, REDUCE, NEW_FUNC) and the recommended
# dictionary are left out of the output; the periodic "pulse" lines and the final stats stay.
set +e
# shellcheck disable=SC2086 # FUZZ_ARGS is a list of flags
# -detect_leaks=0 (and LeakSanitizer's own check at exit off): Swift keeps an enum's case in the
# spare high bits of a payload's pointer, which LeakSanitizer cannot follow, so closures held by
# the static settings tables (built once per process) read as "direct leaks". Memory that grows
# per input is still caught, by -rss_limit_mb and -malloc_limit_mb.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
"$binary" -max_total_time="$DURATION" -max_len=16384 -timeout=10 -rss_limit_mb=2048 -detect_leaks=0 \
    -dict=Tests/Fuzz/policy.dict -artifact_prefix=fuzz-artifacts/ -print_final_stats=1 ${FUZZ_ARGS:-} \
    "$corpus" Tests/Fuzz/corpus 2>&1 | tee "$work/log" | grep --line-buffered -v -E '^#[0-9]+[[:space:]]+(NEW|REDUCE)|^[[:space:]]+NEW_FUNC|" # Uses: [0-9]+$|^###### (Recommended|End of recommended) dictionary'
status=${PIPESTATUS[0]}
set -e

if [[ $status -ne 0 ]]; then
    echo "== fuzz: FAILED (libFuzzer exit $status); the input is in fuzz-artifacts/:" >&2
    grep -E 'Test unit written to|^SUMMARY' "$work/log" >&2 || true
    echo "   replay: swift run policy-fuzz <file>; then add it to Tests/ResponsePolicyTests/FuzzRegressionTests.swift" >&2
    exit "$status"
fi
echo "== fuzz: no findings in $DURATION s"
