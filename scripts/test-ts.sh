#!/usr/bin/env bash
# The TypeScript client (clients/typescript): `npm ci` from its lockfile,
# `tsc`, then its tests (`node --test`) against a real `cellhost serve` they
# start, including the check that src/schema.ts is what openapi-typescript
# generates from the served OpenAPI document.
#
# CELLHOST_BIN is the binary (default target/debug/cellhost, built when
# missing); CELLHOST_TEST_PYTHON the kernels' interpreter (numpy,
# matplotlib). Without Node 18+ and npm (and no way to install them: root
# with apt-get) it prints why and exits 0: the tests are skipped, not failed.
set -euo pipefail
ROOT="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)"
node_ok() {
    command -v npm >/dev/null 2>&1 && command -v node >/dev/null 2>&1 \
        && node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 18 ? 0 : 1)'
}
if ! node_ok && [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
    echo "test-ts: apt-get install nodejs npm" >&2
    export DEBIAN_FRONTEND=noninteractive
    { apt-get install -y -qq nodejs npm >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq nodejs npm >/dev/null; }; } || true
fi
if ! node_ok; then
    echo "test-ts: skipped: Node.js 18+ with npm is missing and cannot be installed here (root with apt-get installs it)" >&2
    exit 0
fi
if [[ -z "${CELLHOST_BIN:-}" ]]; then
    CELLHOST_BIN="$ROOT/target/debug/cellhost"
    [[ -x "$CELLHOST_BIN" ]] || (cd "$ROOT" && cargo build -p cellhost >&2)
fi
export CELLHOST_BIN
cd "$ROOT/clients/typescript"
npm ci --no-audit --no-fund --silent
npm test "$@"
