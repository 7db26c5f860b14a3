#!/usr/bin/env python3
"""Runs a corpus of real notebooks and gallery scripts under `cellhost run`
and under nbclient + ipykernel in the same venv, and compares them cell by
cell (status, normalised stdout, image count, text/plain of the result).

The inputs come from PyPI source distributions that ship them, fetched
through the package index the venv's pip uses (sha256-checked), and from
one small vendored file; no cell needs the network:

* matplotlib's gallery (``galleries/examples`` and ``plot_types``,
  sphinx-gallery scripts split into cells at ``# %%`` and ``####`` lines as
  sphinx-gallery does; the scripts of one directory share a notebook, up
  to 40 cells each);
* matplotlib's inline-backend test notebook (``%matplotlib inline``);
* IPython-heavy chapters of Jake VanderPlas's *Python Data Science
  Handbook* (``%timeit``, ``%%time``, ``%matplotlib inline``, ``!cmd``,
  ``x = !cmd``, ``obj?``, ``obj??``, ``%cd``, ``In``/``Out``, ``%prun``):
  the code cells of the chapters that need no data files and no packages
  beyond numpy, pandas and matplotlib, and the ``In [n]:`` lines of the
  ``ipython`` sessions quoted in chapter 1's text, vendored as
  ``pdsh.json`` (code only; the code is MIT-licensed, ``PDSH-LICENSE``;
  the book's text is not included). ``--vendor-pdsh CHECKOUT`` rebuilds it
  from a checkout of github.com/jakevdp/PythonDataScienceHandbook.

Usage (figures for the record, not a test):

    scripts/corpus/corpus.py --python .venv/bin/python --cellhost target/debug/cellhost

Writes ``<work>/report.json`` and prints a summary; ``--show N`` lists the
first N differing cells; ``--sources matplotlib`` or ``--sources pdsh``
runs one part. Needs nbclient, ipykernel and nbformat in the venv.

Accepted differences (not counted as cellhost failures when they show):

* ``!ls`` and other commands that list the working directory: `cellhost
  run` runs in a directory that holds its copy of the input notebook,
  nbclient in an empty one;
* timings (``%time``, ``%timeit``, ``%prun``) and memory addresses are
  normalised away; ``%prun``'s table lists the functions it saw, which
  includes the runner's own frames (ipykernel's or cellhost's), so its
  stdout differs;
* ``obj?``, ``obj??``, ``%magic``, ``%timeit?`` and ``%prun``: IPython
  sends their text to the pager, a ``payload`` of the execute reply that
  nbclient drops (Jupyter shows it in a pager pane); `cellhost run` writes
  it to the cell's stdout, so the stdout differs;
* ``%debug`` and ``%pdb on``: ipykernel's debugger asks for input, which
  nbclient does not give (StdinNotImplementedError); cellhost's kernels have
  no stdin, the post-mortem prints nothing and the cell succeeds;
* ``%lsmagic`` lists ipykernel's own magics (``%connect_info``,
  ``%autosave``, ``%clear``, …) that a kernel without ipykernel lacks;
* ``%history``: cellhost keeps ``In``/``Out`` but IPython's history
  database is off in its kernels, so ``%history`` prints nothing;
* ``np.random`` without a seed: a different draw in each run;
* a ``UsageError`` (``%lprun`` without line_profiler) is an error output
  under cellhost and a stderr line under ipykernel, whose execute reply
  says "error" too: the comparison counts both as failed;
* cells a runner cannot run alike by design: ``<TAB>`` completion lines
  quoted in the book are left out, and the book's ``%load_ext
  line_profiler``/``memory_profiler`` cells fail in both (not installed).
"""
import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tarfile
import time
import urllib.parse
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
PDSH = os.path.join(HERE, "pdsh.json")

SOURCES = [
    # (distribution, version, member filter, kind)
    ("matplotlib", "3.11.2", re.compile(r"^[^/]+/lib/matplotlib/tests/data/test_inline_01\.ipynb$"), "notebook"),
    ("matplotlib", "3.11.2", re.compile(r"^[^/]+/galleries/(examples|plot_types)/[^/]+/[^/]+\.py$"), "gallery"),
]

# Gallery scripts that need a GUI, the network, an event loop of their own
# or minutes of CPU: left out, by directory or name.
SKIP = re.compile(
    r"/(user_interfaces|event_handling|animation|widgets|misc/multiprocess|misc/multipage_pdf"
    r"|showcase/xkcd|misc/rasterization_demo|misc/print_stdout)"
)


# Gallery scripts of one directory run in one notebook, this many cells at
# most (a kernel start per script would dominate the run).
BATCH = 40


def index_url(python):
    out = subprocess.run([python, "-m", "pip", "config", "get", "global.index-url"],
                         capture_output=True, text=True)
    url = out.stdout.strip() if out.returncode == 0 else ""
    return (url or "https://pypi.org/simple").rstrip("/")


def fetch_sdist(python, name, version, dest):
    path = os.path.join(dest, "%s-%s.tar.gz" % (name, version))
    if os.path.exists(path):
        return path
    page = urllib.request.urlopen("%s/%s/" % (index_url(python), name), timeout=120).read().decode()
    pat = re.compile(r'href="([^"]*/%s-%s\.tar\.gz)#sha256=([0-9a-f]+)"' % (re.escape(name), re.escape(version)))
    m = pat.search(page)
    if m is None:
        sys.exit("no sdist %s-%s on the index" % (name, version))
    url, digest = m.groups()
    if url.startswith("/") or not url.startswith("http"):
        url = urllib.parse.urljoin("%s/%s/" % (index_url(python), name), url)
    data = urllib.request.urlopen(url, timeout=600).read()
    if hashlib.sha256(data).hexdigest() != digest:
        sys.exit("sha256 mismatch for %s" % url)
    with open(path + ".part", "wb") as fh:
        fh.write(data)
    os.rename(path + ".part", path)
    return path


def split_gallery(text):
    """Code cells of a sphinx-gallery script: split at `# %%` lines and at
    comment blocks opened by a line of 20+ `#`; the module docstring and
    comment-only blocks are text, not code."""
    text = re.sub(r'^\s*(?:r|u)?("""|\'\'\')(.*?)\1', "", text, count=1, flags=re.S)
    cells, cur = [], []
    for line in text.splitlines():
        if re.match(r"^# ?%%", line) or re.match(r"^#{20,}\s*$", line):
            cells.append(cur)
            cur = []
            continue
        cur.append(line)
    cells.append(cur)
    out = []
    for c in cells:
        code = [l for l in c if not l.startswith("#") or l.startswith("#!")]
        src = "\n".join(c).strip("\n")
        if any(l.strip() for l in code):
            out.append(src)
    return out


def notebook(cells):
    import nbformat
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


def vendor_pdsh(checkout):
    """Rebuilds pdsh.json from a checkout of the Python Data Science
    Handbook: the code cells of PDSH_CHAPTERS, and the ``In [n]:`` lines
    (with their ``...:`` or ``....:`` continuations) of the ``ipython`` blocks quoted in
    the text of PDSH_SESSIONS, one cell each; ``<TAB>`` lines (completion,
    not code) are left out."""
    commit = subprocess.run(["git", "-C", checkout, "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    out = {"source": "https://github.com/jakevdp/PythonDataScienceHandbook", "commit": commit,
           "license": "code: MIT (PDSH-LICENSE); the book's text is not included", "notebooks": []}
    for name in PDSH_SESSIONS + PDSH_CHAPTERS:
        with open(os.path.join(checkout, "notebooks", name + ".ipynb")) as fh:
            nb = json.load(fh)
        cells = []
        for c in nb["cells"]:
            src = "".join(c["source"]) if isinstance(c["source"], list) else c["source"]
            if name in PDSH_SESSIONS:
                if c["cell_type"] != "markdown":
                    continue
                for block in re.findall(r"```ipython\n(.*?)```", src, re.S):
                    for m in re.finditer(r"^In \[\d+\]: (.*(?:\n\s*\.{3,}: ?.*)*)", block, re.M):
                        code = re.sub(r"\n\s*\.{3,}: ?", "\n", m.group(1)).rstrip()
                        if code and "<TAB>" not in code:
                            cells.append(code)
            elif c["cell_type"] == "code" and src.strip():
                cells.append(src)
        out["notebooks"].append({"name": name, "cells": cells})
    with open(PDSH, "w") as fh:
        json.dump(out, fh, indent=1)
        fh.write("\n")
    print("wrote %s: %d notebooks, %d cells" % (PDSH, len(out["notebooks"]),
                                              sum(len(n["cells"]) for n in out["notebooks"])))


# Chapters whose code cells need no data file and nothing beyond numpy,
# pandas and matplotlib (a few cells need scipy, numexpr or a profiler
# extension and fail under both runners).
PDSH_CHAPTERS = [
    "01.06-Errors-and-Debugging", "01.07-Timing-and-Profiling",
    "02.02-The-Basics-Of-NumPy-Arrays", "02.03-Computation-on-arrays-ufuncs",
    "02.05-Computation-on-arrays-broadcasting", "02.06-Boolean-Arrays-and-Masks",
    "02.07-Fancy-Indexing", "02.08-Sorting", "03.04-Missing-Values",
    "03.12-Performance-Eval-and-Query", "04.01-Simple-Line-Plots",
    "04.02-Simple-Scatter-Plots", "04.05-Histograms-and-Binnings",
    "04.08-Multiple-Subplots", "04.10-Customizing-Ticks",
]
# Chapter 1 sections whose IPython sessions are quoted in the text.
PDSH_SESSIONS = [
    "01.01-Help-And-Documentation", "01.03-Magic-Commands",
    "01.04-Input-Output-History", "01.05-IPython-And-Shell-Commands",
]


def gather(python, work, limit, sources=()):
    import nbformat
    sd = os.path.join(work, "sdists")
    nbdir = os.path.join(work, "notebooks")
    os.makedirs(sd, exist_ok=True)
    os.makedirs(nbdir, exist_ok=True)
    items = []
    batches = []  # (source label, stem, cells): gallery scripts of one directory share a notebook
    for name, version, filt, kind in SOURCES:
        if sources and name not in sources:
            continue
        tar = fetch_sdist(python, name, version, sd)
        with tarfile.open(tar) as tf:
            for member in sorted(tf.getmembers(), key=lambda m: m.name):
                if not member.isfile() or not filt.match(member.name) or SKIP.search(member.name):
                    continue
                raw = tf.extractfile(member).read().decode("utf-8", "replace")
                rel = member.name.split("/", 1)[1]
                if kind == "gallery":
                    cells = split_gallery(raw)
                    folder = "%s-%s:%s" % (name, version, rel.rsplit("/", 1)[0])
                    if not batches or batches[-1][0] != folder or len(batches[-1][2]) >= BATCH:
                        batches.append((folder, re.sub(r"[^\w.-]+", "_", rel.rsplit("/", 1)[0]), []))
                    batches[-1][2].extend(cells)
                    continue
                nb = nbformat.reads(raw, as_version=4)
                for c in nb.cells:
                    if c.cell_type == "code":
                        c.outputs, c.execution_count = [], None
                nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
                batches.append(("%s-%s:%s" % (name, version, rel), re.sub(r"[^\w.-]+", "_", rel), nb))
    if not sources or "pdsh" in sources:
        with open(PDSH) as fh:
            vendored = json.load(fh)
        for chapter in vendored["notebooks"]:
            batches.append(("pdsh:%s" % chapter["name"], "pdsh-" + chapter["name"], chapter["cells"]))
    for n, (label, stem, content) in enumerate(batches):
        nb = notebook(content) if isinstance(content, list) else content
        cells = sum(1 for c in nb.cells if c.cell_type == "code")
        if cells == 0:
            continue
        d = os.path.join(nbdir, "%03d-%s" % (n, stem[:100]))
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, "input.ipynb")
        nbformat.write(nb, path)
        items.append({"source": label, "dir": d, "path": path, "cells": cells})
        if limit and sum(i["cells"] for i in items) >= limit:
            break
    return items


# ------------------------------------------------------------------ runs

def run_nbclient(item, timeout):
    import nbformat
    from nbclient import NotebookClient
    nb = nbformat.read(item["path"], as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": os.path.join(item["dir"], "nbclient")}})
    os.makedirs(os.path.join(item["dir"], "nbclient"), exist_ok=True)
    t = time.time()
    try:
        client.execute()
    except Exception as exc:  # a dead kernel: the cells not run count as failed
        print("  nbclient: %s: %s" % (type(exc).__name__, exc), file=sys.stderr)
    out = os.path.join(item["dir"], "nbclient.ipynb")
    nbformat.write(nb, out)
    return out, time.time() - t


def run_cellhost(item, cellhost, python, timeout):
    wd = os.path.join(item["dir"], "cellhost")
    os.makedirs(wd, exist_ok=True)
    src = os.path.join(wd, "input.ipynb")
    with open(item["path"]) as a, open(src, "w") as b:
        b.write(a.read())
    out = os.path.join(item["dir"], "cellhost.ipynb")
    t = time.time()
    subprocess.run([cellhost, "run", src, "--output", out, "--python", python, "--allow-errors",
                    "--timeout", str(timeout)], cwd=wd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return out, time.time() - t


# --------------------------------------------------------------- compare

_ADDR = re.compile(r"0x[0-9a-fA-F]{6,}")
_NUM_TIME = re.compile(r"\d+(\.\d+)?(e[+-]?\d+)?\s*(ns|\xb5s|μs|us|ms|s|min)\b")
_TMP = re.compile(r"/(tmp|var/tmp|root)/[^\s'\"]*")


_LOOPS = re.compile(r"\d[\d,]* loops? each")
_SLOWEST = re.compile(r"^The slowest run took .* being cached\.\n?", re.M)


def norm(text):
    text = _ADDR.sub("0x…", text)
    # %timeit's loop count and its caching warning follow the machine's speed.
    text = _SLOWEST.sub("", text)
    text = _LOOPS.sub("<n> loops each", text)
    text = _NUM_TIME.sub("<time>", text)
    text = _TMP.sub("<path>", text)
    return "\n".join(l.rstrip() for l in text.strip().splitlines())


def summary(cell):
    """(status, stdout, images, text/plain of the result) of one executed cell."""
    status, stdout, images, plain = "ok", [], 0, None
    for o in cell.get("outputs", []):
        t = o.get("output_type")
        if t == "error":
            status = "error:" + o.get("ename", "")
        elif t == "stream" and o.get("name") == "stdout":
            stdout.append(o.get("text", ""))
        elif t == "stream" and o.get("name") == "stderr":
            # ipykernel shows a UsageError (a magic that does not exist or
            # was called wrongly) on stderr only, while its execute_reply
            # says "error": the cell failed.
            text = o.get("text", "")
            text = "".join(text) if isinstance(text, list) else text
            if text.startswith("UsageError:") and status == "ok":
                status = "error:UsageError"
        elif t in ("display_data", "execute_result"):
            data = o.get("data", {})
            if any(k.startswith("image/") for k in data):
                images += 1
            if t == "execute_result":
                p = data.get("text/plain")
                plain = "".join(p) if isinstance(p, list) else p
    if cell.get("execution_count") is None and not cell.get("outputs"):
        status = "not run"
    return status, norm("".join(stdout)), images, norm(plain) if plain is not None else None


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
        diffs = [k for k, u, v in zip(("status", "stdout", "images", "text/plain"), sx, sy) if u != v]
        if sx[0] == "ok" and sy[0] == "ok":
            kind = "both ok"
        elif sx[0] != "ok" and sy[0] != "ok":
            kind = "both fail"
        elif sx[0] != "ok":
            kind = "fail only under cellhost"
        else:
            kind = "fail only under nbclient"
        rows.append({"source": item["source"], "cell": i + 1, "kind": kind, "diffs": diffs,
                     "cellhost": sx, "nbclient": sy, "code": y.get("source", "")[:300]})
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", help="venv interpreter (nbclient, ipykernel, nbformat)")
    ap.add_argument("--cellhost", help="the cellhost binary")
    ap.add_argument("--sources", default="", help="comma-separated parts to run: matplotlib, pdsh (default: all)")
    ap.add_argument("--vendor-pdsh", metavar="CHECKOUT", help="rebuild pdsh.json from this checkout and exit")
    ap.add_argument("--work", default="/var/tmp/cellhost-corpus")
    ap.add_argument("--limit", type=int, default=0, help="stop gathering after this many code cells")
    ap.add_argument("--timeout", type=int, default=120, help="per-cell deadline, seconds")
    ap.add_argument("--show", type=int, default=20, help="list this many differing cells")
    args = ap.parse_args()
    if args.vendor_pdsh:
        vendor_pdsh(args.vendor_pdsh)
        return
    if not args.python or not args.cellhost:
        ap.error("--python and --cellhost are needed to run the corpus")
    python = os.path.abspath(args.python)
    cellhost = os.path.abspath(args.cellhost)
    sources = tuple(x for x in args.sources.split(",") if x)
    items = gather(python, args.work, args.limit, sources)
    print("corpus: %d notebooks, %d code cells" % (len(items), sum(i["cells"] for i in items)))
    rows, t_ch, t_nb = [], 0.0, 0.0
    for n, item in enumerate(items, 1):
        _, tc = run_cellhost(item, cellhost, python, args.timeout)
        _, tn = run_nbclient(item, args.timeout)
        t_ch += tc
        t_nb += tn
        rows.extend(compare(item))
        print("[%d/%d] %s: cellhost %.1fs, nbclient %.1fs" % (n, len(items), item["source"], tc, tn), file=sys.stderr)
    kinds = {}
    for r in rows:
        kinds[r["kind"]] = kinds.get(r["kind"], 0) + 1
    same = sum(1 for r in rows if not r["diffs"])
    by_field = {}
    for r in rows:
        for d in r["diffs"]:
            by_field[d] = by_field.get(d, 0) + 1
    report = {"notebooks": len(items), "cells": len(rows), "identical": same, "kinds": kinds,
              "differences_by_field": by_field, "seconds": {"cellhost": round(t_ch, 1), "nbclient": round(t_nb, 1)},
              "rows": rows}
    with open(os.path.join(args.work, "report.json"), "w") as fh:
        json.dump(report, fh, indent=1)
    print("cells: %d; identical on all four fields: %d (%.1f%%)" % (len(rows), same, 100.0 * same / max(1, len(rows))))
    for k in sorted(kinds):
        print("  %-26s %d" % (k, kinds[k]))
    print("differences by field: %s" % json.dumps(by_field))
    print("wall time: cellhost %.1f s, nbclient %.1f s" % (t_ch, t_nb))
    shown = 0
    for r in rows:
        if r["diffs"] and shown < args.show:
            shown += 1
            print("--- %s cell %d: %s (%s)" % (r["source"], r["cell"], r["kind"], ", ".join(r["diffs"])))
            print("    code: %r" % r["code"][:160])
            print("    cellhost: %r" % (r["cellhost"],))
            print("    nbclient: %r" % (r["nbclient"],))


if __name__ == "__main__":
    main()
