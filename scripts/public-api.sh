#!/usr/bin/env bash
# Counts the public (and open) declarations of each library product's module, and its public
# types, the way issue 21's review counted them: one per line that declares something public.
# Usage: scripts/public-api.sh
set -euo pipefail
cd "$(dirname "$0")/.."
total=0
for module in ResponsePolicy ResponsePolicyURLSession ResponsePolicyCurl ResponsePolicyTesting ResponsePolicyRedis; do
    [ -d "Sources/$module" ] || continue
    decls=$(grep -rhE '^\s*(@[A-Za-z]+ )*(public|open)( |\()' "Sources/$module" | wc -l)
    types=$(grep -rhE '^\s*(@[A-Za-z]+ )*(public|open) (final )?(struct|enum|class|actor|protocol|typealias) ' \
        "Sources/$module" | wc -l)
    printf '%-26s %4d declarations, %3d types\n' "$module" "$decls" "$types"
    total=$((total + decls))
done
printf '%-26s %4d declarations\n' total "$total"
