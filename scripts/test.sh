#!/usr/bin/env bash
# Run all of cellhost's tests: set up the Python venv, check that the worker
# package compiles, then `cargo test` over the whole workspace with the venv's
# python as the kernels' interpreter (CELLHOST_TEST_PYTHON).
#
# Extra arguments go to `cargo test`, e.g. `scripts/test.sh -p cellhost-kernel`.
# The exit code is cargo's (or the first failing step's).
set -euo pipefail

ROOT="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)"
cd "$ROOT"

PYCACHE=""
SLURM_UP=0
cleanup() {
    [[ -z "$PYCACHE" ]] || rm -rf -- "$PYCACHE"
    if [[ "$SLURM_UP" == 1 ]]; then
        bash "$ROOT/scripts/slurm-cluster.sh" down </dev/null || true
    fi
}
trap cleanup EXIT

say() { printf '\n==> %s\n' "$*" >&2; }

say "Python environment (.venv)"
PY="$(bash "$ROOT/scripts/setup-venv.sh")"
[[ -x "$PY" ]] || { echo "test: setup-venv.sh did not produce a python ($PY)" >&2; exit 1; }

shopt -s nullglob
WORKER_FILES=("$ROOT"/python/cellhost_worker/*.py)
shopt -u nullglob
if ((${#WORKER_FILES[@]})); then
    say "py_compile python/cellhost_worker (${#WORKER_FILES[@]} files)"
    # Byte-code goes to a scratch dir, not into the source tree.
    PYCACHE="$(mktemp -d "${TMPDIR:-/tmp}/cellhost-pycache.XXXXXX")"
    PYTHONPYCACHEPREFIX="$PYCACHE" "$PY" -m py_compile "${WORKER_FILES[@]}"
fi

# HK29 runs matplotlib once with DISPLAY pointing at a live X server.
if ! command -v Xvfb >/dev/null 2>&1 && [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
    say "apt-get install xvfb (for the DISPLAY half of hk29)"
    export DEBIAN_FRONTEND=noninteractive
    { apt-get install -y -qq xvfb >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq xvfb >/dev/null; }; } \
        || echo "test: xvfb could not be installed; hk29 runs its DISPLAY half against an unreachable display" >&2
fi

# The MCP Inspector's CLI (npm) as a client of `cellhost mcp`
# (crates/mcp/tests/inspector_cli.rs): installed once under /var/tmp.
if command -v npm >/dev/null 2>&1 && [[ -z "${CELLHOST_TEST_NPM_DIR:-}" ]]; then
    NPM_DIR="${TMPDIR:-/var/tmp}/cellhost-test-npm"
    if [[ ! -d "$NPM_DIR/node_modules/@modelcontextprotocol/inspector" ]]; then
        say "npm install @modelcontextprotocol/inspector@2.12.0 ($NPM_DIR)"
        mkdir -p "$NPM_DIR"
        (cd "$NPM_DIR" && npm install --no-audit --no-fund --silent @modelcontextprotocol/inspector@2.12.0) \
            || echo "test: the MCP Inspector could not be installed; its test is skipped" >&2
    fi
    export CELLHOST_TEST_NPM_DIR="$NPM_DIR"
fi

# The R kernel tests (crates/kernel/tests/r_kernel.rs) need R with jsonlite,
# plus lattice and ggplot2 for the plot cases; they skip, saying why, only
# where R cannot be installed.
if ! command -v R >/dev/null 2>&1 || ! R --no-echo -e 'quit(status = !requireNamespace("jsonlite", quietly = TRUE))' >/dev/null 2>&1; then
    if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
        say "apt-get install r-base-core r-cran-jsonlite (for the R kernel tests)"
        export DEBIAN_FRONTEND=noninteractive
        R_PKGS=(r-base-core r-cran-jsonlite r-cran-lattice r-cran-ggplot2)
        { apt-get install -y -qq "${R_PKGS[@]}" >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq "${R_PKGS[@]}" >/dev/null; }; } \
            || echo "test: R could not be installed; the R kernel tests are skipped" >&2
    else
        echo "test: R (with jsonlite) is missing and cannot be installed here; the R kernel tests are skipped" >&2
    fi
fi

# The SSH placement tests (crates/placement/tests/ssh.rs) start a loopback
# sshd of their own; they skip, saying why, without openssh-server.
if [[ ! -x /usr/sbin/sshd ]] && [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
    say "apt-get install openssh-server openssh-client (for the SSH placement tests)"
    export DEBIAN_FRONTEND=noninteractive
    { apt-get install -y -qq --no-install-recommends openssh-server openssh-client </dev/null >/dev/null 2>&1 \
        || { apt-get update -qq && apt-get install -y -qq --no-install-recommends openssh-server openssh-client </dev/null >/dev/null; }; } \
        || echo "test: openssh-server could not be installed; the SSH placement tests are skipped" >&2
fi

# The Slurm placement tests (crates/placement/tests/slurm.rs) run against a
# one-node cluster on this machine (root only: slurmd starts jobs as their
# users; about a second once the packages are installed); they skip, saying
# why, without it. A cluster this script started goes down when it ends.
if [[ "$(id -u)" == 0 ]] && [[ -z "${CELLHOST_TEST_NO_SLURM:-}" ]]; then
    say "one-node Slurm cluster (scripts/slurm-cluster.sh up)"
    if bash "$ROOT/scripts/slurm-cluster.sh" status >/dev/null 2>&1; then
        echo "test: the Slurm test cluster was already up; it stays up" >&2
    elif bash "$ROOT/scripts/slurm-cluster.sh" up </dev/null; then
        SLURM_UP=1
    else
        echo "test: the Slurm test cluster did not come up; the Slurm placement tests are skipped" >&2
        bash "$ROOT/scripts/slurm-cluster.sh" down </dev/null || true
    fi
fi

say "cargo test --workspace --all-targets (CELLHOST_TEST_PYTHON=$PY)"
LOCKED=()
[[ -f "$ROOT/Cargo.lock" ]] && LOCKED=(--locked)
status=0
CELLHOST_TEST_PYTHON="$PY" cargo test "${LOCKED[@]}" --workspace --all-targets "$@" || status=$?

# The Python package: the wheel installed into a fresh venv, pytest against it.
if [[ "$status" == 0 && $# == 0 ]]; then
    say "cellhost wheel in a fresh venv (scripts/test-wheel.sh)"
    CELLHOST_TEST_PYTHON="$PY" bash "$ROOT/scripts/test-wheel.sh" || status=$?
fi

# The TypeScript client against a real `serve` (skipped, saying why, without npm).
if [[ "$status" == 0 && $# == 0 ]]; then
    say "TypeScript client (scripts/test-ts.sh)"
    CELLHOST_TEST_PYTHON="$PY" bash "$ROOT/scripts/test-ts.sh" || status=$?
fi

# The escape suite again as an unprivileged user: every sandbox guarantee
# must hold for root and non-root alike (root only: it switches users).
if [[ "$status" == 0 && "$(id -u)" == 0 && $# == 0 ]]; then
    say "escape suite as a non-root user (scripts/escape-nonroot.sh)"
    bash "$ROOT/scripts/escape-nonroot.sh" || status=$?
fi
exit "$status"
