#!/usr/bin/env bash
# Process checkpoints (CRIU) of a kernel holding ~100 MB of numpy data,
# through `cellhost serve`'s HTTP API: checkpoint on request (dump, left
# running), pause (dump + stop: memory freed) and resume (restore + cell).
# Needs root, curl, python3 and a CRIU whose `criu check` passes
# (scripts/criu-build.sh).
#
# Usage: scripts/process-checkpoint-bench.sh [PYTHON] [SAMPLES]
#   PYTHON: an interpreter with numpy (default .venv/bin/python)
#   SAMPLES: rounds (default 3)
set -euo pipefail
ROOT="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)"
PY="${1:-$ROOT/.venv/bin/python}"
N="${2:-3}"
BIN="${CELLHOST_BIN:-$ROOT/target/debug/cellhost}"
DIR="$(mktemp -d "${TMPDIR:-/var/tmp}/cellhost-criu-bench.XXXXXX")"
echo "pool_size = 0" >"$DIR/config.toml"
CELLHOST_STATE_DIR="$DIR/state" CELLHOST_CONFIG="$DIR/config.toml" \
    "$BIN" serve --listen 127.0.0.1:0 --python "$PY" --sandbox off 2>"$DIR/serve.log" &
SERVE=$!
cleanup() {
    kill -TERM "$SERVE" 2>/dev/null || true
    wait "$SERVE" 2>/dev/null || true
    rm -rf "$DIR"
}
trap cleanup EXIT
until grep -q "serving http://" "$DIR/serve.log"; do
    kill -0 "$SERVE" 2>/dev/null || { cat "$DIR/serve.log" >&2; exit 1; }
    sleep 0.2
done
URL="$(grep -o 'serving http://[^/ ]*' "$DIR/serve.log" | head -1 | sed 's/serving //')"
TOKEN="$(awk '/^local /{print $2}' "$DIR/state/server/tokens")"
call() { curl -sf -X "$1" -H "Authorization: Bearer $TOKEN" -H 'Content-Type: application/json' ${3:+-d "$3"} "$URL$2"; }
field() { python3 -c "import json,sys; v=json.load(sys.stdin); print($1)"; }

for i in $(seq 1 "$N"); do
    s="ck$i"
    call POST /v1/sessions "{\"name\":\"$s\",\"checkpoint\":\"process\"}" >/dev/null
    call POST "/v1/sessions/$s/execute" \
        '{"code":"import numpy as np\na = np.random.rand(100 * 1024 * 1024 // 8)\ns = float(a.sum())"}' >/dev/null
    ck=$(call POST "/v1/sessions/$s/checkpoint")
    p=$(call POST "/v1/sessions/$s/pause")
    t0=$(date +%s%N)
    r=$(call POST "/v1/sessions/$s/execute" '{"code":"float(a.sum()) == s"}')
    t1=$(date +%s%N)
    echo "round $i:" \
        "checkpoint $(echo "$ck" | field "v['write_ms']") ms ($(echo "$ck" | field "v['bytes'] >> 20") MiB image);" \
        "pause $(echo "$p" | field "v['pause_ms']") ms, $(echo "$p" | field "v['memory_freed_bytes'] >> 20") MiB RSS freed;" \
        "restore $(echo "$r" | field "v['restored']['restore_ms']") ms;" \
        "resume cell $(( (t1 - t0) / 1000000 )) ms wall (result $(echo "$r" | field "v['result']['text/plain']"))"
    call DELETE "/v1/sessions/$s" >/dev/null || true
done
