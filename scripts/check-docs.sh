#!/usr/bin/env bash
# A DocC build of every library product's module with the toolchain's docc: the module's public
# symbol graph (swift-symbolgraph-extract over the debug build's modules), then `docc convert` with
# warnings treated as errors. Fails on anything docc warns about, above all a ``Symbol`` link that does
# not resolve (a renamed method, a type made `package`, a link into another module), and on a public
# symbol of the graph without a doc comment of its own (an enum case, a protocol requirement).
# Usage: scripts/check-docs.sh [OUTPUT_DIR]   (with OUTPUT_DIR the archives are kept there)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
modules=(ResponsePolicy ResponsePolicyURLSession ResponsePolicyCurl ResponsePolicyTesting ResponsePolicyRedis)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
output="${1:-$work/archives}"
mkdir -p "$output"

# A no-op after CI's `swift test` (it built everything); the libraries alone otherwise.
for module in "${modules[@]}"; do swift build -q --target "$module"; done
built="$(swift build --show-bin-path)/Modules"
triple=$(swiftc -print-target-info | python3 -c 'import json, sys; print(json.load(sys.stdin)["target"]["triple"])')

failed=()
for module in "${modules[@]}"; do
    mkdir -p "$work/graphs/$module"
    swift-symbolgraph-extract -module-name "$module" -target "$triple" -I "$built" \
        -I "$root/Sources/CYAML" -I "$root/Sources/CHiredis" -I "$root/Sources/CCurl" \
        -minimum-access-level public -skip-inherited-docs -output-dir "$work/graphs/$module"
    # Every public symbol declared in the sources has a doc comment of its own: beside what
    # scripts/check-public-api.sh reads from the lines, this covers enum cases and protocol
    # requirements, which carry no `public` of their own. (Synthesized symbols have no location.)
    if ! python3 - "$work/graphs/$module" "$root/" >&2 <<'EOF'; then
import glob, json, sys
missing = []
for path in sorted(glob.glob(sys.argv[1] + "/*.symbols.json")):
    for symbol in json.load(open(path))["symbols"]:
        location = symbol.get("location")
        if location is None or symbol.get("docComment"):
            continue
        file = location["uri"].removeprefix("file://").removeprefix(sys.argv[2])
        line = location["position"]["line"] + 1
        name = ".".join(symbol["pathComponents"])
        missing.append(f"{file}:{line}: error: public {symbol['kind']['displayName'].lower()} {name} has no doc comment")
for entry in missing:
    print(entry)
sys.exit(1 if missing else 0)
EOF
        failed+=("$module")
    fi
    if ! docc convert --additional-symbol-graph-dir "$work/graphs/$module" \
        --fallback-display-name "$module" --fallback-bundle-identifier "$module" \
        --output-dir "$output/$module.doccarchive" --warnings-as-errors >"$work/$module.log" 2>&1; then
        # docc prints each problem with its source excerpt; the excerpts name the files relative to here.
        sed "s|$root/||g" "$work/$module.log" >&2
        failed+=("$module")
    fi
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "error: the documentation of ${failed[*]} has problems (above): fix the doc comments they name" >&2
    exit 1
fi
echo "DocC: ${modules[*]} build without a warning"
