#!/usr/bin/env python3
"""The capability table of a scripts/vm-test.sh run, as Markdown on stdout.

Usage: scripts/vm-capabilities.py OUT ACCEL CPUS
OUT is the run's result directory (default of vm-test.sh:
/var/tmp/cellhost-vm/last): <who>.doctor.json (`cellhost doctor --json`),
<who>.rc (suite, exit status, seconds), <who>.<suite>.log and <who>.bench.md
for who = root and user. The rows: every sandbox layer doctor reports, every
`capability NAME: STATE: why` line of the cgroup-limits tests, each suite's
outcome and the W2/W2T p50 figures; a suite that did not run says so.
"""
import json, os, re, sys
out, accel, cpus = sys.argv[1], sys.argv[2], sys.argv[3]
def read(name):
    try:
        return open(os.path.join(out, name), errors="replace").read()
    except OSError:
        return None
def doctor(who):
    t = read(f"{who}.doctor.json")
    try:
        return json.loads(t) if t else {}
    except ValueError:
        return {}
def rcs(who):
    r = {}
    for line in (read(f"{who}.rc") or "").splitlines():
        p = line.split()
        if len(p) >= 2:
            r[p[0]] = (p[1], p[2] if len(p) > 2 else "")
    return r
def caps(who):
    c = {}
    # `capability NAME: STATE: why` (NAME may hold spaces: "whole-tree kill")
    for m in re.finditer(r"capability ([\w. -]+?): (.*)$", read(f"{who}.cgroup_limits.log") or "", re.M):
        c.setdefault(m.group(1), m.group(2).strip())
    return c
def suite(who, name):
    r = rcs(who).get(name)
    if r is None:
        return "not run"
    log = read(f"{who}.{name}.log") or ""
    m = re.findall(r"test result: \w+\. (\d+) passed; (\d+) failed; (\d+) ignored", log)
    counts = f" ({sum(int(x[0]) for x in m)} passed, {sum(int(x[1]) for x in m)} failed)" if m else ""
    return ("passed" if r[0] == "0" else f"FAILED rc={r[0]}") + counts + f", {r[1]}"
def bench(who):
    t = read(f"{who}.bench.md") or ""
    rows = []
    for line in t.splitlines():
        if line.startswith("| W2"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if len(cells) >= 4:
                rows.append(f"{cells[0].split(' ')[0]} {cells[1]}: {cells[3]}")
    return "; ".join(rows) or "not run"
who = ("root", "user")
d = {w: doctor(w) for w in who}
c = {w: caps(w) for w in who}
def layer(w, name):
    for l in d[w].get("layers", []):
        if l.get("name") == name:
            return ("enforced" if l.get("enforced") else "missing") + ": " + " ".join(str(l.get("detail", "")).split())
    return "-"
print(f"Guest: Debian 12, systemd, cgroup v2; qemu {accel}, {cpus} vCPU.\n")
print("| capability | root v2 | non-root v2 |")
print("| --- | --- | --- |")
names = []
for w in who:
    for l in d[w].get("layers", []):
        if l.get("name") not in names:
            names.append(l.get("name"))
for n in names:
    print(f"| layer `{n}` | {layer('root', n)} | {layer('user', n)} |")
cn = []
for w in who:
    for k in c[w]:
        if k not in cn:
            cn.append(k)
for n in cn:
    print(f"| test `{n}` | {c['root'].get(n, '-')} | {c['user'].get(n, '-')} |")
for n in ("cgroup_limits", "limits", "templates", "escape"):
    print(f"| suite {n} | {suite('root', n)} | {suite('user', n)} |")
print(f"| bench W2/W2T p50 | {bench('root')} | {bench('user')} |")
for w in who:
    for ch in d[w].get("checks", []):
        print(f"\ncheck {w}: {json.dumps(ch)}", end="")
print()
