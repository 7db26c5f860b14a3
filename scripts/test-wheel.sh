#!/usr/bin/env bash
# Builds the wheel (scripts/build-wheel.sh, dev profile unless
# CELLHOST_WHEEL_PROFILE says otherwise), installs it into a fresh venv
# under /var/tmp with pytest and the frameworks of
# python/cellhost_sdk/tests/requirements.txt, and runs python/cellhost_sdk/tests against it.
# CELLHOST_TEST_PYTHON is the kernels' interpreter. Extra arguments go to pytest.
set -euo pipefail
ROOT="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)"
export CELLHOST_WHEEL_PROFILE="${CELLHOST_WHEEL_PROFILE:-dev}"
OUT="$(mktemp -d "${TMPDIR:-/var/tmp}/cellhost-wheel.XXXXXX")"
VENV="$OUT/venv"
trap 'rm -rf -- "$OUT"' EXIT
WHEEL="$(bash "$ROOT/scripts/build-wheel.sh" "$OUT")"
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --no-deps --no-index "$WHEEL"
# pytest and the agent frameworks the adapters are tested against (pinned).
"$VENV/bin/pip" install -q -r "$ROOT/python/cellhost_sdk/tests/requirements.txt"
# Run from outside the source tree: the tests import the installed package.
cd "$OUT"
unset CELLHOST_BIN
status=0
"$VENV/bin/python" -m pytest -q -s "$ROOT/python/cellhost_sdk/tests" "$@" || status=$?
# LangChain's MCP adapter needs mcp < 2 (pydantic-ai's toolset needs 2): its own venv.
if [[ $# == 0 ]]; then
    python3 -m venv "$OUT/venv-lc"
    "$OUT/venv-lc/bin/pip" install -q --no-deps --no-index "$WHEEL"
    "$OUT/venv-lc/bin/pip" install -q -r "$ROOT/python/cellhost_sdk/tests/requirements-langchain-mcp.txt"
    "$OUT/venv-lc/bin/python" -m pytest -q "$ROOT/python/cellhost_sdk/tests/test_mcp_clients.py" -k langchain || status=$?
fi
exit "$status"
