#!/bin/bash
# Remote-kernel figures of BENCHMARKS.md: for a placement (local, lo =
# loopback agent, slurm = the test cluster of scripts/slurm-cluster.sh up),
# the p50 of a one-shot `cellhost exec` (request to first result, n=5) and of
# 30 daemon round trips of a trivial cell, through the CLI; for a remote
# placement also the kernel's start split into queue wait, agent start and
# handshake (kernel.placement.start of `exec --json`).
#   CELLHOST=target/release/cellhost scripts/remote-figures.sh local lo slurm
set -euo pipefail
: "${CELLHOST:=$(pwd)/target/release/cellhost}"
CELLHOST=$(readlink -f "$CELLHOST"); export CELLHOST
export PY=${CELLHOST_PYTHON:-$(pwd)/.venv/bin/python}
for P in "$@"; do
 D=${CELLHOST_BENCH_DIR:-/var/tmp/cellhost-remote-bench}/$P; rm -rf $D; mkdir -p $D/spool $D/run; chmod 700 $D $D/spool $D/run
cat > $D/config.toml <<CFG
[placement]
default = "$P"
[placement.slurm]
kind = "slurm"
agent = "$CELLHOST"
spool_dir = "$D/spool"
slurm_conf = "/var/tmp/cellhost-slurm/slurm.conf"
[placement.lo]
kind = "loopback"
program = "$CELLHOST"
CFG
export CELLHOST_CONFIG=$D/config.toml CELLHOST_STATE_DIR=$D/state XDG_RUNTIME_DIR=$D/run
cd "$D"
python3 - "$P" <<'PYEOF'
import os, subprocess, sys, time, statistics
P=sys.argv[1]; PY=os.environ["PY"]; B=os.environ["CELLHOST"]
import json
first=[]; split={}
for i in range(5):
    t=time.monotonic(); o=subprocess.run([B,"exec","--json","--python",PY,"1"],capture_output=True); first.append((time.monotonic()-t)*1000)
    assert o.returncode==0, o.stderr
    start=(json.loads(o.stdout).get("kernel",{}).get("placement") or {}).get("start") or {}
    for k,v in start.items(): split.setdefault(k,[]).append(v)
subprocess.run([B,"exec","--python",PY,"--session","s","x=0"],capture_output=True,check=True)
rt=[]
for i in range(30):
    t=time.monotonic(); o=subprocess.run([B,"exec","--python",PY,"--session","s","x += 1"],capture_output=True); rt.append((time.monotonic()-t)*1000)
    assert o.returncode==0, o.stderr
subprocess.run([B,"daemon","stop"],capture_output=True)
print(f"{P}: one-shot exec p50 {statistics.median(first):.0f} ms (n=5); daemon exec round trip p50 {statistics.median(rt):.1f} ms (n=30)")
if split:
    # The kernel's start as KernelInfo.placement.start splits it (p50, ms).
    print(f"{P}: kernel start p50 (n=5): " + ", ".join(f"{k[:-3]} {statistics.median(v):.0f} ms" for k,v in split.items()))
PYEOF
done
