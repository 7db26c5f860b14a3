#!/usr/bin/env bash
# Quick start: set up the Python venv, build cellhost, and run the example
# analysis notebook (examples/penguins.ipynb) end to end in a cellhost kernel.
#
# Leaves examples/penguins.executed.ipynb and the figures it produced as PNG
# files, and prints where they are.
set -euo pipefail

ROOT="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)"
cd "$ROOT"

say() { printf '\n==> %s\n' "$*" >&2; }
die() { printf 'quickstart: error: %s\n' "$*" >&2; exit 1; }

command -v cargo >/dev/null 2>&1 || die "cargo not found; install a Rust toolchain (https://rustup.rs)"

say "Python environment (.venv)"
PY="$(bash "$ROOT/scripts/setup-venv.sh")"
[[ -x "$PY" ]] || die "setup-venv.sh did not produce a python ($PY)"

say "Building cellhost (release)"
LOCKED=()
[[ -f "$ROOT/Cargo.lock" ]] && LOCKED=(--locked)
cargo build --release "${LOCKED[@]}" -p cellhost

BIN="${CARGO_TARGET_DIR:-$ROOT/target}/release/cellhost"
[[ -x "$BIN" ]] || die "build finished but $BIN is missing"

INPUT="$ROOT/examples/penguins.ipynb"
OUTPUT="$ROOT/examples/penguins.executed.ipynb"
[[ -f "$INPUT" ]] || die "missing $INPUT"

say "Running examples/penguins.ipynb"
# Files newer than this marker were written by the run below.
MARKER="$(mktemp "${TMPDIR:-/tmp}/cellhost-quickstart.XXXXXX")"
trap 'rm -f -- "$MARKER"' EXIT
sleep 1 # make "newer than the marker" unambiguous on coarse-mtime filesystems

"$BIN" run "$INPUT" --python "$PY"

[[ -f "$OUTPUT" && "$OUTPUT" -nt "$MARKER" ]] \
    || die "cellhost run finished but did not write $OUTPUT"

# Figure files: PNGs written during the run under examples/, plus any PNG path
# the executed notebook's outputs point at (wherever the session keeps them).
FIGURES="$(
    {
        find "$ROOT/examples" -type f -name '*.png' -newer "$MARKER" 2>/dev/null
        "$PY" - "$OUTPUT" <<'PY'
import json, os, sys

def walk(value):
    if isinstance(value, dict):
        for v in value.values():
            yield from walk(v)
    elif isinstance(value, list):
        for v in value:
            yield from walk(v)
    elif isinstance(value, str) and value.lower().endswith(".png") and len(value) < 4096:
        yield value

nb_path = sys.argv[1]
with open(nb_path, encoding="utf-8") as f:
    nb = json.load(f)
for cell in nb.get("cells", []):
    for out in cell.get("outputs", []):
        for p in walk(out.get("metadata", {})):
            p = p if os.path.isabs(p) else os.path.join(os.path.dirname(nb_path), p)
            if os.path.isfile(p):
                print(os.path.realpath(p))
PY
    } | sort -u
)"

PNG_OUTPUTS="$("$PY" - "$OUTPUT" <<'PY'
import json, sys
nb = json.load(open(sys.argv[1], encoding="utf-8"))
print(sum("image/png" in o.get("data", {})
          for c in nb.get("cells", []) for o in c.get("outputs", [])))
PY
)"

printf '\nExecuted notebook: %s\n' "$OUTPUT"
if [[ -n "$FIGURES" ]]; then
    printf 'Figures:\n'
    while IFS= read -r fig; do
        printf '  %s (%s bytes)\n' "$fig" "$(stat -c %s -- "$fig")"
    done <<<"$FIGURES"
else
    printf 'Figures: no PNG files found on disk (%s embedded in the notebook)\n' "$PNG_OUTPUTS"
fi
