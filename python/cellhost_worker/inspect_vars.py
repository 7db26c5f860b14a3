"""Variable inspection that never calls arbitrary ``__repr__``."""
import sys
import types

_SCALARS = (int, float, complex, bool, type(None))
_CONTAINERS = (list, tuple, dict, set, frozenset, str, bytes, bytearray)
PREVIEW = 120


def _preview(value):
    t = type(value)
    try:
        if t in (str, bytes, bytearray):
            text = repr(value[:PREVIEW])
            return text + ("…" if len(value) > PREVIEW else "")
        if t is int and value.bit_length() > 256:
            return "<int with %d bits>" % value.bit_length()
        if t in _SCALARS:
            return repr(value)
    except Exception:
        return None
    return None


def describe(name, value):
    t = type(value)
    info = {"name": name, "type": t.__qualname__ if t.__module__ == "builtins" else "%s.%s" % (t.__module__, t.__qualname__)}
    if t in _CONTAINERS:
        info["len"] = len(value)
        info["size_bytes"] = sys.getsizeof(value)
    np = sys.modules.get("numpy")
    pd = sys.modules.get("pandas")
    if np is not None and isinstance(value, np.ndarray):
        info["shape"] = list(value.shape)
        info["dtype"] = str(value.dtype)
        info["size_bytes"] = int(value.nbytes)
    elif pd is not None and isinstance(value, (pd.DataFrame, pd.Series)):
        info["shape"] = list(value.shape)
        if isinstance(value, pd.DataFrame):
            info["columns"] = [str(c) for c in list(value.columns[:50])]
            info["dtypes"] = sorted({str(d) for d in value.dtypes})
        else:
            info["dtype"] = str(value.dtype)
    elif np is not None and isinstance(value, np.generic):
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
    for name, value in list(namespace.items()):
        if name.startswith("_") or isinstance(value, types.ModuleType):
            continue
        total += 1
        if len(out) < limit:
            try:
                out.append(describe(name, value))
            except Exception as exc:
                out.append({"name": name, "type": type(value).__name__, "error": "%s: %s" % (type(exc).__name__, exc)})
    return out, total > limit
