#!/usr/bin/env bash
# Wraps the statically linked `policy` (scripts/install.sh) in a Debian package for ops machines:
# /usr/bin/policy, the man page policy(1), README.md and docs/ in /usr/share/doc/policy. Depends: libyaml-0-2, libhiredis0.14, libcurl4 (and libstdc++6, which the static Swift runtime
# still loads). No Swift toolchain is needed where it is installed.
#
# Usage: scripts/package-deb.sh [OUTDIR]      (default: dist/)
#        VERSION=1.2.3 scripts/package-deb.sh  (default: the version `policy --version` prints)
# Install: sudo apt-get install ./dist/policy_VERSION_ARCH.deb
# Exit status: 0 built, 1 build failed, 2 setup error.
set -euo pipefail
cd "$(dirname "$0")/.."
outdir=${1:-dist}
command -v dpkg-deb >/dev/null 2>&1 || { echo "error: dpkg-deb is needed (apt-get install dpkg)" >&2; exit 2; }

staging=$(mktemp -d)
trap 'rm -rf "$staging"' EXIT
NO_PATH_NOTE=1 scripts/install.sh "$staging/root/usr"

version=${VERSION:-$("$staging/root/usr/bin/policy" --version | awk '{print $2}')}
arch=$(dpkg --print-architecture)
# scripts/install.sh put the documentation in /usr/share/doc/policy and policy(1) beside the binary;
# Debian ships man pages compressed.
mkdir -p "$staging/root/DEBIAN" "$outdir"
gzip -9n "$staging/root/usr/share/man/man1/policy.1"
size=$(du -sk "$staging/root/usr" | cut -f1)
cat > "$staging/root/DEBIAN/control" <<CONTROL
Package: policy
Version: $version
Section: devel
Priority: optional
Architecture: $arch
Depends: libyaml-0-2, libhiredis0.14, libcurl4, libstdc++6
Installed-Size: $size
Maintainer: ResponsePolicy maintainers <noreply@example.invalid>
Description: lint, test, diff and explain declarative HTTP response policies
 The ResponsePolicy command line: checks token refresh, forced logout and retry policies
 (policy lint), runs simulation scripts with expectations (policy test), shows the behavioural
 difference of a change (policy diff) and prints the policy file's JSON Schema (policy schema).
CONTROL
deb="$outdir/policy_${version}_${arch}.deb"
dpkg-deb --build --root-owner-group "$staging/root" "$deb" >/dev/null
echo "built $deb"
dpkg-deb --info "$deb" | sed -n '/Package:/,/Depends:/p'
