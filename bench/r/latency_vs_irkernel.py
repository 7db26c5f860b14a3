"""cellhost's R kernel against IRkernel (driven by jupyter_client), same run:
spawn to first result and the round trip of a trivial cell; and what a
template (fork server) for R would save: R's own start with and without
preloaded packages against a fork of an R that has them loaded.

Usage: python latency_vs_irkernel.py CELLHOST [--n 30] [--spawns 5] [--r R]

* spawn to first result: IRkernel `start_new_kernel` + `1+1`; cellhost
  `cellhost exec --language r 1+1` (a whole CLI process: start, sandbox,
  one cell, exit), sandbox off and auto.
* round trip: `x <- x + 1`, median and p99 of N; IRkernel through
  jupyter_client's blocking client, cellhost through `cellhost serve`'s
  HTTP API (one keep-alive connection, `POST /v1/sessions/NAME/execute`).
* template: `R -e` of `1+1` bare and after loading dplyr, ggplot2 and
  data.table; in one R with those loaded, `parallel::mcparallel(1+1)` +
  `mccollect` (fork, evaluate, collect).

Prints one JSON object.
"""
import argparse
import http.client
import json
import os
import secrets
import socket
import statistics
import subprocess
import tempfile
import time

import jupyter_client

PACKAGES = ["dplyr", "ggplot2", "data.table"]


def p99(xs):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(0.99 * (len(xs) - 1))))]


def stats_ms(xs):
    return {"median_ms": round(1000 * statistics.median(xs), 2), "p99_ms": round(1000 * p99(xs), 2), "n": len(xs)}


def irkernel(n, spawns):
    spawn, rts = [], []
    for i in range(spawns):
        t0 = time.perf_counter()
        km, kc = jupyter_client.manager.start_new_kernel(kernel_name="ir")
        kc.execute_interactive("1+1", timeout=60, output_hook=lambda m: None)
        spawn.append(time.perf_counter() - t0)
        if i == 0:
            kc.execute_interactive("x <- 0", timeout=60, output_hook=lambda m: None)
            for _ in range(n):
                t = time.perf_counter()
                kc.execute_interactive("x <- x + 1", timeout=60, output_hook=lambda m: None)
                rts.append(time.perf_counter() - t)
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    return spawn, rts


def cellhost_spawn(cellhost, r, sandbox, spawns, env):
    out = []
    for _ in range(spawns):
        t = time.perf_counter()
        subprocess.run([cellhost, "exec", "--language", "r", "--r", r, "--sandbox", sandbox, "1+1"],
                       check=True, capture_output=True, env=env)
        out.append(time.perf_counter() - t)
    return out


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cellhost_round_trip(cellhost, r, n, state, env):
    token = secrets.token_hex(16)
    tokens = os.path.join(state, "tokens")
    with open(tokens, "w") as fh:
        fh.write("bench %s rw\n" % token)
    os.chmod(tokens, 0o600)
    port = free_port()
    srv = subprocess.Popen([cellhost, "serve", "--listen", "127.0.0.1:%d" % port, "--token-file", tokens,
                            "--r", r], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        conn = None
        for _ in range(600):
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
                conn.request("GET", "/openapi.json")
                conn.getresponse().read()
                break
            except OSError:
                conn = None
                time.sleep(0.05)
        if conn is None:
            raise RuntimeError("cellhost serve did not come up")
        head = {"Authorization": "Bearer " + token, "Content-Type": "application/json"}

        def post(path, body):
            conn.request("POST", path, json.dumps(body), head)
            resp = conn.getresponse()
            data = resp.read()
            if resp.status >= 300:
                raise RuntimeError("%s: %d %s" % (path, resp.status, data[:300]))
            return json.loads(data) if data else None

        post("/v1/sessions", {"name": "rt", "language": "r"})
        post("/v1/sessions/rt/execute", {"code": "x <- 0"})
        rts = []
        for _ in range(n):
            t = time.perf_counter()
            v = post("/v1/sessions/rt/execute", {"code": "x <- x + 1"})
            rts.append(time.perf_counter() - t)
            if v.get("status") != "ok":
                raise RuntimeError(v)
        return rts
    finally:
        srv.terminate()
        srv.wait()


def r_start(r, preload, spawns):
    lib = "suppressMessages({%s}); " % "; ".join("library(%s)" % p for p in PACKAGES) if preload else ""
    out = []
    for _ in range(spawns):
        t = time.perf_counter()
        subprocess.run([r, "--no-echo", "--no-restore", "-e", lib + "cat(1+1)"], check=True, capture_output=True)
        out.append(time.perf_counter() - t)
    return out


def r_fork(r, spawns):
    code = (
        "suppressMessages({%s}); ts <- numeric(0); "
        "for (i in seq_len(%d)) { t <- proc.time()[[3]]; j <- parallel::mcparallel(1+1); "
        "v <- parallel::mccollect(j); ts <- c(ts, proc.time()[[3]] - t) }; cat(ts)"
    ) % ("; ".join("library(%s)" % p for p in PACKAGES), spawns)
    out = subprocess.run([r, "--no-echo", "--no-restore", "-e", code], check=True, capture_output=True, text=True)
    return [float(x) for x in out.stdout.split()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cellhost")
    ap.add_argument("--n", type=int, default=30, help="round trips")
    ap.add_argument("--spawns", type=int, default=5, help="kernels started per system")
    ap.add_argument("--r", default="/usr/bin/R")
    args = ap.parse_args()
    cellhost = os.path.abspath(args.cellhost)
    with tempfile.TemporaryDirectory(prefix="cellhost-r-bench-") as state:
        env = dict(os.environ, CELLHOST_STATE_DIR=state)
        ir_spawn, ir_rt = irkernel(args.n, args.spawns)
        ch_spawn_off = cellhost_spawn(cellhost, args.r, "off", args.spawns, env)
        ch_spawn_auto = cellhost_spawn(cellhost, args.r, "auto", args.spawns, env)
        ch_rt = cellhost_round_trip(cellhost, args.r, args.n, state, env)
    report = {
        "spawn_to_first_result": {
            "irkernel + jupyter_client": stats_ms(ir_spawn),
            "cellhost exec --language r (sandbox off)": stats_ms(ch_spawn_off),
            "cellhost exec --language r (sandbox auto)": stats_ms(ch_spawn_auto),
        },
        "round_trip_x_plus_1": {
            "irkernel + jupyter_client": stats_ms(ir_rt),
            "cellhost serve (HTTP)": stats_ms(ch_rt),
        },
        "template_estimate": {
            "R start, 1+1": stats_ms(r_start(args.r, False, args.spawns)),
            "R start, %s loaded, 1+1" % "+".join(PACKAGES): stats_ms(r_start(args.r, True, args.spawns)),
            "fork of an R with them loaded (mcparallel + mccollect)": stats_ms(r_fork(args.r, max(10, args.spawns))),
        },
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
