#!/usr/bin/env bash
# Builds a release `policy` with the Swift standard library and Foundation linked statically and
# installs it as PREFIX/bin/policy, so machines without a Swift toolchain can run it. At run time
# the binary needs only libyaml (libyaml-0-2), hiredis (libhiredis0.14) and libcurl (libcurl4) from Debian.
# Beside it: the documentation in PREFIX/share/doc/policy (README.md, docs/, the shipped policies),
# where the `doc` links of lint's findings point, and the man page PREFIX/share/man/man1/policy.1.
#
# Building needs the toolchain, libyaml-dev, libhiredis-dev, pkgconf and libcurl4-openssl-dev (the
# static FoundationNetworking links against libcurl); all are checked before building. Missing
# Debian packages are installed when running as root with apt-get; otherwise the script says what
# to install and stops. A cold release build takes about 9 minutes on 2 cores.
#
# Usage: scripts/install.sh PREFIX            e.g. scripts/install.sh /usr/local
#        scripts/install.sh --check           only check the build dependencies (exit 0 or 2)
#        SCRATCH=.build-static scripts/install.sh ~/.local   (where SwiftPM builds; the default)
# Exit status: 0 installed, 1 build failed, 2 usage or setup error.
set -euo pipefail

if [ $# -ne 1 ] || [ -z "$1" ]; then
    echo "usage: scripts/install.sh PREFIX   (installs PREFIX/bin/policy; --check only checks the build dependencies)" >&2
    exit 2
fi
prefix=$1
cd "$(dirname "$0")/.."
scratch=${SCRATCH:-.build-static}

# Every build dependency is checked before anything is built, so a clean machine stops here with
# what to install, not minutes later on a missing header. The Debian packages: every system
# library target's provider in Package.swift (InstallScriptTests keeps this list in step with
# it), libcurl for the static FoundationNetworking, pkg-config for libyaml's flags.
build_packages=(libyaml-dev libhiredis-dev libcurl4-openssl-dev)
if ! command -v swift >/dev/null 2>&1; then
    echo "error: building needs the Swift toolchain (swift 6 or later): https://www.swift.org/install/linux/" >&2
    exit 2
fi
if [ "${1:-}" = --check ]; then check_only=1; else check_only=; fi
if [ "$(uname -s)" = Linux ]; then
    missing=()
    for package in "${build_packages[@]}"; do
        dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
    done
    command -v pkg-config >/dev/null 2>&1 || missing+=(pkgconf)
    if [ ${#missing[@]} -gt 0 ]; then
        if [ -z "$check_only" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
            echo "== installing ${missing[*]}"
            apt-get update -qq
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
        else
            echo "error: building needs: ${missing[*]} (sudo apt-get install ${missing[*]})" >&2
            exit 2
        fi
    fi
fi
if [ -n "$check_only" ]; then
    echo "every build dependency is installed: swift, ${build_packages[*]}, pkg-config"
    exit 0
fi

echo "== a cold release build takes about 9 minutes on 2 cores (a rebuild after a change, 1-2 minutes)"
echo "== swift build -c release --static-swift-stdlib --product policy"
swift build -c release --static-swift-stdlib --product policy --scratch-path "$scratch"
binary="$(swift build -c release --static-swift-stdlib --product policy --scratch-path "$scratch" --show-bin-path)/policy"

mkdir -p "$prefix/bin"
install -m 0755 "$binary" "$prefix/bin/policy"
if command -v strip >/dev/null 2>&1; then strip "$prefix/bin/policy" 2>/dev/null || true; fi

# The documentation, where the installed binary looks for it (PREFIX/bin/../share/doc/policy/docs):
# the `doc` link of every lint finding opens here, not in a repository the machine has no copy of.
doc="$prefix/share/doc/policy"
mkdir -p "$doc/docs" "$doc/policies" "$prefix/share/man/man1"
install -m 0644 README.md "$doc/README.md"
install -m 0644 docs/*.md docs/policy.schema.json "$doc/docs/"
install -m 0644 policies/*.yaml "$doc/policies/"
# policy(1), printed from the same command table as --help and docs/commands.md.
"$prefix/bin/policy" help --man > "$prefix/share/man/man1/policy.1"

if command -v ldd >/dev/null 2>&1 && ldd "$prefix/bin/policy" | grep -q 'libswift\|libFoundation'; then
    echo "error: $prefix/bin/policy still links the Swift runtime dynamically:" >&2
    ldd "$prefix/bin/policy" >&2
    exit 1
fi
echo "installed $prefix/bin/policy ($("$prefix/bin/policy" --version)), its documentation in $doc and man page"
[ -n "${NO_PATH_NOTE:-}" ] || case ":$PATH:" in
    *":$prefix/bin:"*) ;;
    *) echo "note: $prefix/bin is not on PATH; add it: export PATH=\"$prefix/bin:\$PATH\"" ;;
esac
