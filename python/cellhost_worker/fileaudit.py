"""Files a cell opens, from Python's ``open`` audit event.

One hook is installed at start (audit hooks cannot be removed); it returns
at once for every other event and while no cell's code runs, so it costs a
string comparison between cells. Opens by the interpreter's own library
directories (imports, ``.pyc`` files) and by the worker are left out.
"""
from .prims import BUILTINS as __builtins__  # noqa: F401,E402 - see prims
import os as _os_module
import sys
import sysconfig

from . import prims, state

os = prims.os
_abspath = _os_module.path.abspath

LIMIT = 256
_WORKER_DIR = _os_module.path.dirname(_abspath(__file__))

_seen = set()
_read = []
_write = []
_truncated = False
_skip = ()


def _prefixes():
    out = {_WORKER_DIR + os.sep}
    try:
        for key in ("stdlib", "platstdlib", "purelib", "platlib"):
            p = sysconfig.get_paths().get(key)
            if p:
                out.add(_abspath(p) + os.sep)
    except Exception:
        pass
    return tuple(out)


def _is_write(mode, flags):
    if isinstance(mode, str):
        return any(c in mode for c in "wax+")
    if isinstance(flags, int):
        return (flags & os.O_ACCMODE) != os.O_RDONLY or bool(flags & (os.O_CREAT | os.O_TRUNC | os.O_APPEND))
    return False


def _is_read(mode, flags):
    if isinstance(mode, str):
        return "r" in mode or "+" in mode
    if isinstance(flags, int):
        return (flags & os.O_ACCMODE) in (os.O_RDONLY, os.O_RDWR)
    return True


def _hook(event, args):
    if event != "open" or not state.running:
        return
    global _truncated
    try:
        path = args[0]
        if isinstance(path, int) or path is None:
            return
        path = os.fsdecode(path)
        if path.endswith(".pyc"):
            return
        path = _abspath(path)
        if path.startswith(_skip):
            return
        mode = args[1] if len(args) > 1 else None
        flags = args[2] if len(args) > 2 else None
        for kind, lst in (("r", _read), ("w", _write)):
            if (kind == "r" and _is_read(mode, flags)) or (kind == "w" and _is_write(mode, flags)):
                key = (kind, path)
                if key in _seen:
                    continue
                if len(_seen) >= LIMIT:
                    _truncated = True
                    return
                _seen.add(key)
                lst.append(path)
    except Exception:
        pass


def install():
    global _skip
    _skip = _prefixes()
    sys.addaudithook(_hook)


def reset():
    global _truncated
    _seen.clear()
    del _read[:]
    del _write[:]
    _truncated = False


def take():
    out = {"read": list(_read), "write": list(_write), "truncated": _truncated}
    reset()
    return out
