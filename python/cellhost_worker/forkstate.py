"""Fork of a live session: the state of the namespace written to a file by
the parent's worker (``snapshot``) and read back by the new session's
worker (``restore``). See ``cellhost_sessions::requests::fork`` for why a
fork is a new kernel of its own that receives the parent's state, and not a
``fork(2)`` of the parent's confined worker.

``snapshot(path, threads)`` runs as a silent cell of the parent (no
``execution_count`` of its own) while no other cell runs. It prints one JSON
line: ``{"ok": true, "names", "lost": {name: why}, "modules",
"execution_count", "threads", "bytes"}`` or ``{"ok": false, "code":
"threads_running", "threads": [...]}``.

* Python threads other than the main thread (a cell's ``threading.Thread``)
  cannot be carried into another process: the fork is refused naming them,
  unless ``threads == "drop"`` (the new session starts without them).
* Values: one pickle (protocol 5; cloudpickle or dill when the interpreter
  has them) of every user name, so objects shared between names stay shared.
  Functions defined in cells are carried as their code (``marshal``) bound to
  the new namespace. When the whole pickle fails, each name is pickled on its
  own and those that cannot be are named in ``lost`` with the reason.
* Modules bound to names (``np``) travel by name and are imported again;
  the other modules the cells imported (``sys.modules`` beyond the worker's
  own start) are listed in ``modules`` and imported in the new kernel.
* Open files, sockets, threads and locks do not travel (a pickle refuses
  them; they are in ``lost``).

Copy-on-write fork (a worker whose sandbox is off: nothing confines it to
namespaces, mounts or a Landlock domain of its own, so a ``fork(2)`` of it
is a kernel no weaker than a cold one of that mode):

* ``cow_arm(path, token, threads)`` runs as a silent cell of the parent. It
  refuses for threads as ``snapshot`` does, else prints ``{"ok": true,
  "execution_count", "threads", "pid"}`` and leaves the fork to the worker's
  main loop, which calls ``cow_fork`` once the cell's response is sent (no
  cell running, the namespace quiescent).
* ``cow_fork()`` connects to the host's Unix socket at ``path``, says
  ``{"type": "cow_hello", "token", "pid"}``, receives the host's ``fork``
  request with its four descriptors (the template's protocol, see
  :mod:`cellhost_worker.template`) and forks the new kernel exactly as a
  template does; the copy of the worker (``template._worker`` with
  ``resume``) closes the parent's channel and every other inherited
  descriptor, enters the new kernel's working directory and goes on as a
  worker (``main.resume_forked``) with the parent's namespace.

``restore(path, execution_count)`` runs as a silent cell of the new kernel:
imports the modules, loads the values into the namespace, sets the
execution count, reseeds ``random`` and numpy's global generator (a fork
must not repeat its parent's random draws), removes the file and prints
``{"ok": true, "names", "lost", "modules_failed"}``.
"""
from .prims import BUILTINS as __builtins__  # noqa: F401,E402 - see prims
import io
import marshal
import pickle
import sys
import types

from . import prims, state

os = prims.os

# Names the worker binds in every namespace (history, magics): each kernel
# has its own.
_WORKER_NAMES = frozenset(("In", "Out", "_ih", "_oh", "_", "__", "___", "_i", "_ii", "_iii",
                           "get_ipython", "exit", "quit"))
# Modules the worker had when the first cell ran are not the cells' imports.
_BASELINE = frozenset(prims.MODULES)


def _hidden():
    """Names IPython's shell put into the namespace (``open``, ``exit``,
    ``_dh`` …), when the worker runs one: each kernel's shell binds its own."""
    magics = prims.MODULES.get("cellhost_worker.magics")
    sh = getattr(magics, "_shell", None)
    try:
        return dict(getattr(sh, "user_ns_hidden", None) or {})
    except Exception:
        return {}


def _user_names(ns):
    out = []
    hidden = _hidden()
    for name in list(ns):
        if type(name) is not str or name.startswith("__") or name in _WORKER_NAMES:
            continue
        if name in hidden and hidden[name] is ns[name]:
            continue
        if len(name) > 2 and name[:2] == "_i" and name[2:].isdigit():
            continue
        # The worker's own objects (the audited ``open``, ``display``):
        # every kernel binds its own.
        mod = getattr(ns[name], "__module__", None)
        if type(mod) is str and mod.split(".")[0] == "cellhost_worker":
            continue
        out.append(name)
    return out


def _make_function(code, name, defaults, kwdefaults, attrs, qualname):
    ns = prims.MODULES["__main__"].__dict__
    fn = types.FunctionType(marshal.loads(code), ns, name, defaults)
    fn.__kwdefaults__ = kwdefaults
    fn.__qualname__ = qualname
    if attrs:
        fn.__dict__.update(attrs)
    return fn


def _pickler_class():
    for mod in ("cloudpickle", "dill"):
        m = prims.MODULES.get(mod)
        if m is None:
            try:
                m = __import__(mod)
            except Exception:
                continue
        p = getattr(m, "Pickler", None) or getattr(m, "CloudPickler", None)
        if p is not None:
            return p, mod
    return _CellPickler, "pickle"


class _CellPickler(pickle.Pickler):
    """pickle, plus functions of the cells' namespace (``__main__``) by
    value: their code and defaults, bound to the new namespace on load."""

    def reducer_override(self, obj):
        if type(obj) is types.FunctionType and obj.__module__ == "__main__" and obj.__closure__ is None:
            return (_make_function, (marshal.dumps(obj.__code__), obj.__name__, obj.__defaults__,
                                     obj.__kwdefaults__, dict(obj.__dict__) or None, obj.__qualname__))
        if type(obj) is types.ModuleType:
            return (_import, (obj.__name__,))
        return NotImplemented


def _import(name):
    __import__(name)
    return prims.MODULES[name]


def _user_threads():
    threading = prims.MODULES.get("threading")
    if threading is None:
        return []
    out = []
    try:
        main = threading.main_thread()
        for t in list(dict.values(threading._active)):
            if t is main or type(t).__name__ == "_DummyThread":
                continue
            out.append({"name": str(t.name), "native_id": t.native_id, "daemon": bool(t.daemon)})
    except Exception:
        pass
    return out


def _dump(f, pickler_cls, obj):
    p = pickler_cls(f, protocol=5)
    p.dump(obj)


def snapshot(path, threads="refuse"):
    ns = prims.MODULES["__main__"].__dict__
    running = _user_threads()
    if running and threads != "drop":
        print(prims.dumps({"ok": False, "code": "threads_running", "threads": running}))
        return
    names = _user_names(ns)
    pickler_cls, via = _pickler_class()
    lost = {}
    with io.open(path, "wb") as f:
        try:
            _dump(f, pickler_cls, ("all", {n: ns[n] for n in names}))
            kept = names
        except Exception:
            f.seek(0)
            f.truncate()
            kept = []
            for n in names:
                at = f.tell()
                try:
                    _dump(f, pickler_cls, ("one", n, ns[n]))
                    kept.append(n)
                except Exception as exc:  # noqa: B902 - named in lost, never fatal
                    f.seek(at)
                    f.truncate()
                    lost[n] = "%s: %s" % (type(exc).__name__, str(exc)[:200])
        size = f.tell()
    modules = sorted(m for m in list(prims.MODULES) if m not in _BASELINE and "." not in m
                     and not m.startswith("_"))
    print(prims.dumps({"ok": True, "names": kept, "lost": lost, "modules": modules, "via": via,
                       "execution_count": state.execution_count, "threads": running, "bytes": size}))


def reseed():
    """Fresh seeds for ``random`` and numpy's global generator: a fork
    must not repeat its parent's random draws."""
    seed = os.urandom(16)
    r = prims.MODULES.get("random")
    if r is not None:
        try:
            r.seed(seed)
        except Exception:
            pass
    np = prims.MODULES.get("numpy")
    if np is not None:
        try:
            np.random.seed(int.from_bytes(seed[:4], "little"))
        except Exception:
            pass


def restore(path, execution_count, modules=()):
    ns = prims.MODULES["__main__"].__dict__
    failed = {}
    for m in modules:
        try:
            __import__(m)
        except Exception as exc:  # noqa: B902 - reported, never fatal
            failed[m] = "%s: %s" % (type(exc).__name__, str(exc)[:200])
    names, lost = [], {}
    try:
        with io.open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            while f.tell() < size:
                item = pickle.load(f)
                if item[0] == "all":
                    ns.update(item[1])
                    names.extend(item[1])
                else:
                    ns[item[1]] = item[2]
                    names.append(item[1])
    except Exception as exc:  # noqa: B902 - what was loaded stays
        lost["*"] = "%s: %s" % (type(exc).__name__, str(exc)[:200])
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
    state.execution_count = int(execution_count)
    reseed()
    print(prims.dumps({"ok": True, "names": names, "lost": lost, "modules_failed": failed}))


# (path, token) of the copy-on-write fork the host asked for, done by the
# worker's main loop once the arming cell has ended.
pending = None

_COW_TIMEOUT = 30.0


def cow_arm(path, token, threads="refuse"):
    global pending
    running = _user_threads()
    if running and threads != "drop":
        print(prims.dumps({"ok": False, "code": "threads_running", "threads": running}))
        return
    pending = (str(path), str(token))
    print(prims.dumps({"ok": True, "execution_count": state.execution_count, "threads": running,
                       "names": _user_names(prims.MODULES["__main__"].__dict__), "pid": os.getpid()}))


def _read_request(sock, max_fds):
    import socket
    buf, fds = b"", []
    recv_fds = socket.recv_fds
    while b"\n" not in buf:
        data, got, _flags, _addr = recv_fds(sock, 1 << 20, max_fds)
        fds.extend(got)
        if not data:
            break
        buf += data
        if len(buf) > 1 << 20:
            break
    return prims.loads_line(buf.split(b"\n", 1)[0]), fds


def _reap(pid):
    try:
        os.waitpid(pid, 0)
    except BaseException:  # noqa: B902 - a cell reaped it (os.wait), or the worker ends
        pass


def cow_fork():
    """The fork ``cow_arm`` asked for (see the module's documentation)."""
    global pending
    path, token = pending
    pending = None
    import socket
    import warnings
    from . import template
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    fds = []
    try:
        sock.settimeout(_COW_TIMEOUT)
        sock.connect(path)
        sock.sendall((prims.dumps({"type": "cow_hello", "token": token, "pid": os.getpid()}) + "\n").encode())
        req, fds = _read_request(sock, template.MAX_FDS)
        if req is None or req.get("type") != "fork":
            for fd in fds:
                os.close(fd)
            return
        req["resume"] = True
        with warnings.catch_warnings():
            # Python 3.12+ warns of a fork with threads: the worker's control
            # reader is one, and the copy starts its own.
            warnings.simplefilter("ignore", DeprecationWarning)
            reply = template._fork(sock, req, fds, check_threads=False)
        fds = []
        if reply.get("type") == "forked":
            # The new kernel's init is this worker's child until this worker
            # ends: reap it when it ends first, so no zombie stays behind.
            prims.start_new_thread(_reap, (reply["pid"],))
        sock.sendall((prims.dumps(reply) + "\n").encode())
    finally:
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass
        sock.close()


def cow_resumed():
    """The first (silent) cell of a copy-on-write fork: names what it has."""
    print(prims.dumps({"ok": True, "names": _user_names(prims.MODULES["__main__"].__dict__)}))
