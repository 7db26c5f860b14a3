#!/usr/bin/env bash
# Builds and installs a CRIU that passes `criu check` on recent kernels, for
# `checkpoint = "process"` sessions. Debian 12's criu 3.17.1 fails `criu check`
# on 6.x kernels whose vDSO layout it does not know ("Unexpected rt vDSO area
# bounds"); the Debian sid source package of CRIU 4.2.1 builds against
# bookworm's libraries unchanged.
#
# What it does (as root; idempotent: does nothing when /usr/local/sbin/criu is
# already this version and `criu check` passes):
#   1. installs the build dependencies from bookworm (apt-get);
#   2. adds a deb-src entry for sid under /etc/apt/sources.list.d/, fetches the
#      orig tarball with `apt-get source --download-only` (checksum verified by
#      apt against the signed Sources index), then removes the entry again;
#   3. builds the `criu` binary in /var/tmp/criu-build (no docs, no plugins);
#   4. installs it as /usr/local/sbin/criu (ahead of /usr/sbin on PATH) and
#      runs `criu check`.
#
# Usage: sudo scripts/criu-build.sh
# CRIU_BUILD_DIR overrides /var/tmp/criu-build; CRIU_PREFIX overrides /usr/local.
set -euo pipefail
VERSION=4.2.1
DEB_VERSION=4.2.1-1
BUILD_DIR="${CRIU_BUILD_DIR:-/var/tmp/criu-build}"
PREFIX="${CRIU_PREFIX:-/usr/local}"
SRC_LIST=/etc/apt/sources.list.d/cellhost-criu-sid-src.sources

if [[ $(id -u) -ne 0 ]]; then
    echo "criu-build: must run as root (apt-get and install to $PREFIX)" >&2
    exit 1
fi

if [[ -x "$PREFIX/sbin/criu" ]] && "$PREFIX/sbin/criu" --version | grep -q "^Version: $VERSION\$" \
    && "$PREFIX/sbin/criu" check >/dev/null 2>&1; then
    echo "criu-build: $PREFIX/sbin/criu $VERSION already installed and \`criu check\` passes"
    exit 0
fi

export DEBIAN_FRONTEND=noninteractive
apt-get install -y --no-install-recommends \
    gcc make pkgconf libbsd-dev libcap-dev libgnutls28-dev libnet1-dev libnftables-dev \
    libnl-3-dev libprotobuf-c-dev libprotobuf-dev protobuf-c-compiler protobuf-compiler \
    uuid-dev python3-protobuf xz-utils

mkdir -p "$BUILD_DIR"
cd "$BUILD_DIR"
if [[ ! -f "criu_$VERSION.orig.tar.xz" ]]; then
    cleanup() {
        rm -f "$SRC_LIST"
        apt-get update -qq || true
    }
    trap cleanup EXIT
    cat >"$SRC_LIST" <<'EOF'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: sid
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    apt-get update -qq
    # Only the .dsc and the orig tarball are needed (the Debian packaging
    # builds docs and Python bindings we do not use); apt checks both against
    # the signed index. A missing debian.tar.xz (superseded upload) is not fatal.
    apt-get source --download-only "criu=$DEB_VERSION" || true
    [[ -f "criu_$VERSION.orig.tar.xz" ]] || { echo "criu-build: orig tarball not fetched" >&2; exit 1; }
    cleanup
    trap - EXIT
fi
if [[ ! -x "criu-$VERSION/criu/criu" ]]; then
    rm -rf "criu-$VERSION"
    tar xf "criu_$VERSION.orig.tar.xz"
    make -C "criu-$VERSION" -j"$(nproc)" criu
fi
make -C "criu-$VERSION" PREFIX="$PREFIX" install-criu
"$PREFIX/sbin/criu" --version
"$PREFIX/sbin/criu" check
