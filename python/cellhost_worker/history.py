"""IPython's history names in the kernel's namespace: ``In``/``_ih`` (the
cells' sources as run, ``In[0]`` empty), ``Out``/``_oh`` (results by
execution_count), ``_i``/``_ii``/``_iii`` and ``_iN``, ``_``/``__``/``___``
and ``_N``. Silent cells leave them alone; a result hidden by a trailing
``;`` is not stored, as in IPython.
"""
from .prims import BUILTINS as __builtins__  # noqa: F401,E402 - see prims

# Names of the kernel's own that variable listings and %who leave out.
HIDDEN = frozenset(("In", "Out", "get_ipython", "exit", "quit"))

In = [""]
Out = {}


def install(namespace):
    """Binds the history names (at start-up)."""
    reinstall(namespace)
    for name in ("_", "__", "___", "_i", "_ii", "_iii"):
        namespace.setdefault(name, "")


def reinstall(namespace):
    """Binds ``In``/``Out`` again (after IPython's shell bound its own)."""
    namespace["In"] = namespace["_ih"] = In
    namespace["Out"] = namespace["_oh"] = Out


def record_input(namespace, count, source):
    """Before cell ``count`` runs: its source becomes ``In[count]`` and ``_i``."""
    while len(In) < count:
        In.append("")
    if len(In) == count:
        In.append(source)
    else:
        In[count] = source
    namespace["_iii"] = namespace.get("_ii", "")
    namespace["_ii"] = namespace.get("_i", "")
    namespace["_i"] = source
    namespace["_i%d" % count] = source


def record_output(namespace, count, value):
    """Cell ``count``'s displayed result: ``Out[count]``, ``_count`` and the
    ``_``/``__``/``___`` shift, which stops while the cell's code has bound
    one of them to something of its own and skips ``Out`` itself
    (IPython's rules)."""
    Out[count] = value
    namespace["_%d" % count] = value
    if value is Out:
        # IPython leaves the shift alone when the result is ``Out`` itself
        # (no recursive reference in ``_``).
        return
    update = True
    for i, name in enumerate(("_", "__", "___")):
        if name in namespace and namespace[name] is not _unders[i]:
            update = False
    _unders[2], _unders[1], _unders[0] = _unders[1], _unders[0], value
    if update:
        namespace["_"], namespace["__"], namespace["___"] = _unders[0], _unders[1], _unders[2]


_unders = ["", "", ""]
