#!/usr/bin/env bash
# curl against a running `cellhost serve`: create, execute, stream,
# interrupt and auth failures. Needs CELLHOST_URL (default
# http://127.0.0.1:8787) and CELLHOST_TOKEN (a read-write token).
set -euo pipefail
URL="${CELLHOST_URL:-http://127.0.0.1:8787}"
TOKEN="${CELLHOST_TOKEN:?set CELLHOST_TOKEN to a read-write token}"
AUTH=(-H "Authorization: Bearer $TOKEN")
S="smoke-$$"
fail() { echo "curl smoke: FAIL: $*" >&2; exit 1; }

# 401 without and with a wrong token.
code=$(curl -s -o /dev/null -w '%{http_code}' "$URL/v1/sessions")
[ "$code" = 401 ] || fail "no token: expected 401, got $code"
code=$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer wrong-token-000000000" "$URL/v1/sessions")
[ "$code" = 401 ] || fail "wrong token: expected 401, got $code"

# Create.
out=$(curl -sf "${AUTH[@]}" -H 'Content-Type: application/json' -d "{\"name\":\"$S\"}" "$URL/v1/sessions")
echo "$out" | grep -q '"alive":true' || fail "create: $out"

# Execute (state kept across calls).
out=$(curl -sf "${AUTH[@]}" -H 'Content-Type: application/json' -d '{"code":"x = 20"}' "$URL/v1/sessions/$S/execute")
echo "$out" | grep -q '"status":"ok"' || fail "execute: $out"
out=$(curl -sf "${AUTH[@]}" -H 'Content-Type: application/json' -d '{"code":"x + 22"}' "$URL/v1/sessions/$S/execute")
echo "$out" | grep -q '"text/plain":"42"' || fail "execute state: $out"

# Stream (server-sent events).
out=$(curl -sfN "${AUTH[@]}" -H 'Content-Type: application/json' -H 'Accept: text/event-stream' \
  -d '{"code":"for i in range(3): print(\"line\", i, flush=True)"}' "$URL/v1/sessions/$S/execute")
echo "$out" | grep -q '^event: stream' || fail "stream: no stream event: $out"
echo "$out" | grep -q '^event: result' || fail "stream: no result event: $out"
echo "$out" | grep -q 'line 2' || fail "stream: output missing: $out"

# Interrupt a sleeping cell; the variable survives.
curl -s "${AUTH[@]}" -H 'Content-Type: application/json' -d '{"code":"import time; time.sleep(60)"}' \
  "$URL/v1/sessions/$S/execute" >"${TMPDIR:-/tmp}/curl-smoke-$$.json" &
pid=$!
for _ in $(seq 100); do
  busy=$(curl -sf "${AUTH[@]}" "$URL/v1/sessions" | grep -o '"busy":true' || true)
  [ -n "$busy" ] && break
  sleep 0.05
done
sleep 0.2
out=$(curl -sf "${AUTH[@]}" -X POST "$URL/v1/sessions/$S/interrupt")
echo "$out" | grep -q '"delivered":true' || fail "interrupt: $out"
wait "$pid"
out=$(cat "${TMPDIR:-/tmp}/curl-smoke-$$.json"); rm -f "${TMPDIR:-/tmp}/curl-smoke-$$.json"
echo "$out" | grep -q '"status":"interrupted"' || fail "interrupted cell: $out"
out=$(curl -sf "${AUTH[@]}" -H 'Content-Type: application/json' -d '{"code":"x"}' "$URL/v1/sessions/$S/execute")
echo "$out" | grep -q '"text/plain":"20"' || fail "state after interrupt: $out"

# Delete.
code=$(curl -s -o /dev/null -w '%{http_code}' "${AUTH[@]}" -X DELETE "$URL/v1/sessions/$S")
[ "$code" = 204 ] || fail "delete: expected 204, got $code"
echo "curl smoke: all passed"
