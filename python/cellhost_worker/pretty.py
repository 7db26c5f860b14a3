"""``text/plain`` of results by IPython's display rules.

IPython's own pretty printer (``IPython.lib.pretty``, width 79, at most
1000 items per container; the shell's formatter, with the type printers
libraries registered, once the shell exists) when IPython is importable;
otherwise :func:`fallback`, which follows the same rules for the common
cases: containers wrapped one item per line past 79 columns, classes as
``module.Name``, functions as ``<function module.name(signature)>``,
objects with ``object``'s repr as ``<module.Name at 0x…>``, a
``_repr_pretty_`` method honoured. Exact ``int``/``float``/``str``/
``bytes``/``bool``/``None`` take ``repr`` on both paths (IPython's output
for them), so a scalar result imports nothing.
"""
from .prims import BUILTINS as __builtins__  # noqa: F401,E402 - see prims

from . import prims

_modules = prims.MODULES
_SCALARS = frozenset(id(t) for t in (int, float, str, bytes, bool, type(None), complex))
_object_repr = object.__repr__
WIDTH = 79
MAX_SEQ = 1000
_ipython_pretty = None


def text_plain(obj):
    """The ``text/plain`` of ``obj``; raises what the object's code raises."""
    if id(type(obj)) in _SCALARS:
        return repr(obj)
    from . import magics
    if magics.ipython_available():
        sh = magics._shell
        if sh is not None and type(sh) is not magics.BuiltinShell:
            fmt = sh.display_formatter.formatters.get("text/plain")
            if fmt is not None:
                text = fmt(obj)
                if text is not None:
                    return text
        global _ipython_pretty
        if _ipython_pretty is None:
            try:
                from IPython.lib.pretty import pretty as _p
                _ipython_pretty = _p
            except ImportError:
                _ipython_pretty = False
        if _ipython_pretty:
            return _ipython_pretty(obj, max_width=WIDTH, max_seq_length=MAX_SEQ)
    return fallback(obj)


# ------------------------------------------------------------- fallback

def _qual(t):
    mod = getattr(t, "__module__", None)
    name = getattr(t, "__qualname__", None) or getattr(t, "__name__", "?")
    if mod and mod not in ("builtins", "__builtin__", "exceptions"):
        return "%s.%s" % (mod, name)
    return name


def _atom(obj, cycle_ids):
    """A one-piece rendering (no wrapping) of a non-container."""
    import types
    t = type(obj)
    if id(t) in _SCALARS:
        return repr(obj)
    pretty_method = getattr(t, "_repr_pretty_", None)
    if pretty_method is not None and callable(pretty_method):
        return _via_repr_pretty(obj)
    if isinstance(obj, type):
        if getattr(t, "__repr__", None) is not type.__repr__ and type(t) is not type:
            return repr(obj)
        return _qual(obj)
    if isinstance(obj, (types.FunctionType, types.BuiltinFunctionType)):
        name = _qual(obj)
        try:
            import inspect
            sig = str(inspect.signature(obj))
        except (TypeError, ValueError):
            sig = ""
        return "<function %s%s>" % (name, sig)
    if getattr(t, "__repr__", None) is _object_repr:
        return "<%s at 0x%x>" % (_qual(t), id(obj))
    return repr(obj)


class _Printer:
    """Enough of IPython's ``PrettyPrinter`` for a ``_repr_pretty_`` method."""

    def __init__(self):
        self.parts = []
        self.indentation = 0

    def text(self, s):
        self.parts.append(s)

    def pretty(self, obj):
        self.parts.append(fallback(obj))

    def breakable(self, sep=" "):
        self.parts.append(sep)

    def break_(self):
        self.parts.append("\n")

    def begin_group(self, indent=0, open=""):
        self.parts.append(open)

    def end_group(self, dedent=0, close=""):
        self.parts.append(close)

    def group(self, indent=0, open="", close=""):
        printer = self

        class _G:
            def __enter__(self_inner):
                printer.text(open)

            def __exit__(self_inner, *a):
                printer.text(close)
        return _G()

    def indent(self, n):
        return self.group()


def _via_repr_pretty(obj):
    p = _Printer()
    obj._repr_pretty_(p, False)
    return "".join(p.parts)


def _container_parts(obj):
    """(open, close, items, is_dict) for a container IPython wraps, else None."""
    t = type(obj)
    if t is list or (issubclass(t, list) and t.__repr__ is list.__repr__):
        return "[", "]", list(obj), False
    if t is tuple:
        return "(", ",)" if len(obj) == 1 else ")", list(obj), False
    if t is dict or (issubclass(t, dict) and t.__repr__ is dict.__repr__):
        return "{", "}", list(obj.items()), True
    if t is set or t is frozenset:
        if not obj:
            return None
        items = list(obj)
        try:
            items = sorted(items)
        except Exception:  # noqa: B902 - unorderable: as iterated
            pass
        if t is frozenset:
            return "frozenset({", "})", items, False
        return "{", "}", items, False
    return None


def fallback(obj, indent=0, seen=None):
    """IPython-style ``text/plain`` without IPython."""
    seen = seen if seen is not None else set()
    parts = _container_parts(obj)
    if parts is None:
        return _atom(obj, seen)
    if id(obj) in seen:
        o, c, _, _ = parts
        return o + "..." + c
    seen = seen | {id(obj)}
    open_, close, items, is_dict = parts
    more = len(items) > MAX_SEQ
    items = items[:MAX_SEQ]
    inner = indent + len(open_)
    rendered = []
    for it in items:
        if is_dict:
            k = fallback(it[0], inner, seen)
            v = fallback(it[1], inner + len(k) + 2, seen)
            rendered.append("%s: %s" % (k, v))
        else:
            rendered.append(fallback(it, inner, seen))
    if more:
        rendered.append("...")
    one_line = open_ + ", ".join(rendered) + close
    if "\n" not in one_line and indent + len(one_line) <= WIDTH:
        return one_line
    return open_ + (",\n" + " " * inner).join(rendered) + close
