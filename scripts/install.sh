#!/usr/bin/env bash
# Builds a release `policy` with the Swift standard library and Foundation linked statically and
# installs it as PREFIX/bin/policy, so machines without a Swift toolchain can run it. At run time
# the binary needs only libyaml (libyaml-0-2), hiredis (libhiredis0.14) and libcurl (libcurl4) from Debian.
#
# Building needs the toolchain, libyaml-dev, pkgconf and libcurl4-openssl-dev (the static
# FoundationNetworking links against libcurl). Missing Debian packages are installed when running
# as root with apt-get; otherwise the script says what to install and stops.
#
# Usage: scripts/install.sh PREFIX            e.g. scripts/install.sh /usr/local
#        SCRATCH=.build-static scripts/install.sh ~/.local   (where SwiftPM builds; the default)
# Exit status: 0 installed, 1 build failed, 2 usage or setup error.
set -euo pipefail

if [ $# -ne 1 ] || [ -z "$1" ]; then
    echo "usage: scripts/install.sh PREFIX   (installs PREFIX/bin/policy)" >&2
    exit 2
fi
prefix=$1
cd "$(dirname "$0")/.."
scratch=${SCRATCH:-.build-static}

if [ "$(uname -s)" = Linux ]; then
    missing=()
    for package in libyaml-dev libcurl4-openssl-dev; do
        dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
    done
    command -v pkg-config >/dev/null 2>&1 || missing+=(pkgconf)
    if [ ${#missing[@]} -gt 0 ]; then
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
            echo "== installing ${missing[*]}"
            apt-get update -qq
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
        else
            echo "error: building needs: ${missing[*]} (sudo apt-get install ${missing[*]})" >&2
            exit 2
        fi
    fi
fi

echo "== swift build -c release --static-swift-stdlib --product policy"
swift build -c release --static-swift-stdlib --product policy --scratch-path "$scratch"
binary="$(swift build -c release --static-swift-stdlib --product policy --scratch-path "$scratch" --show-bin-path)/policy"

mkdir -p "$prefix/bin"
install -m 0755 "$binary" "$prefix/bin/policy"
if command -v strip >/dev/null 2>&1; then strip "$prefix/bin/policy" 2>/dev/null || true; fi

if command -v ldd >/dev/null 2>&1 && ldd "$prefix/bin/policy" | grep -q 'libswift\|libFoundation'; then
    echo "error: $prefix/bin/policy still links the Swift runtime dynamically:" >&2
    ldd "$prefix/bin/policy" >&2
    exit 1
fi
echo "installed $prefix/bin/policy ($("$prefix/bin/policy" --version))"
[ -n "${NO_PATH_NOTE:-}" ] || case ":$PATH:" in
    *":$prefix/bin:"*) ;;
    *) echo "note: $prefix/bin is not on PATH; add it: export PATH=\"$prefix/bin:\$PATH\"" ;;
esac
