#!/usr/bin/env bash
# The checks of issue 31 that keep the code as it is, as .ci/run runs them, each timed:
# format, the public API's size and doc comments, API breakage against 1.0.0, DocC.
# The last two build the library products first (a no-op after `swift build`).
# Usage: scripts/check-all.sh
set -uo pipefail
cd "$(dirname "$0")/.."
failed=()
for check in check-format check-public-api check-api check-docs; do
    echo "== scripts/$check.sh"
    start=$(date +%s)
    scripts/$check.sh || failed+=("$check")
    echo "   ($(($(date +%s) - start)) s)"
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "error: failed: ${failed[*]}" >&2
    exit 1
fi
