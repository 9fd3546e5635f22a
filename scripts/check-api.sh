#!/usr/bin/env bash
# API-breakage check: the public API of each library product against the last release's, as
# committed in api/baseline/ (swift-api-digester dumps of 1.0.0, made as api/README.md says; no git
# history or tag is needed). Fails on a breaking change that api/breaking-changes.txt does not list,
# and on an entry there that no longer matches one (the list stays the truth).
# Usage: scripts/check-api.sh [--dump MODULES_DIR OUT_DIR]
#   With --dump it only writes the public API of each product's module found in MODULES_DIR (a build's
#   Modules folder) to OUT_DIR/<module>.json: how the baselines are made.
set -euo pipefail
# sort and comm must agree on one order, whatever the caller's locale.
export LC_ALL=C
cd "$(dirname "$0")/.."
root=$(pwd)
modules=(ResponsePolicy ResponsePolicyURLSession ResponsePolicyTesting ResponsePolicyRedis)

# Writes the public API of MODULE found in $1 to $2/MODULE.json: the digester's dump (sorted, no source
# locations, no tool arguments) with every `package` declaration taken out by scripts/api-dump.py.
dump() {
    local from=$1 to=$2 module
    for module in "${modules[@]}"; do
        # The C modules the Swift ones import internally must be found to load them.
        swift-api-digester -dump-sdk -module "$module" -I "$from" -I "$root/Sources/CYAML" \
            -I "$root/Sources/CHiredis" -avoid-location -avoid-tool-args -swift-only -abort-on-module-fail \
            -o "$to/$module.raw.json"
        python3 "$root/scripts/api-dump.py" "$to/$module.raw.json" "$to/$module.json"
        rm "$to/$module.raw.json"
    done
}

if [ "${1:-}" = --dump ]; then
    mkdir -p "$3"
    dump "$2" "$3"
    exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# A no-op after CI's `swift test` (it built everything); the libraries alone otherwise.
for module in "${modules[@]}"; do swift build -q --target "$module"; done
dump "$(swift build --show-bin-path)/Modules" "$work"

# Every breaking change, one per line, as "<module>: <what the digester says>".
: >"$work/found"
for module in "${modules[@]}"; do
    swift-api-digester -diagnose-sdk -input-paths "api/baseline/$module.json" -input-paths "$work/$module.json" \
        -o "$work/$module.diag"
    grep -v -e '^$' -e '^/\*' "$work/$module.diag" | sed "s/^/$module: /" >>"$work/found" || true
done
sort -u "$work/found" -o "$work/found"

# The allowlist: "<module>: <what the digester says> # <why>"; blank lines and lines starting with # are
# comments. A line without a reason is refused.
allowlist=api/breaking-changes.txt
if grep -v -e '^$' -e '^#' "$allowlist" | grep -v ' # [^ ]' >"$work/noreason"; then
    echo "error: $allowlist: an entry without ' # <why>':" >&2
    cat "$work/noreason" >&2
    exit 1
fi
grep -v -e '^$' -e '^#' "$allowlist" | sed 's/ # .*$//' | sort -u >"$work/allowed"

unlisted=$(comm -23 "$work/found" "$work/allowed")
stale=$(comm -13 "$work/found" "$work/allowed")
status=0
if [ -n "$unlisted" ]; then
    echo "error: breaking changes against 1.0.0 (api/baseline) that $allowlist does not list:" >&2
    sed 's/^/  /' <<<"$unlisted" >&2
    echo "Keep the API, or list each with ' # <why>' in $allowlist and in CHANGELOG.md's Unreleased section." >&2
    status=1
fi
if [ -n "$stale" ]; then
    echo "error: $allowlist lists changes the API no longer has (take them out):" >&2
    sed 's/^/  /' <<<"$stale" >&2
    status=1
fi
if [ $status -eq 0 ]; then
    echo "API check: $(wc -l <"$work/found") breaking changes against 1.0.0, each listed in $allowlist"
fi
exit $status
