"""PYSDK: a trivial cell (`1`) through cellhost's Python API
(`Session.run`) and through a raw HTTP request (urllib, a new connection
each, as `Session.run` makes) to the same `cellhost serve`, interleaved so
both see the same machine load. Prints {"api": [ms...], "raw": [ms...]}.

argv: N (samples). The `cellhost` package comes from PYTHONPATH (the
source tree) or the environment; the binary from CELLHOST_BIN; the
kernels' interpreter is this one.
"""

import json
import sys
import time
import urllib.request

from cellhost import Session

n = int(sys.argv[1])
with Session(python=sys.executable, name="bench") as s:
    host = s._host
    body = json.dumps({"code": "1"}).encode()

    def raw():
        req = urllib.request.Request(host.base + "/v1/sessions/bench/execute", data=body, method="POST")
        req.add_header("Authorization", f"Bearer {host.token}")
        req.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(req) as r:
            answer = json.loads(r.read())
        if answer.get("status") != "ok":
            raise SystemExit(f"raw execute: {answer}")

    for _ in range(10):
        raw()
        s.run("1")
    api, raws = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        raw()
        t1 = time.perf_counter()
        r = s.run("1")
        t2 = time.perf_counter()
        if r.status != "ok":
            raise SystemExit(f"Session.run: {r.text}")
        raws.append((t1 - t0) * 1000)
        api.append((t2 - t1) * 1000)
print(json.dumps({"api": api, "raw": raws}))
