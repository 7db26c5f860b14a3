"""matplotlib backend of cellhost kernels: Agg rendering, ``show()`` never blocks.

``plt.show()`` sends every open figure to the host as an ``image/png`` display
and closes it (like Jupyter's inline backend); figures still open when a cell
ends are sent the same way.
"""
from matplotlib.backends.backend_agg import FigureCanvasAgg as FigureCanvas  # noqa: F401

from . import display as _display


def show(*args, **kwargs):
    _display.flush_figures()
