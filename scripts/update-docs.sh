#!/usr/bin/env bash
# Regenerates the documentation that is the output of the code: docs/lint-rules.md (the lint
# rules' descriptions), docs/plugins.md (the plugins' option schemas), docs/settings.md (the
# settings sections' tables), docs/policy.schema.json,
# and the generated blocks of docs/commands.md (the command table; the prose between the blocks
# is kept). The tests named in docs/design.md fail until this has been run after a change.
#
# Usage: scripts/update-docs.sh        (builds `policy` in debug first)
set -euo pipefail
cd "$(dirname "$0")/.."
swift build --product policy >/dev/null
policy=$(swift build --show-bin-path)/policy
"$policy" lint --list-rules > docs/lint-rules.md
"$policy" schema --list-plugins > docs/plugins.md
"$policy" schema --list-settings > docs/settings.md
"$policy" schema > docs/policy.schema.json
"$policy" help --markdown > .build/command-blocks.md
python3 - docs/commands.md .build/command-blocks.md <<'PY'
import re, sys
doc_path, blocks_path = sys.argv[1], sys.argv[2]
pattern = re.compile(r"<!-- BEGIN GENERATED (?:.*?): (\S+) -->\n.*?<!-- END GENERATED -->\n", re.S)
blocks = {m.group(1): m.group(0) for m in pattern.finditer(open(blocks_path).read())}
doc = open(doc_path).read()
names = [m.group(1) for m in pattern.finditer(doc)]
missing = sorted(set(blocks) - set(names))
if missing:
    sys.exit(f"docs/commands.md has no block for: {', '.join(missing)}; add an empty one where it belongs:\n"
             + "".join(f"<!-- BEGIN GENERATED from the command table by `policy help --markdown`: {n} -->\n"
                       "<!-- END GENERATED -->\n" for n in missing))
doc = pattern.sub(lambda m: blocks.get(m.group(1), ""), doc)
open(doc_path, "w").write(doc)
PY
echo "updated docs/lint-rules.md docs/plugins.md docs/settings.md docs/policy.schema.json docs/commands.md"
