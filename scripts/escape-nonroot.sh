#!/usr/bin/env bash
# Runs the escape suite (crates/cli/tests/escape) and the template tests of
# the kernel suite (crates/kernel/tests/kernel.rs, `template_*`: forked
# kernels in their own user namespace) as an unprivileged user, so every
# sandbox guarantee is checked for root (scripts/test.sh) and non-root;
# then the process-checkpoint tests (crates/cli/tests/checkpoints.rs,
# `process_checkpoints_*`) as that user, with a copy of CRIU that carries
# the CAP_CHECKPOINT_RESTORE file capability (CRIU's unprivileged mode),
# where `criu check` passes as root and setcap is installed.
#
# Needs root: creates the user (CELLHOST_ESCAPE_USER, default
# cellhost-escape) when missing, a venv that user can execute (from
# /usr/bin/python3 or CELLHOST_ESCAPE_BASE_PYTHON, with numpy, pandas and
# matplotlib at the pins of python/requirements.txt) under /var/tmp, and copies the
# test binary and `cellhost` into a world-readable scratch directory (the
# checkout may sit under a home directory the user cannot enter).
# Extra arguments go to the escape test binary (e.g. a name filter).
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
PINS=("$(pin numpy)" "$(pin pandas)" "$(pin matplotlib)")
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

LOCKED=()
[[ -f Cargo.lock ]] && LOCKED=(--locked)
# The executable of test target $2 of package $1.
test_bin() {
    cargo test "${LOCKED[@]}" -p "$1" --test "$2" --no-run --message-format=json 2>/dev/null \
        | "$BASE" -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("target", {}).get("name") == sys.argv[1] and m.get("executable"):
        print(m["executable"])' "$2"
}
say "build the escape suite and the kernel suite"
TEST_BIN="$(test_bin cellhost escape)"
KERNEL_BIN="$(test_bin cellhost-kernel kernel)"
CHECKPOINTS_BIN="$(test_bin cellhost checkpoints)"
CELLHOST_BIN="$(dirname -- "$(dirname -- "$TEST_BIN")")/cellhost"
[[ -x "$TEST_BIN" && -x "$KERNEL_BIN" && -x "$CHECKPOINTS_BIN" && -x "$CELLHOST_BIN" ]] || {
    echo "escape-nonroot: no test binary ($TEST_BIN, $KERNEL_BIN, $CHECKPOINTS_BIN) or cellhost ($CELLHOST_BIN)" >&2; exit 1; }

SCRATCH="$(mktemp -d /var/tmp/cellhost-escape-bin.XXXXXX)"
trap 'rm -rf -- "$SCRATCH"' EXIT
cp -- "$TEST_BIN" "$SCRATCH/escape"
cp -- "$KERNEL_BIN" "$SCRATCH/kernel"
cp -- "$CHECKPOINTS_BIN" "$SCRATCH/checkpoints"
cp -- "$CELLHOST_BIN" "$SCRATCH/cellhost"
chmod 755 "$SCRATCH" "$SCRATCH/escape" "$SCRATCH/kernel" "$SCRATCH/checkpoints" "$SCRATCH/cellhost"

as_user() {
    runuser -u "$USER_NAME" -- env -i \
        PATH=/usr/local/bin:/usr/bin:/bin \
        HOME="$USER_HOME" LANG=C.UTF-8 \
        CELLHOST_TEST_PYTHON="$VENV/bin/python" \
        CELLHOST_TEST_BIN="$SCRATCH/cellhost" \
        "$@"
}
cd "$SCRATCH"
status=0
say "escape suite as $USER_NAME (uid $(id -u "$USER_NAME"))"
as_user "$SCRATCH/escape" "$@" || status=$?
say "template tests of the kernel suite as $USER_NAME"
as_user "$SCRATCH/kernel" template_ || status=$?

# Process checkpoints as the user: CRIU's unprivileged mode, with a copy of
# the binary that carries CAP_CHECKPOINT_RESTORE (never the system's own).
CRIU="${CELLHOST_CRIU:-}"
if [[ -z "$CRIU" ]]; then
    for c in /usr/local/sbin/criu /usr/sbin/criu /sbin/criu; do [[ -x "$c" ]] && { CRIU="$c"; break; }; done
fi
if [[ $# -gt 0 ]]; then
    :  # a filter for the escape suite: only that was asked for
elif [[ -z "$CRIU" ]] || ! "$CRIU" check >/dev/null 2>&1; then
    say "process checkpoints as $USER_NAME: skipped (no CRIU whose \`criu check\` passes; scripts/criu-build.sh)"
elif ! command -v setcap >/dev/null 2>&1; then
    say "process checkpoints as $USER_NAME: skipped (no setcap: apt-get install libcap2-bin)"
elif ! { install -m 0755 -- "$CRIU" "$SCRATCH/criu" && setcap cap_checkpoint_restore+eip "$SCRATCH/criu"; }; then
    say "process checkpoints as $USER_NAME: skipped (setcap on $SCRATCH/criu failed: no file capabilities on this filesystem?)"
elif ! why="$(as_user "$SCRATCH/criu" check --unprivileged 2>&1)"; then
    say "process checkpoints as $USER_NAME: skipped (\`criu check --unprivileged\` fails as the user: $(tail -n 1 <<< "$why"))"
else
    # From here CRIU works as the user: a test that skips for want of it fails.
    say "process checkpoints as $USER_NAME ($SCRATCH/criu with cap_checkpoint_restore+eip)"
    as_user env CELLHOST_CRIU="$SCRATCH/criu" CELLHOST_REQUIRE_CRIU=1 \
        "$SCRATCH/checkpoints" process_checkpoints_ || status=$?
fi
exit "$status"
