#!/usr/bin/env bash
# Runs the escape suite (crates/cli/tests/escape) as an unprivileged user, so
# every sandbox guarantee is checked for root (scripts/test.sh) and non-root.
#
# Needs root: creates the user (CELLHOST_ESCAPE_USER, default
# cellhost-escape) when missing, a venv that user can execute (from
# /usr/bin/python3 or CELLHOST_ESCAPE_BASE_PYTHON, with numpy and matplotlib
# at the pins of python/requirements.txt) under /var/tmp, and copies the
# test binary and `cellhost` into a world-readable scratch directory (the
# checkout may sit under a home directory the user cannot enter).
# Extra arguments go to the test binary (e.g. a name filter).
set -euo pipefail

ROOT="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)"
cd "$ROOT"
say() { printf '\n==> %s\n' "$*" >&2; }

[[ "$(id -u)" == 0 ]] || { echo "escape-nonroot: run as root (it creates and switches to an unprivileged user)" >&2; exit 2; }
USER_NAME="${CELLHOST_ESCAPE_USER:-cellhost-escape}"
if ! id -u "$USER_NAME" >/dev/null 2>&1; then
    say "useradd -m $USER_NAME"
    useradd -m -s /bin/sh "$USER_NAME"
fi
USER_HOME="$(getent passwd "$USER_NAME" | cut -d: -f6)"

BASE="${CELLHOST_ESCAPE_BASE_PYTHON:-/usr/bin/python3}"
pin() { grep -E "^$1==" python/requirements.txt | head -1; }
PINS=("$(pin numpy)" "$(pin matplotlib)")
KEY="$(printf '%s\n' "$BASE" "${PINS[@]}" | sha256sum | cut -c1-12)"
VENV="/var/tmp/cellhost-escape-venv-$KEY"
if [[ ! -x "$VENV/bin/python" ]]; then
    say "venv $VENV (${PINS[*]})"
    rm -rf -- "$VENV.tmp"
    "$BASE" -m venv "$VENV.tmp"
    "$VENV.tmp/bin/python" -m pip install -q --disable-pip-version-check "${PINS[@]}"
    chmod -R a+rX "$VENV.tmp"
    mv -- "$VENV.tmp" "$VENV"
fi

say "build the escape suite"
LOCKED=()
[[ -f Cargo.lock ]] && LOCKED=(--locked)
TEST_BIN="$(cargo test "${LOCKED[@]}" -p cellhost --test escape --no-run --message-format=json 2>/dev/null \
    | "$BASE" -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("target", {}).get("name") == "escape" and m.get("executable"):
        print(m["executable"])')"
CELLHOST_BIN="$(dirname -- "$(dirname -- "$TEST_BIN")")/cellhost"
[[ -x "$TEST_BIN" && -x "$CELLHOST_BIN" ]] || { echo "escape-nonroot: no test binary ($TEST_BIN) or cellhost ($CELLHOST_BIN)" >&2; exit 1; }

SCRATCH="$(mktemp -d /var/tmp/cellhost-escape-bin.XXXXXX)"
trap 'rm -rf -- "$SCRATCH"' EXIT
cp -- "$TEST_BIN" "$SCRATCH/escape"
cp -- "$CELLHOST_BIN" "$SCRATCH/cellhost"
chmod 755 "$SCRATCH" "$SCRATCH/escape" "$SCRATCH/cellhost"

say "escape suite as $USER_NAME (uid $(id -u "$USER_NAME"))"
cd "$SCRATCH"
runuser -u "$USER_NAME" -- env -i \
    PATH=/usr/local/bin:/usr/bin:/bin \
    HOME="$USER_HOME" LANG=C.UTF-8 \
    CELLHOST_TEST_PYTHON="$VENV/bin/python" \
    CELLHOST_TEST_BIN="$SCRATCH/cellhost" \
    "$SCRATCH/escape" "$@"
