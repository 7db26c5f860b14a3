"""Per-cell agreement (status, printed text, image count) and wall time of
`cellhost run` vs nbclient + IRkernel on the same notebooks, same run.
Usage: python notebooks_vs_irkernel.py CELLHOST NOTEBOOK.ipynb..."""
import json, sys, time, subprocess, nbformat
from nbclient import NotebookClient
C = sys.argv[1]
def summary(nb):
    out = []
    for c in nb.cells:
        if c.cell_type != "code": continue
        st = "error" if any(o.output_type == "error" for o in c.outputs) else "ok"
        text = "".join((o.get("text") if o.output_type == "stream" else "") for o in c.outputs)
        text += "".join(o.get("data", {}).get("text/plain", "") for o in c.outputs if o.output_type in ("execute_result", "display_data") and "image/png" not in o.get("data", {}))
        imgs = sum("image/png" in o.get("data", {}) for o in c.outputs if o.output_type in ("execute_result", "display_data"))
        out.append((st, " ".join(text.split()), imgs))
    return out
for name in sys.argv[2:]:
    nb = nbformat.read(name, 4)
    t = time.perf_counter()
    NotebookClient(nb, kernel_name="ir", allow_errors=True, timeout=120).execute()
    t_ir = time.perf_counter() - t
    a = summary(nb)
    t = time.perf_counter()
    subprocess.run([C, "run", "--allow-errors", "--sandbox", "off", "--output", name + ".ch.ipynb", name], capture_output=True)
    t_ch = time.perf_counter() - t
    b = summary(nbformat.read(name + ".ch.ipynb", 4))
    n = len(a)
    agree = [sum(x[i] == y[i] for x, y in zip(a, b)) for i in range(3)]
    print(f"{name}: {n} code cells; status {agree[0]}/{n}, text {agree[1]}/{n}, images {agree[2]}/{n}; wall IRkernel {t_ir:.2f}s cellhost {t_ch:.2f}s ratio {t_ch/t_ir:.2f}")
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y: print("  cell", i, "IR:", str(x)[:150], "\n         CH:", str(y)[:150])
