"""cellhost R kernel vs IRkernel (jupyter_client): spawn to first result and
round trip of a trivial cell, same run."""
import json, statistics, subprocess, sys, time
import jupyter_client

CELLHOST = sys.argv[1]
N = 20

def irkernel():
    t0 = time.perf_counter()
    km, kc = jupyter_client.manager.start_new_kernel(kernel_name="ir")
    kc.execute_interactive("1+1", timeout=60, output_hook=lambda m: None)
    spawn = time.perf_counter() - t0
    rts = []
    for _ in range(N):
        t = time.perf_counter()
        kc.execute_interactive("1+1", timeout=60, output_hook=lambda m: None)
        rts.append(time.perf_counter() - t)
    kc.stop_channels(); km.shutdown_kernel(now=True)
    return spawn, statistics.median(rts)

def cellhost():
    p = subprocess.Popen([CELLHOST, "repl", "--language", "r", "--sandbox", "off"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)
    return p

def cellhost_exec():
    # spawn to first result: one-shot exec (start, one cell, exit)
    t = time.perf_counter()
    subprocess.run([CELLHOST, "exec", "--language", "r", "--sandbox", "off", "1+1"], check=True, capture_output=True)
    return time.perf_counter() - t

if __name__ == "__main__":
    ir = [irkernel() for _ in range(3)]
    ch = [cellhost_exec() for _ in range(3)]
    print(json.dumps({
        "irkernel_spawn_to_first_result_s": statistics.median(s for s, _ in ir),
        "irkernel_round_trip_ms": 1000 * statistics.median(r for _, r in ir),
        "cellhost_exec_spawn_to_first_result_s": statistics.median(ch),
    }, indent=1))
