#!/usr/bin/env bash
# Proves that the core products (ResponsePolicy, ResponsePolicyURLSession, ResponsePolicyTesting)
# depend on neither hiredis nor the libcurl product (ResponsePolicyCurl, CCurl),
# and the core's tests build, and a service using the core links, without hiredis, on a machine that has libhiredis-dev installed (CI
# installs it for ResponsePolicyRedis): it builds them from a copy of the package whose CHiredis
# module cannot compile or link (its header is an #error, its link name does not exist), then
# checks that no compiled file of that build read a hiredis header by another route.
# It fails if anything the core builds reaches hiredis again.
# Usage: scripts/check-core-without-hiredis.sh [scratch folder]   (.build-core by default)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
scratch="${1:-$root/.build-core}"
copy=$(mktemp -d)
trap 'rm -rf "$copy"' EXIT

# The package as committed and as edited (tracked and untracked files, never .build*); outside a
# git checkout, everything but the build folders.
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git ls-files --cached --others --exclude-standard -z | while IFS= read -r -d '' path; do
        [ -e "$path" ] || continue
        mkdir -p "$copy/$(dirname "$path")"
        cp -p "$path" "$copy/$path"
    done
else
    tar --exclude='./.build*' --exclude='./.swiftpm' -cf - . | tar -xf - -C "$copy"
fi
printf '#error "hiredis reached from a target that must build without it (issue 19: only ResponsePolicyRedis links hiredis)"\n' \
    >"$copy/Sources/CHiredis/CHiredis.h"
sed -i 's/link "hiredis"/link "no-hiredis-for-the-core"/' "$copy/Sources/CHiredis/module.modulemap"

echo "== the dependency closure of the core products names no hiredis"
swift package --package-path "$copy" --scratch-path "$scratch" dump-package | python3 -c '
import json, sys
package = json.load(sys.stdin)
targets = {t["name"]: t for t in package["targets"]}
def names(dependency):
    for kind in ("byName", "target", "product"):
        if kind in dependency: return [dependency[kind][0]]
    return []
def closure(name, seen):
    if name in seen or name not in targets: return seen
    seen.add(name)
    for dependency in targets[name].get("dependencies", []):
        for other in names(dependency): closure(other, seen)
    return seen
core = ["ResponsePolicy", "ResponsePolicyURLSession", "ResponsePolicyTesting", "ResponsePolicyTests",
        "ResponsePolicyURLSessionTests"]
bad = {name: sorted(n for n in closure(name, set()) if "hiredis" in n.lower() or n.endswith("Redis"))
       for name in core}
bad = {k: v for k, v in bad.items() if v}
if bad:
    sys.exit("the core depends on hiredis: %s" % bad)
# Nor libcurl: only ResponsePolicyCurl links it directly (issue 33); the core and the URLSession
# and Testing products never depend on it.
curl = {name: sorted(n for n in closure(name, set()) if n in ("CCurl", "ResponsePolicyCurl"))
        for name in ["ResponsePolicy", "ResponsePolicyURLSession", "ResponsePolicyTesting"]}
curl = {k: v for k, v in curl.items() if v}
if curl:
    sys.exit("a core product depends on libcurl: %s" % curl)
print("ok: " + ", ".join(core))
'

echo "== swift build of the core targets and the core test targets, CHiredis unbuildable"
# --target, not --product: SwiftPM builds every target for `--product` of an automatic library
# product ("building the default target instead"), policy and ResponsePolicyRedis among them.
for target in ResponsePolicy ResponsePolicyURLSession ResponsePolicyTesting ResponsePolicyTests \
    ResponsePolicyURLSessionTests; do
    swift build --package-path "$copy" --scratch-path "$scratch" --target "$target"
done

echo "== examples/service, which depends on the ResponsePolicy and ResponsePolicyURLSession products, builds and links"
# What a service's build does: only the products it names, compiled and linked into an executable.
swift build --package-path "$copy/examples/service" --scratch-path "$scratch-service"

echo "== no file of that build read a hiredis header"
# The compilers' dependency files (.d) list every header and module each file read. A reused
# scratch folder may hold ResponsePolicyRedis's from a full build: those are not the core's.
files=$(find "$scratch" "$scratch-service" -name '*.d' -not -path '*ResponsePolicyRedis*' | wc -l)
if [ "$files" -eq 0 ]; then
    echo "no dependency files to check" >&2
    exit 1
fi
if grep -rl --include='*.d' --exclude-dir='ResponsePolicyRedis*' 'hiredis' "$scratch" "$scratch-service"; then
    echo "a core target read a hiredis header (the files above)" >&2
    exit 1
fi
echo "ok: $files dependency files, none names hiredis"
