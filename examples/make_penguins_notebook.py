"""Build examples/penguins.ipynb, the analysis notebook that the quick start runs.

Run with the project's venv:

    .venv/bin/python examples/make_penguins_notebook.py

The notebook is written beside this script and validated against the nbformat
4.5 schema. Check that its code runs without a kernel:

    .venv/bin/python examples/make_penguins_notebook.py --check
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat
from nbformat import v4

HERE = Path(__file__).resolve().parent
OUT = HERE / "penguins.ipynb"

CELLS: list[tuple[str, str]] = [
    (
        "markdown",
        """\
# Palmer penguins: body size by species and sex

This notebook analyses the [Palmer penguins](https://allisonhorst.github.io/palmerpenguins/)
data: measurements of 344 penguins of three species (Adélie, Chinstrap, Gentoo)
on three islands of the Palmer Archipelago, Antarctica.

Steps:

1. load the data from the `palmerpenguins` package;
2. clean it (drop rows with missing measurements or sex);
3. summarise bill, flipper and body mass by species and sex;
4. fit a linear regression of body mass on flipper length for each species;
5. plot the relationship and the distribution of bill length.""",
    ),
    (
        "code",
        """\
import numpy as np
import pandas as pd
import matplotlib.pyplot as plt
from palmerpenguins import load_penguins

pd.set_option("display.precision", 2)
print(f"numpy {np.__version__}, pandas {pd.__version__}")""",
    ),
    ("markdown", "## Load"),
    (
        "code",
        """\
raw = load_penguins()
print(f"{len(raw)} rows, {raw.shape[1]} columns: {', '.join(raw.columns)}")
raw.head()""",
    ),
    ("markdown", "## Clean\n\nDrop every row that lacks a measurement or the sex of the bird."),
    (
        "code",
        """\
MEASURES = ["bill_length_mm", "bill_depth_mm", "flipper_length_mm", "body_mass_g"]

missing = raw[MEASURES + ["sex"]].isna().sum()
print("missing values per column:")
print(missing.to_string())

penguins = raw.dropna(subset=MEASURES + ["sex"]).reset_index(drop=True)
dropped = len(raw) - len(penguins)
print(f"\\nkept {len(penguins)} of {len(raw)} rows (dropped {dropped})")
print(penguins["species"].value_counts().sort_index().to_string())""",
    ),
    (
        "markdown",
        "## Summary by species and sex\n\nMean of each measurement and the number of birds in each group.",
    ),
    (
        "code",
        """\
summary = (
    penguins.groupby(["species", "sex"])
    .agg(
        bill_length_mm=("bill_length_mm", "mean"),
        bill_depth_mm=("bill_depth_mm", "mean"),
        flipper_length_mm=("flipper_length_mm", "mean"),
        body_mass_g=("body_mass_g", "mean"),
        count=("body_mass_g", "size"),
    )
    .round(1)
)
summary""",
    ),
    (
        "markdown",
        """\
## Regression: body mass on flipper length

An ordinary least-squares line `body_mass_g = slope * flipper_length_mm + intercept`
for each species, fitted with `numpy.polyfit`; R² is the share of the variance
in body mass that the line explains.""",
    ),
    (
        "code",
        """\
def fit_line(x, y):
    slope, intercept = np.polyfit(x, y, deg=1)
    predicted = slope * x + intercept
    ss_res = float(np.sum((y - predicted) ** 2))
    ss_tot = float(np.sum((y - np.mean(y)) ** 2))
    return slope, intercept, 1.0 - ss_res / ss_tot

fits = {}
for species, group in penguins.groupby("species"):
    x = group["flipper_length_mm"].to_numpy(dtype=float)
    y = group["body_mass_g"].to_numpy(dtype=float)
    fits[species] = fit_line(x, y)

print(f"{'species':<10} {'n':>4} {'slope (g/mm)':>13} {'intercept (g)':>14} {'R²':>6}")
for species, (slope, intercept, r2) in fits.items():
    n = int((penguins["species"] == species).sum())
    print(f"{species:<10} {n:>4} {slope:>13.2f} {intercept:>14.1f} {r2:>6.3f}")""",
    ),
    ("markdown", "## Figures"),
    (
        "code",
        """\
COLORS = {"Adelie": "#ff7f0e", "Chinstrap": "#9467bd", "Gentoo": "#17becf"}

fig, ax = plt.subplots(figsize=(7, 4.5))
for species, group in penguins.groupby("species"):
    ax.scatter(group["flipper_length_mm"], group["body_mass_g"],
               s=14, alpha=0.6, color=COLORS[species], label=species)
    slope, intercept, r2 = fits[species]
    xs = np.linspace(group["flipper_length_mm"].min(), group["flipper_length_mm"].max(), 50)
    ax.plot(xs, slope * xs + intercept, color=COLORS[species], linewidth=2)
ax.set_xlabel("flipper length (mm)")
ax.set_ylabel("body mass (g)")
ax.set_title("Body mass against flipper length, with per-species OLS fits")
ax.legend(title="species")
fig.tight_layout()
plt.show()""",
    ),
    (
        "code",
        """\
species_order = sorted(penguins["species"].unique())
fig, ax = plt.subplots(figsize=(7, 4.5))
parts = ax.boxplot(
    [penguins.loc[penguins["species"] == s, "bill_length_mm"] for s in species_order],
    patch_artist=True,
)
ax.set_xticks(range(1, len(species_order) + 1), species_order)
for patch, species in zip(parts["boxes"], species_order):
    patch.set_facecolor(COLORS[species])
    patch.set_alpha(0.6)
ax.set_ylabel("bill length (mm)")
ax.set_title("Bill length by species")
fig.tight_layout()
plt.show()""",
    ),
    ("markdown", "## Summary"),
    (
        "code",
        """\
heaviest = summary["body_mass_g"].idxmax()
best = max(fits, key=lambda s: fits[s][2])
print(f"Analysed {len(penguins)} penguins of {penguins['species'].nunique()} species "
      f"({dropped} incomplete rows dropped).")
print(f"Heaviest group on average: {heaviest[1]} {heaviest[0]} "
      f"({summary.loc[heaviest, 'body_mass_g']:.0f} g).")
print(f"Flipper length predicts body mass best for {best} "
      f"(R² = {fits[best][2]:.2f}, {fits[best][0]:.1f} g per mm).")""",
    ),
]


def build() -> nbformat.NotebookNode:
    nb = v4.new_notebook()
    nb.nbformat, nb.nbformat_minor = 4, 5
    nb.metadata = {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python", "file_extension": ".py", "mimetype": "text/x-python"},
    }
    for index, (kind, source) in enumerate(CELLS):
        cell = v4.new_markdown_cell(source) if kind == "markdown" else v4.new_code_cell(source)
        cell.id = f"cell-{index:02d}"  # stable ids keep the file's diff clean
        nb.cells.append(cell)
    nbformat.validate(nb)
    return nb


def check(nb: nbformat.NotebookNode) -> None:
    """Run the code cells, concatenated, in a fresh interpreter on the Agg backend."""
    code = "\n\n".join(c.source for c in nb.cells if c.cell_type == "code")
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "penguins_cells.py"
        script.write_text(code, encoding="utf-8")
        env = dict(os.environ, MPLBACKEND="Agg")
        subprocess.run([sys.executable, str(script)], check=True, env=env, cwd=tmp)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="also run the code cells as a script (MPLBACKEND=Agg)")
    args = parser.parse_args()
    nb = build()
    nbformat.write(nb, OUT)
    nbformat.validate(nbformat.read(OUT, as_version=4))
    print(f"wrote {OUT} ({len(nb.cells)} cells)")
    if args.check:
        check(nb)


if __name__ == "__main__":
    main()
