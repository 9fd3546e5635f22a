#!/usr/bin/env bash
# swift format lint over the package's Swift files with the repository's .swift-format, warnings
# treated as errors (--strict): fails on any finding, printing each as file:line:column.
# docs/snippets is left out on purpose: DocsTests compares its regions with the documentation byte
# for byte, so those files keep the documentation's layout.
# Usage: scripts/check-format.sh   (to fix: swift format -i -r Sources Tests Package.swift examples)
set -euo pipefail
cd "$(dirname "$0")/.."
# swift format exits 0 on findings without --strict, and its output is the findings alone: fail on either.
findings=$(swift format lint --strict --parallel -r Sources Tests Package.swift examples 2>&1) || status=$?
if [ -n "$findings" ] || [ "${status:-0}" -ne 0 ]; then
    printf '%s\n' "$findings" >&2
    echo "error: swift format lint found the above (fix with: swift format -i -r Sources Tests Package.swift examples)" >&2
    exit 1
fi
echo "swift format lint: clean"
