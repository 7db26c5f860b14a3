"""Variable inspection that never calls arbitrary ``__repr__``."""
from .prims import BUILTINS as __builtins__  # noqa: F401,E402 - see prims
import sys
import types

from . import history, prims

_ModuleType = types.ModuleType
_modules = prims.MODULES
_qualname = type.__dict__["__qualname__"].__get__
_module_of = type.__dict__["__module__"].__get__

_SCALARS = (int, float, complex, bool, type(None))
_CONTAINERS = (list, tuple, dict, set, frozenset, str, bytes, bytearray)
_CONTAINER_IDS = frozenset(id(t) for t in _CONTAINERS)
_SCALAR_IDS = frozenset(id(t) for t in _SCALARS)
PREVIEW = 120


def _preview(value):
    t = type(value)
    try:
        if t is str or t is bytes or t is bytearray:
            text = repr(value[:PREVIEW])
            return text + ("…" if len(value) > PREVIEW else "")
        if t is int and value.bit_length() > 256:
            return "<int with %d bits>" % value.bit_length()
        if id(t) in _SCALAR_IDS:
            return repr(value)
    except Exception:
        return None
    return None


def _type_label(t):
    qual = prims.exact_str(_qualname(t)) or "?"
    mod = prims.exact_str(_module_of(t))
    return qual if mod is None or mod == "builtins" else "%s.%s" % (mod, qual)


def describe(name, value):
    t = type(value)
    info = {"name": name, "type": _type_label(t)}
    if id(t) in _CONTAINER_IDS:
        info["len"] = len(value)
        info["size_bytes"] = sys.getsizeof(value)
    np = _modules.get("numpy")
    pd = _modules.get("pandas")
    if np is not None and issubclass(t, np.ndarray):
        info["shape"] = list(value.shape)
        info["dtype"] = str(value.dtype)
        info["size_bytes"] = int(value.nbytes)
    elif pd is not None and issubclass(t, (pd.DataFrame, pd.Series)):
        info["shape"] = list(value.shape)
        if issubclass(t, pd.DataFrame):
            info["columns"] = [str(c) for c in list(value.columns[:50])]
            info["dtypes"] = sorted({str(d) for d in value.dtypes})
        else:
            info["dtype"] = str(value.dtype)
    elif np is not None and issubclass(t, np.generic):
        info["dtype"] = str(value.dtype)
        try:
            info["preview"] = str(value.item())[:PREVIEW]
        except Exception:
            pass
    preview = _preview(value)
    if preview is not None:
        info["preview"] = preview
    return info


def inspect(namespace, limit):
    out, total = [], 0
    for name, value in list(dict.items(namespace)):
        name = prims.exact_str(name)
        if name is None or name.startswith("_") or name in history.HIDDEN or issubclass(type(value), _ModuleType):
            continue
        total += 1
        if len(out) < limit:
            try:
                out.append(describe(name, value))
            except BaseException as exc:  # noqa: B902 - the value's own code
                out.append({"name": name, "type": prims.type_name(value),
                            "error": "%s: %s" % (prims.type_name(exc), prims.exc_text(exc))})
    return out, total > limit
