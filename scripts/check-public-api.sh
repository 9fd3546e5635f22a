#!/usr/bin/env bash
# Keeps the public API small and documented. Over the library products' modules (ResponsePolicy,
# ResponsePolicyURLSession, ResponsePolicyCurl, ResponsePolicyTesting, ResponsePolicyRedis) it fails
#   - when they have more than 352 public declarations, counted as scripts/public-api.sh counts
#     them: one per line whose first word, after attributes without arguments (`@discardableResult`),
#     is `public` or `open`;
#   - on each such declaration without a doc comment directly above it: the nearest line above that
#     is not an attribute (`@...`) must be a `///` line or end a `/** ... */` block. A blank line or a
#     `//` comment in between does not count.
# (Protocol requirements and enum cases carry no `public` of their own: neither counted nor checked.)
# Usage: scripts/check-public-api.sh [LIMIT]   (352 by default)
set -euo pipefail
cd "$(dirname "$0")/.."
python3 - "${1:-352}" <<'EOF'
import os
import re
import sys

limit = int(sys.argv[1])
modules = ["ResponsePolicy", "ResponsePolicyURLSession", "ResponsePolicyCurl", "ResponsePolicyTesting", "ResponsePolicyRedis"]
# The same pattern as scripts/public-api.sh's grep -E.
declaration = re.compile(r"^\s*(@[A-Za-z]+ )*(public|open)( |\()")
total = 0
undocumented = []
for module in modules:
    count = 0
    for folder, _, files in sorted(os.walk(os.path.join("Sources", module))):
        for name in sorted(files):
            if not name.endswith(".swift"):
                continue
            path = os.path.join(folder, name)
            with open(path, encoding="utf-8") as f:
                lines = f.read().split("\n")
            for index, line in enumerate(lines):
                if not declaration.match(line):
                    continue
                count += 1
                above = index - 1
                while above >= 0 and lines[above].strip().startswith("@"):
                    above -= 1
                text = lines[above].strip() if above >= 0 else ""
                if not (text.startswith("///") or text.endswith("*/")):
                    undocumented.append(f"{path}:{index + 1}: error: public declaration without a doc comment: {line.strip()}")
    print(f"{module:26} {count:4d} public declarations")
    total += count
print(f"{'total':26} {total:4d} (limit {limit})")
status = 0
if undocumented:
    print("\n".join(undocumented), file=sys.stderr)
    print(f"error: {len(undocumented)} public declarations without a /// comment directly above", file=sys.stderr)
    status = 1
if total > limit:
    print(f"error: {total} public declarations, more than {limit}: make what services do not need `package`", file=sys.stderr)
    status = 1
sys.exit(status)
EOF
