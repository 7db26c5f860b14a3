#!/usr/bin/env bash
# Builds the `cellhost` wheel (python/cellhost_sdk): the `cellhost` binary
# (maturin, bindings = "bin") plus the pure-Python package, tagged manylinux
# for this machine's architecture (x86_64 here; aarch64 builds the same way
# on an aarch64 host). The wheel needs no Rust toolchain or network to install.
# CELLHOST_WHEEL_TARGET=aarch64-unknown-linux-gnu cross-builds it here: the
# Rust target is added with rustup and zig (pip `ziglang`, pinned) is the
# cross C compiler and linker, for manylinux2014 (see README for the result).
#
# Usage: scripts/build-wheel.sh [OUT_DIR]   (default target/wheels)
# CELLHOST_WHEEL_PROFILE=dev builds the debug profile (the tests do: fast to
# compile, same behaviour); the default is `release`.
# maturin comes from a build venv under /var/tmp (pinned below).
set -euo pipefail
ROOT="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)"
OUT="${1:-$ROOT/target/wheels}"
PROFILE="${CELLHOST_WHEEL_PROFILE:-release}"
MATURIN_VERSION=1.9.6
BUILD_VENV="${CELLHOST_BUILD_VENV:-${TMPDIR:-/var/tmp}/cellhost-build-venv}"
if [[ ! -x "$BUILD_VENV/bin/maturin" ]] || ! "$BUILD_VENV/bin/maturin" --version | grep -q " $MATURIN_VERSION\$"; then
    python3 -m venv "$BUILD_VENV"
    "$BUILD_VENV/bin/pip" install -q "maturin==$MATURIN_VERSION"
fi
# The manylinux tag: maturin checks the binary's glibc symbols and tags the
# oldest policy it meets (manylinux_2_X for this machine's glibc 2.X);
# CELLHOST_WHEEL_ZIG=1 links with zig (pip `ziglang`) for manylinux2014
# (glibc 2.17), for wheels that install on older systems.
COMPAT=()
TARGET="${CELLHOST_WHEEL_TARGET:-}"
if [[ -n "$TARGET" ]]; then
    command -v rustup >/dev/null 2>&1 || { echo "build-wheel: --target $TARGET needs rustup" >&2; exit 1; }
    rustup target list --installed | grep -qx "$TARGET" || rustup target add "$TARGET" >&2
    CELLHOST_WHEEL_ZIG=1
    COMPAT=(--target "$TARGET")
fi
if [[ "${CELLHOST_WHEEL_ZIG:-0}" == 1 ]]; then
    "$BUILD_VENV/bin/pip" install -q "ziglang==0.13.0"
    # maturin finds zig as `python3 -m ziglang` on PATH: the build venv's.
    export PATH="$BUILD_VENV/bin:$PATH"
    COMPAT+=(--zig --compatibility manylinux2014)
fi
cd "$ROOT/python/cellhost_sdk"
"$BUILD_VENV/bin/maturin" build --locked --profile "$PROFILE" ${COMPAT[@]+"${COMPAT[@]}"} --out "$OUT" >&2
ls -t "$OUT"/cellhost-*.whl | head -1
