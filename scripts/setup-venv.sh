#!/usr/bin/env bash
# Create (or refresh) the project's Python environment at <repo>/.venv.
#
# - The base interpreter is the machine's real CPython 3.11+: `python3` is
#   resolved to its absolute executable (sys.executable), so a pyenv shim is
#   never baked into the venv. Override with CELLHOST_BASE_PYTHON=/path.
# - Packages come from python/requirements.txt (exact pins).
# - Idempotent: when .venv/.cellhost-stamp matches the requirements, the pip
#   pin and the base interpreter, nothing is installed again.
# - Progress goes to stderr; stdout gets exactly one line, the absolute path
#   of the venv's python, so callers can do PY="$(scripts/setup-venv.sh)".
set -euo pipefail

ROOT="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)"
VENV="$ROOT/.venv"
REQS="$ROOT/python/requirements.txt"
STAMP="$VENV/.cellhost-stamp"
PIP_VERSION="26.3"
MIN_PY="3.11"

say() { printf 'setup-venv: %s\n' "$*" >&2; }
die() { printf 'setup-venv: error: %s\n' "$*" >&2; exit 1; }

# A stray environment must not redirect what we install or where.
unset PYTHONHOME PYTHONPATH PIP_USER PIP_TARGET PIP_PREFIX PIP_REQUIRE_VIRTUALENV VIRTUAL_ENV
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

[[ -f "$REQS" ]] || die "missing $REQS"

# ---- resolve the base interpreter -------------------------------------------
# Prints the absolute real executable of a candidate if it is CPython >= 3.11.
probe() {
    "$1" - "$MIN_PY" 2>/dev/null <<'PY'
import os, platform, sys
want = tuple(int(p) for p in sys.argv[1].split("."))
if platform.python_implementation() != "CPython" or sys.version_info[:2] < want:
    sys.exit(1)
# Inside a venv, build from the interpreter the venv itself was made from.
exe = getattr(sys, "_base_executable", None) if sys.prefix != sys.base_prefix else None
exe = exe or sys.executable
if not exe or not os.path.isfile(exe):
    sys.exit(1)
print(os.path.abspath(exe))
PY
}

BASE=""
if [[ -n "${CELLHOST_BASE_PYTHON:-}" ]]; then
    BASE="$(probe "$CELLHOST_BASE_PYTHON")" \
        || die "CELLHOST_BASE_PYTHON=$CELLHOST_BASE_PYTHON is not a working CPython >= $MIN_PY"
else
    for cand in python3 python3.11; do
        command -v "$cand" >/dev/null 2>&1 || continue
        if BASE="$(probe "$cand")"; then break; fi
        BASE=""
    done
    [[ -n "$BASE" ]] || die "no CPython >= $MIN_PY found as python3 or python3.11 (set CELLHOST_BASE_PYTHON=/path/to/python3.11)"
fi
case "$BASE" in
    */shims/*) die "resolved base interpreter is a shim ($BASE); set CELLHOST_BASE_PYTHON to the real executable" ;;
esac
BASE_VERSION="$("$BASE" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')"

WANT_STAMP="$( { printf 'base=%s %s\npip=%s\n' "$BASE" "$BASE_VERSION" "$PIP_VERSION"; cat "$REQS"; } | sha256sum | cut -d' ' -f1)"
PY="$VENV/bin/python"

venv_ok() { [[ -x "$PY" ]] && "$PY" -c 'import sys; sys.exit(sys.prefix == sys.base_prefix)' >/dev/null 2>&1; }

# Fast path, before taking the lock.
if venv_ok && [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT_STAMP" ]]; then
    printf '%s\n' "$PY"
    exit 0
fi

# ---- serialize concurrent runs (quickstart and tests may start together) ----
if command -v flock >/dev/null 2>&1; then
    LOCK="${TMPDIR:-/tmp}/cellhost-venv-$(printf '%s' "$ROOT" | sha256sum | cut -c1-16).lock"
    exec 9>"$LOCK"
    flock 9
    # Another run may have finished the job while we waited.
    if venv_ok && [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT_STAMP" ]]; then
        printf '%s\n' "$PY"
        exit 0
    fi
fi

# ---- create the venv when missing, broken or built from another base ------
venv_base() { sed -n 's/^base=\([^ ]*\) .*/\1/p' "$VENV/.cellhost-base" 2>/dev/null || true; }
if [[ -e "$VENV" ]] && { ! venv_ok || [[ "$(venv_base)" != "$BASE" ]]; }; then
    say "recreating $VENV (missing, broken, or made from another interpreter)"
    rm -rf -- "$VENV"
fi

if [[ ! -e "$VENV" ]]; then
    say "creating $VENV from $BASE (Python $BASE_VERSION)"
    LOG="$(mktemp "${TMPDIR:-/tmp}/cellhost-venv-create.XXXXXX")"
    if ! "$BASE" -m venv "$VENV" >/dev/null 2>"$LOG"; then
        # Debian without python3.11-venv has no ensurepip: make the venv
        # without pip, then let the system pip install pip into it.
        rm -rf -- "$VENV"
        if "$BASE" -m venv --without-pip "$VENV" >/dev/null 2>>"$LOG" \
            && "$BASE" -m pip --python "$PY" install -q "pip==$PIP_VERSION" 2>>"$LOG"; then
            say "bootstrapped pip into the venv with the system pip (no ensurepip)"
        else
            cat "$LOG" >&2
            rm -rf -- "$VENV" "$LOG"
            die "could not create a venv with $BASE; on Debian/Ubuntu: apt-get install python3.11-venv"
        fi
    fi
    rm -f -- "$LOG"
    printf 'base=%s %s\n' "$BASE" "$BASE_VERSION" >"$VENV/.cellhost-base"
fi

# ---- install the pinned packages --------------------------------------------
rm -f -- "$STAMP"
say "installing pinned packages from python/requirements.txt"
"$PY" -m pip install -q "pip==$PIP_VERSION" \
    || die "pip could not install pip==$PIP_VERSION into $VENV"
"$PY" -m pip install -q -r "$REQS" \
    || die "pip could not install python/requirements.txt into $VENV"

if ! check_out="$("$PY" -m pip check 2>&1)"; then
    printf '%s\n' "$check_out" >&2
    die "pip check found broken requirements in $VENV"
fi
"$PY" -c 'import numpy, pandas, matplotlib, palmerpenguins, nbformat, tqdm, ipykernel, jupyter_client, nbclient' \
    || die "the venv cannot import its pinned packages"

printf '%s\n' "$WANT_STAMP" >"$STAMP.tmp" && mv -f -- "$STAMP.tmp" "$STAMP"
say "ready: $PY"
printf '%s\n' "$PY"
