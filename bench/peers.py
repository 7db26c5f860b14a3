"""Peer measurements for `cellhost bench`: ipykernel via jupyter_client,
nbclient, and a fresh `python -c` per cell. Prints one JSON object.

Usage: python peers.py WORKLOAD [ARGS...]
  w1 N            round trip of `x += 1`, N cells, ipykernel and python -c
  w2 N            spawn to first result, N kernels, ipykernel
  w3 MB           stdout throughput through iopub, MB megabytes
  w7 NOTEBOOK     wall time of nbclient executing NOTEBOOK
"""
import json
import subprocess
import sys
import time


def _km():
    from jupyter_client.manager import KernelManager
    km = KernelManager(kernel_name="python3")
    km.kernel_spec  # resolve now, not inside the timing
    return km


def _run(kc, code):
    reply = kc.execute_interactive(code, timeout=60, output_hook=lambda msg: None)
    if reply["content"]["status"] != "ok":
        raise RuntimeError(reply["content"])


def w1(n):
    km = _km()
    km.start_kernel()
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=60)
    _run(kc, "x = 0")
    for _ in range(20):
        _run(kc, "x += 1")
    lat = []
    for _ in range(n):
        t = time.perf_counter()
        _run(kc, "x += 1")
        lat.append((time.perf_counter() - t) * 1000)
    for _ in range(20):
        _run(kc, "%time x += 1")
    magic = []
    for _ in range(n):
        t = time.perf_counter()
        _run(kc, "%time x += 1")
        magic.append((time.perf_counter() - t) * 1000)
    kc.stop_channels()
    km.shutdown_kernel(now=True)
    pyc = []
    for _ in range(max(20, n // 20)):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", "x = 0\nx += 1"], check=True)
        pyc.append((time.perf_counter() - t) * 1000)
    return {"ipykernel_ms": lat, "ipykernel_magic_ms": magic, "python_c_ms": pyc}


def w2(n, code="1"):
    """Spawn to the first result of `code` (a cold kernel)."""
    out = []
    for _ in range(n):
        km = _km()
        t = time.perf_counter()
        km.start_kernel()
        kc = km.client()
        kc.start_channels()
        kc.wait_for_ready(timeout=60)
        _run(kc, code)
        out.append((time.perf_counter() - t) * 1000)
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    return {"ipykernel_ms": out}


def w3(mb, reps=1):
    """Throughput of `mb` MB of stdout through ipykernel's iopub, `reps` times."""
    km = _km()
    km.start_kernel()
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=60)
    chunks = mb
    code = "import sys\nchunk = ('x' * 99 + '\\n') * 10000\nfor _ in range(%d):\n    sys.stdout.write(chunk)\n    sys.stdout.flush()" % chunks
    got = [0]

    def hook(msg):
        if msg["msg_type"] == "stream":
            got[0] += len(msg["content"]["text"])

    mbps = []
    for _ in range(reps):
        got[0] = 0
        t = time.perf_counter()
        kc.execute_interactive(code, timeout=3600, output_hook=hook)
        secs = time.perf_counter() - t
        mbps.append(got[0] / 1e6 / secs)
    kc.stop_channels()
    km.shutdown_kernel(now=True)
    return {"mbps": mbps, "bytes": got[0]}


def w7(path, reps):
    import nbformat
    from nbclient import NotebookClient
    out = []
    for _ in range(reps):
        nb = nbformat.read(path, as_version=4)
        t = time.perf_counter()
        NotebookClient(nb, timeout=600, kernel_name="python3").execute()
        out.append((time.perf_counter() - t) * 1000)
    return {"nbclient_ms": out}


def main():
    which = sys.argv[1]
    if which == "w1":
        res = w1(int(sys.argv[2]))
    elif which == "w2":
        res = w2(int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "1")
    elif which == "w3":
        res = w3(int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 1)
    elif which == "w7":
        res = w7(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 3)
    else:
        raise SystemExit("unknown workload %r" % which)
    json.dump(res, sys.stdout)


if __name__ == "__main__":
    main()
