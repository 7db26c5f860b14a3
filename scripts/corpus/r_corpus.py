#!/usr/bin/env python3
"""Runs R notebooks nobody here wrote under `cellhost run` and under
nbclient + IRkernel in the same run, and compares them cell by cell
(status, normalised stdout, image count, text/plain of the result), with
the wall time of each.

The inputs:

* IRkernel's example notebooks (``example-notebooks/*.ipynb`` of
  github.com/IRkernel/IRkernel, MIT), read from a checkout or a bare git
  directory given with ``--irkernel`` (outputs cleared first);
* the R code of vignettes shipped inside installed R packages (the
  ``doc/*.R`` files ``R CMD build`` extracts with knitr's purl or Sweave's
  Stangle), one notebook per vignette, split into cells at the chunk
  markers (``## ----`` and ``### code chunk number``). The list is fixed
  (``VIGNETTES``); a vignette whose package is not installed is left out
  and said so.

Usage (figures for the record, not a test):

    scripts/corpus/r_corpus.py --python .venv/bin/python --cellhost target/debug/cellhost \\
        --irkernel /path/to/IRkernel

Needs nbclient and nbformat in the venv, IRkernel (Debian: r-cran-irkernel)
registered as the ``ir`` kernel, and R with jsonlite. Writes
``<work>/report.json`` and prints a summary; ``--show N`` lists the first N
differing cells.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from corpus import norm  # noqa: E402  (the same normalisation as the Python corpus)

# (package, vignette script): package vignettes that run offline in seconds.
VIGNETTES = [
    ("dplyr", "dplyr.R"),
    ("dplyr", "grouping.R"),
    ("dplyr", "window-functions.R"),
    ("tidyr", "tidy-data.R"),
    ("tidyr", "pivot.R"),
    ("tibble", "tibble.R"),
    ("stringr", "stringr.R"),
    ("forcats", "forcats.R"),
    ("lubridate", "lubridate.R"),
    ("data.table", "datatable-intro.R"),
    ("data.table", "datatable-reference-semantics.R"),
    ("ggplot2", "ggplot2-specs.R"),
    ("Matrix", "Introduction.R"),
    ("Matrix", "Intro2Matrix.R"),
    ("rpart", "longintro.R"),
    ("survival", "survival.R"),
    ("zoo", "zoo-quickref.R"),
    ("colorspace", "hcl-colors.R"),
]

IRKERNEL_NOTEBOOKS = ["Demo.ipynb", "Display.ipynb", "Comm_Demo.ipynb"]

KERNELSPEC = {"name": "ir", "display_name": "R", "language": "R"}

_CHUNK = re.compile(r"^(## ----.*|#{3,}\s*code chunk number.*|#{20,}\s*)$")


def r_lib_dirs(r):
    out = subprocess.run([r, "--no-echo", "-e", "cat(.libPaths(), sep='\\n')"],
                         capture_output=True, text=True, check=True)
    return [l for l in out.stdout.splitlines() if l.strip()]


def split_vignette(text):
    """Cells of a purl'd or Stangle'd vignette: split at chunk markers;
    chunks that are only comments (purl comments out `eval = FALSE`
    chunks) are dropped."""
    cells, cur = [], []
    for line in text.splitlines():
        if _CHUNK.match(line):
            cells.append(cur)
            cur = []
            continue
        cur.append(line)
    cells.append(cur)
    out = []
    for c in cells:
        code = [l for l in c if l.strip() and not l.lstrip().startswith("#")]
        if code:
            out.append("\n".join(c).strip("\n"))
    return out


def notebook(cells):
    import nbformat
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    nb.metadata["kernelspec"] = dict(KERNELSPEC)
    nb.metadata["language_info"] = {"name": "R"}
    return nb


def read_irkernel(path, name):
    """A notebook of IRkernel's example-notebooks from a checkout or a bare
    git directory."""
    plain = os.path.join(path, "example-notebooks", name)
    if os.path.isfile(plain):
        with open(plain) as fh:
            return fh.read()
    out = subprocess.run(["git", "--git-dir", path, "show", "HEAD:example-notebooks/" + name],
                         capture_output=True, text=True)
    return out.stdout if out.returncode == 0 else None


def gather(r, irkernel, work):
    import nbformat
    nbdir = os.path.join(work, "notebooks")
    os.makedirs(nbdir, exist_ok=True)
    batches = []
    if irkernel:
        for name in IRKERNEL_NOTEBOOKS:
            raw = read_irkernel(irkernel, name)
            if raw is None:
                print("  left out IRkernel %s: not in %s" % (name, irkernel), file=sys.stderr)
                continue
            nb = nbformat.reads(raw, as_version=4)
            for c in nb.cells:
                if c.cell_type == "code":
                    c.outputs, c.execution_count = [], None
            batches.append(("IRkernel:example-notebooks/" + name, "irkernel-" + name[:-6], nb))
    libs = r_lib_dirs(r)
    for package, script in VIGNETTES:
        found = next((os.path.join(d, package, "doc", script) for d in libs
                      if os.path.isfile(os.path.join(d, package, "doc", script))), None)
        if found is None:
            print("  left out %s/%s: not installed" % (package, script), file=sys.stderr)
            continue
        with open(found, encoding="utf-8", errors="replace") as fh:
            cells = split_vignette(fh.read())
        if cells:
            batches.append(("%s:doc/%s" % (package, script), "%s-%s" % (package, script[:-2]), notebook(cells)))
    items = []
    for n, (label, stem, nb) in enumerate(batches):
        d = os.path.join(nbdir, "%03d-%s" % (n, re.sub(r"[^\w.-]+", "_", stem)))
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, "input.ipynb")
        nbformat.write(nb, path)
        items.append({"source": label, "dir": d, "path": path,
                      "cells": sum(1 for c in nb.cells if c.cell_type == "code")})
    return items


def run_nbclient(item, timeout):
    import nbformat
    from nbclient import NotebookClient
    nb = nbformat.read(item["path"], as_version=4)
    wd = os.path.join(item["dir"], "nbclient")
    os.makedirs(wd, exist_ok=True)
    client = NotebookClient(nb, timeout=timeout, kernel_name="ir", allow_errors=True,
                            resources={"metadata": {"path": wd}})
    t = time.time()
    try:
        client.execute()
    except Exception as exc:  # a dead kernel: the cells not run count as failed
        print("  nbclient: %s: %s" % (type(exc).__name__, exc), file=sys.stderr)
    elapsed = time.time() - t
    out = os.path.join(item["dir"], "nbclient.ipynb")
    nbformat.write(nb, out)
    return out, elapsed


def run_cellhost(item, cellhost, r, python, timeout):
    wd = os.path.join(item["dir"], "cellhost")
    os.makedirs(wd, exist_ok=True)
    src = os.path.join(wd, "input.ipynb")
    with open(item["path"]) as a, open(src, "w") as b:
        b.write(a.read())
    out = os.path.join(item["dir"], "cellhost.ipynb")
    t = time.time()
    subprocess.run([cellhost, "run", src, "--output", out, "--r", r, "--python", python, "--allow-errors",
                    "--timeout", str(timeout)], cwd=wd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return out, time.time() - t


def summary(cell):
    """(status, stdout, images, text/plain of its values) of one executed cell."""
    status, stdout, images, plain = "ok", [], 0, []
    for o in cell.get("outputs", []):
        t = o.get("output_type")
        if t == "error":
            status = "error"
        elif t == "stream" and o.get("name") == "stdout":
            stdout.append(o.get("text", ""))
        elif t in ("display_data", "execute_result"):
            data = o.get("data", {})
            if any(k.startswith("image/") for k in data):
                images += 1
            else:
                # IRkernel sends every visible value as display_data.
                p = data.get("text/plain")
                if p is not None:
                    plain.append("".join(p) if isinstance(p, list) else p)
    if cell.get("execution_count") is None and not cell.get("outputs"):
        status = "not run"
    return status, norm("".join(stdout)), images, norm("\n".join(plain)) if plain else None


def printed(s):
    """What a reader sees printed by a cell: its stdout and its result's
    text/plain together (IRkernel sends every visible value as an
    execute_result or display_data; cellhost prints the ones before the
    last on stdout, as the R console does)."""
    return " ".join((s[1] + " " + (s[3] or "")).split())


def compare(item):
    import nbformat
    try:
        a = nbformat.read(os.path.join(item["dir"], "cellhost.ipynb"), as_version=4)
    except Exception:
        a = None
    b = nbformat.read(os.path.join(item["dir"], "nbclient.ipynb"), as_version=4)
    bc = [c for c in b.cells if c.cell_type == "code"]
    ac = [c for c in a.cells if c.cell_type == "code"] if a is not None else [{}] * len(bc)
    rows = []
    for i, (x, y) in enumerate(zip(ac, bc)):
        sx, sy = summary(x), summary(y)
        diffs = []
        if sx[0] != sy[0]:
            diffs.append("status")
        if printed(sx) != printed(sy):
            diffs.append("printed text")
        if sx[2] != sy[2]:
            diffs.append("images")
        if sx[0] == "ok" and sy[0] == "ok":
            kind = "both ok"
        elif sx[0] != "ok" and sy[0] != "ok":
            kind = "both fail"
        elif sx[0] != "ok":
            kind = "fail only under cellhost"
        else:
            kind = "fail only under IRkernel"
        rows.append({"source": item["source"], "cell": i + 1, "kind": kind, "diffs": diffs,
                     "cellhost": sx, "irkernel": sy, "code": y.get("source", "")[:300]})
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", required=True, help="venv interpreter (nbclient, nbformat)")
    ap.add_argument("--cellhost", required=True, help="the cellhost binary")
    ap.add_argument("--r", default="R", help="R interpreter (both sides use the R on PATH for IRkernel)")
    ap.add_argument("--irkernel", help="IRkernel checkout or bare git directory (its example notebooks)")
    ap.add_argument("--work", default="/var/tmp/cellhost-r-corpus")
    ap.add_argument("--timeout", type=int, default=120, help="per-cell deadline, seconds")
    ap.add_argument("--show", type=int, default=20, help="list this many differing cells")
    ap.add_argument("--compare-only", action="store_true",
                    help="compare the outputs of the last run in --work again (its times kept) without running")
    args = ap.parse_args()
    python = os.path.abspath(args.python)
    cellhost = os.path.abspath(args.cellhost)
    r = subprocess.run(["sh", "-c", 'command -v "$0"', args.r], capture_output=True, text=True).stdout.strip() or args.r
    items = gather(r, args.irkernel, args.work)
    print("corpus: %d notebooks, %d code cells" % (len(items), sum(i["cells"] for i in items)))
    rows, t_ch, t_ir = [], 0.0, 0.0
    per_nb = []
    last = {}
    if args.compare_only:
        with open(os.path.join(args.work, "report.json")) as fh:
            last = {p["source"]: p for p in json.load(fh)["per_notebook"]}
    for n, item in enumerate(items, 1):
        # Alternate which system goes first, so neither always meets a cold
        # page cache.
        if args.compare_only:
            tc, ti = last[item["source"]]["cellhost_s"], last[item["source"]]["irkernel_s"]
        elif n % 2:
            _, tc = run_cellhost(item, cellhost, r, python, args.timeout)
            _, ti = run_nbclient(item, args.timeout)
        else:
            _, ti = run_nbclient(item, args.timeout)
            _, tc = run_cellhost(item, cellhost, r, python, args.timeout)
        t_ch += tc
        t_ir += ti
        these = compare(item)
        rows.extend(these)
        per_nb.append({"source": item["source"], "cells": len(these),
                       "agree": sum(1 for x in these if not x["diffs"]),
                       "cellhost_s": round(tc, 2), "irkernel_s": round(ti, 2)})
        print("[%d/%d] %s: %d/%d cells agree; cellhost %.1fs, nbclient+IRkernel %.1fs"
              % (n, len(items), item["source"], per_nb[-1]["agree"], len(these), tc, ti), file=sys.stderr)
    kinds, by_field = {}, {}
    for row in rows:
        kinds[row["kind"]] = kinds.get(row["kind"], 0) + 1
        for d in row["diffs"]:
            by_field[d] = by_field.get(d, 0) + 1
    same = sum(1 for row in rows if not row["diffs"])
    agree = {f: sum(1 for row in rows if f not in row["diffs"]) for f in ("status", "printed text", "images")}
    report = {"notebooks": len(items), "cells": len(rows), "identical": same, "agree": agree, "kinds": kinds,
              "differences_by_field": by_field,
              "seconds": {"cellhost": round(t_ch, 1), "irkernel": round(t_ir, 1),
                          "ratio": round(t_ch / t_ir, 2) if t_ir else None},
              "per_notebook": per_nb, "rows": rows}
    with open(os.path.join(args.work, "report.json"), "w") as fh:
        json.dump(report, fh, indent=1)
    n = max(1, len(rows))
    print("cells: %d; agree on all three fields: %d (%.1f%%)" % (len(rows), same, 100.0 * same / n))
    for f, v in agree.items():
        print("  %-13s %d/%d (%.1f%%)" % (f, v, len(rows), 100.0 * v / n))
    for k in sorted(kinds):
        print("  %-26s %d" % (k, kinds[k]))
    print("wall time: cellhost run %.1f s, nbclient + IRkernel %.1f s, ratio %.2f"
          % (t_ch, t_ir, t_ch / t_ir if t_ir else float("nan")))
    shown = 0
    for row in rows:
        if row["diffs"] and shown < args.show:
            shown += 1
            print("--- %s cell %d: %s (%s)" % (row["source"], row["cell"], row["kind"], ", ".join(row["diffs"])))
            print("    code: %r" % row["code"][:160])
            print("    cellhost: %r" % (row["cellhost"],))
            print("    irkernel: %r" % (row["irkernel"],))


if __name__ == "__main__":
    main()
