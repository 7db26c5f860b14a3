"""Namespace checkpoints: the picklable part of the user namespace to a file,
and back into a new kernel of the same session.

The host runs :func:`save` and :func:`restore` as silent cells (no
``execution_count``, no history). It never unpickles a checkpoint itself: the
bytes go from this kernel's file to the host's store and back into the next
kernel of the session, where :func:`restore` reads them inside that kernel's
sandbox. A session is one trust domain, so a cell that forges its own
session's checkpoint only changes what its own session gets back.

File layout (``FORMAT``): the magic line, then one pickled value per saved
name, each preceded by its length (8 bytes, little endian), then the index
(a plain pickle of builtin types: names, offsets, lengths, modules, the
pickler, the execution count) and its offset (8 bytes). Each variable is
pickled on its own, so one that cannot be saved (or loaded) is named and the
rest still come back; two names bound to one object come back as two copies.

Both functions print one line ``CELLHOST-CHECKPOINT <json>`` to fd 1: the
report the host reads.
"""
from .prims import BUILTINS as __builtins__  # noqa: F401,E402 - see prims
import pickle as _pickle
import time as _time
import types as _types

from . import prims, state

MAGIC = b"CELLHOST-CKPT1\n"
REPORT_PREFIX = "CELLHOST-CHECKPOINT "
# Names the worker binds itself (history, IPython's conveniences).
_OWN = frozenset(("_", "__", "___", "_i", "_ii", "_iii", "_ih", "_oh", "_dh",
                  "In", "Out", "exit", "quit", "get_ipython"))
# At most this many names are listed in a report (the host caps again).
MAX_LISTED = 100


class _TooLarge(Exception):
    pass


class _Bounded:
    """A file whose writes stop at ``cap`` bytes in all."""

    def __init__(self, f, cap):
        self.f = f
        self.cap = cap

    def write(self, b):
        n = memoryview(b).nbytes
        if self.f.tell() + n > self.cap:
            raise _TooLarge()
        return self.f.write(b)


def _pickler():
    """The best pickler importable here: cloudpickle, dill, else pickle."""
    for name in ("cloudpickle", "dill"):
        try:
            mod = __import__(name)
            return name, mod
        except Exception:  # noqa: B902 - any failure means "not usable"
            continue
    return "pickle", _pickle


def _skipped(name):
    if name in _OWN or (name.startswith("__") and name.endswith("__")):
        return True
    if name.startswith("_i") and name[2:].isdigit():
        return True
    return name.startswith("_") and name[1:].isdigit()


def _defined_in_cells(value):
    """Functions, classes and their instances whose home is ``__main__``:
    plain pickle saves them by reference, which a new kernel cannot load."""
    try:
        if isinstance(value, (_types.FunctionType, type)):
            return getattr(value, "__module__", None) == "__main__"
        return getattr(type(value), "__module__", None) == "__main__"
    except Exception:  # noqa: B902
        return True


def _report(obj):
    line = REPORT_PREFIX + prims.dumps(obj) + "\n"
    data = line.encode("utf-8", "replace")
    while data:
        n = prims.os.write(1, data)
        data = data[n:]


def _le(n):
    return int(n).to_bytes(8, "little")


def save(path, max_bytes, execution_count):
    """Writes the namespace's picklable part to ``path`` (a new file), at
    most ``max_bytes`` bytes; reports what was saved and what was not."""
    started = _time.monotonic()
    ns = prims.MODULES["__main__"].__dict__
    pname, pmod = _pickler()
    modules, lost, entries = {}, [], []
    f = open(path, "xb")
    ok = False
    try:
        f.write(MAGIC)
        out = _Bounded(f, max_bytes)
        for name in sorted(k for k in list(ns) if isinstance(k, str)):
            if _skipped(name):
                continue
            value = ns.get(name)
            tname = prims.type_name(value)
            try:
                home = prims.exact_str(getattr(value, "__module__", None)) or ""
            except Exception:  # noqa: B902
                home = ""
            if home.startswith("cellhost_worker"):
                continue  # the worker's own (its audited ``open``): every kernel has it
            if isinstance(value, _types.ModuleType):
                modname = prims.exact_str(getattr(value, "__name__", None))
                if modname:
                    modules[name] = modname
                else:
                    lost.append({"name": name, "type": tname, "reason": "a module without a name"})
                continue
            if pname == "pickle" and _defined_in_cells(value):
                lost.append({"name": name, "type": tname,
                             "reason": "defined in a cell: saving it needs cloudpickle or dill in the kernel's environment"})
                continue
            start = f.tell()
            try:
                f.write(_le(0))
                pmod.dump(value, out, protocol=_pickle.HIGHEST_PROTOCOL)
            except KeyboardInterrupt:
                raise
            except _TooLarge:
                f.seek(start)
                f.truncate()
                lost.append({"name": name, "type": tname,
                             "reason": "the checkpoint would pass its cap of %d bytes" % max_bytes})
                continue
            except BaseException as exc:  # noqa: B902 - the object's own pickling code failed
                f.seek(start)
                f.truncate()
                lost.append({"name": name, "type": tname,
                             "reason": "not picklable (%s: %s)" % (prims.type_name(exc), prims.exc_text(exc)[:200])})
                continue
            end = f.tell()
            f.seek(start)
            f.write(_le(end - start - 8))
            f.seek(end)
            entries.append((name, start, end - start - 8))
        index_at = f.tell()
        _pickle.dump({"format": 1, "pickler": pname, "entries": entries, "modules": modules,
                      "execution_count": int(execution_count)}, f, protocol=4)
        f.write(_le(index_at))
        size = f.tell()
        ok = True
    finally:
        f.close()
        if not ok:
            try:
                prims.os.unlink(path)
            except OSError:
                pass
    _report({
        "ok": True, "bytes": size, "pickler": pname,
        "saved": [e[0] for e in entries][:MAX_LISTED],
        "modules": sorted(modules)[:MAX_LISTED],
        "lost": lost[:MAX_LISTED],
        "ms": int((_time.monotonic() - started) * 1000),
    })


def restore(path):
    """Loads the checkpoint at ``path`` into the namespace (then removes the
    file) and sets the execution count it was taken at."""
    started = _time.monotonic()
    ns = prims.MODULES["__main__"].__dict__
    restored, lost = [], []
    try:
        f = open(path, "rb")
    except OSError as exc:
        _report({"ok": False, "error": "cannot open the checkpoint: %s" % prims.exc_text(exc)})
        return
    try:
        try:
            if f.read(len(MAGIC)) != MAGIC:
                raise ValueError("not a cellhost checkpoint")
            f.seek(-8, 2)
            end = f.tell()
            index_at = int.from_bytes(f.read(8), "little")
            if not len(MAGIC) <= index_at < end:
                raise ValueError("its index is out of bounds")
            f.seek(index_at)
            index = _pickle.loads(f.read(end - index_at))
            if not isinstance(index, dict) or index.get("format") != 1:
                raise ValueError("unknown checkpoint format")
        except Exception as exc:  # noqa: B902 - any damage: nothing is restored
            _report({"ok": False, "error": "the checkpoint is damaged: %s" % prims.exc_text(exc)[:300]})
            return
        pname = index.get("pickler", "pickle")
        loader = _pickle
        if pname != "pickle":
            try:
                loader = __import__(pname)
            except Exception:  # noqa: B902
                loader = None
        for name, modname in sorted(dict(index.get("modules", {})).items()):
            try:
                __import__(modname)
                ns[name] = prims.MODULES[modname]
                restored.append(name)
            except Exception as exc:  # noqa: B902
                lost.append({"name": name, "type": "module",
                             "reason": "import %s failed (%s)" % (modname, prims.type_name(exc))})
        for entry in index.get("entries", []):
            try:
                name, at, length = entry
                name = prims.exact_str(name)
                if loader is None:
                    raise ImportError("the checkpoint was written with %s, which is not importable here" % pname)
                if not (len(MAGIC) <= at and at + 8 + length <= index_at):
                    raise ValueError("its bytes are out of bounds")
                f.seek(at + 8)
                value = loader.loads(f.read(length))
            except KeyboardInterrupt:
                raise
            except BaseException as exc:  # noqa: B902 - the object's own loading code failed
                lost.append({"name": prims.exact_str(entry[0]) if isinstance(entry, tuple) and entry else "?",
                             "type": "?",
                             "reason": "could not be loaded (%s: %s)" % (prims.type_name(exc), prims.exc_text(exc)[:200])})
                continue
            ns[name] = value
            restored.append(name)
        count = index.get("execution_count", 0)
        if isinstance(count, int) and count >= 0:
            state.execution_count = count
    finally:
        f.close()
        try:
            prims.os.unlink(path)
        except OSError:
            pass
    _report({
        "ok": True, "restored": sorted(restored)[:MAX_LISTED], "lost": lost[:MAX_LISTED],
        "pickler": pname, "ms": int((_time.monotonic() - started) * 1000),
    })


def resume_count(count):
    """Sets the execution count after the host replayed a lost kernel's cells
    as silent cells: the next cell continues from the original count."""
    if isinstance(count, int) and count >= 0:
        state.execution_count = count
