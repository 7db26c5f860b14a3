"""What the worker calls, bound once at start-up, before any cell runs.

A cell runs in the same interpreter as the worker and may rebind or delete
builtins, replace modules in ``sys.modules``, or patch their attributes
(``json.dumps = None``, ``os.write = print``). None of that may reach the
worker's own code, so every worker module:

* runs with a private copy of the builtins (``from .prims import BUILTINS as
  __builtins__`` before its first ``def``): ``len``, ``isinstance``,
  ``KeyboardInterrupt`` … keep meaning what they meant at start-up;
* calls C functions captured here (``os`` as a snapshot of the ``posix``
  functions, ``_signal``, ``_thread``, ``_json``) rather than looking them up
  on a module a cell can patch;
* treats every object a cell hands it as hostile: type names are read with
  ``type``'s own descriptor (a metaclass may lie), strings are copied to exact
  ``str`` before use (a ``str`` subclass may override ``__len__``).

A session is one trust domain: a cell can still reach the worker's objects
(``sys.modules['cellhost_worker.main']``) and change later cells of its own
session. What this module protects is the worker's protocol writer and reader
against the accidental or careless damage ordinary code does.
"""
import builtins as _builtins_module

# Taken before anything else of the worker runs: the real builtins.
BUILTINS = dict(_builtins_module.__dict__)

import _json  # noqa: E402
import _signal  # noqa: E402
import _thread  # noqa: E402
import binascii  # noqa: E402
import fcntl as _fcntl_module  # noqa: E402
import os as _os_module  # noqa: E402
import sys  # noqa: E402
import types as _types  # noqa: E402
from _queue import SimpleQueue  # noqa: E402,F401
from json.decoder import JSONDecoder as _JSONDecoder  # noqa: E402

__builtins__ = BUILTINS

os = _types.SimpleNamespace(**_os_module.__dict__)
signal = _types.SimpleNamespace(**_signal.__dict__)
_fcntl = _types.SimpleNamespace(**_fcntl_module.__dict__)
MODULES = sys.modules  # the real module dict, whatever a cell binds to sys.modules later
get_ident = _thread.get_ident
get_native_id = _thread.get_native_id
allocate_lock = _thread.allocate_lock
# Reentrant: a write from a __del__ or gc callback that runs inside a write
# of the same thread must not deadlock.
RLock = _thread.RLock
start_new_thread = _thread.start_new_thread
b2a_base64 = binascii.b2a_base64
b2a_hex = binascii.b2a_hex
settrace = sys.settrace
gettrace = sys.gettrace
setprofile = sys.setprofile
getprofile = sys.getprofile
getrecursionlimit = sys.getrecursionlimit
setrecursionlimit = sys.setrecursionlimit
exc_info = sys.exc_info

_type_name = type.__dict__["__name__"].__get__
_exact_str = str.__str__
_base_str = BaseException.__str__
_str_join = "".join
_b_decode = bytes.decode
_int_index = int.__index__

# The worker never needs a deeper stack than this; a cell's lower limit is
# lifted while worker code runs and put back before the next cell's code.
RECURSION_FLOOR = 1000


def type_name(obj):
    """The name of ``type(obj)``, never calling code of the object's class."""
    try:
        return _exact_str(_type_name(type(obj)))
    except BaseException:  # noqa: B902 - a hostile class must not break the worker
        return "object"


def exact_str(s):
    """``s`` (a ``str`` or subclass) as an exact ``str``; None for anything else."""
    if issubclass(type(s), str):
        return _exact_str(s)
    return None


def exc_text(exc):
    """``str(exc)`` with a fallback when the exception's ``__str__`` fails."""
    try:
        return _exact_str(str(exc))
    except BaseException:  # noqa: B902
        pass
    try:
        return _exact_str(_base_str(exc))
    except BaseException:  # noqa: B902
        return "<str() of the exception failed>"


def quiet_tracing():
    """Turns off ``sys.settrace``/``sys.setprofile`` on this thread; returns
    what was set, so a cell's tracer can be put back for its next cell.
    Never raises: a tracer that raises is unset by the interpreter."""
    tracer = profiler = None
    for _ in range(3):
        try:
            tracer = gettrace()
            if tracer is not None:
                settrace(None)
            profiler = getprofile()
            if profiler is not None:
                setprofile(None)
            return tracer, profiler
        except BaseException:  # noqa: B902 - the tracer ran and raised
            continue
    return tracer, profiler


def lift_recursion_limit():
    """Lifts a cell's low recursion limit for worker code; returns the
    cell's limit (to put back) or None."""
    try:
        limit = getrecursionlimit()
        if limit < RECURSION_FLOOR:
            setrecursionlimit(RECURSION_FLOOR)
            return limit
    except BaseException:  # noqa: B902
        pass
    return None


def restore_recursion_limit(limit):
    if limit is not None:
        try:
            setrecursionlimit(limit)
        except BaseException:  # noqa: B902
            pass


# ------------------------------------------------------------------- JSON

def _json_default(obj):
    try:
        text = repr(obj)
        if issubclass(type(text), str):
            return _exact_str(text)
    except Exception:
        pass
    return "<%s object>" % type_name(obj)


def dumps(obj):
    """Compact, strict JSON (UTF-8 kept) through the C encoder only. Objects
    JSON cannot hold become their repr; keys it cannot hold are skipped.
    Raises ValueError (NaN or infinity, which the host's parser refuses;
    circular containers) or whatever a hostile ``dict.items`` raises."""
    enc = _json.make_encoder({}, _json_default, _json.encode_basestring, None, ":", ",", False, True, False)
    return _str_join(enc(obj, 0))


_scan = _json.make_scanner(_JSONDecoder())
_WS = " \t\r\n"


def loads_line(line):
    """One JSON object from one line of bytes (C scanner only); None if the
    line is not one JSON object."""
    try:
        text = _b_decode(line, "utf-8")
    except UnicodeDecodeError:
        return None
    n = len(text)
    i = 0
    while i < n and text[i] in _WS:
        i += 1
    try:
        obj, end = _scan(text, i)
    except (StopIteration, ValueError, RecursionError):
        return None
    while end < n and text[end] in _WS:
        end += 1
    if end != n or type(obj) is not dict:
        return None
    return obj


# ------------------------------------------------------- guarded descriptors

LOST_EXIT = 75


def lost(what, why=None):
    """The worker cannot go on: a cell closed every copy of ``what`` (the
    control channel or an output pipe), or ``why``, so no cell could ever
    end again. Leave at once, so the host reports the kernel crashed
    instead of waiting."""
    why = why or "the cell's code closed every copy of the %s" % what
    msg = ("cellhost worker: %s; the kernel cannot go on\n" % why).encode()
    for fd in (2, 1):
        try:
            os.write(fd, msg)
            break
        except BaseException:  # noqa: B902
            continue
    os._exit(LOST_EXIT)


def _identity(fd):
    st = os.fstat(fd)
    return (st.st_dev, st.st_ino)


def _incarnation():
    """This process's start time (``/proc/self/stat`` field 22) and time
    namespace, or None. A process restored from a process checkpoint
    (CRIU) starts anew in a new time namespace whose offsets may make its
    start time read as before: one of the two changes, and so do the
    identities of the descriptors the host handed it again."""
    try:
        fd = os.open("/proc/self/stat", os.O_RDONLY | os.O_CLOEXEC)
        try:
            s = os.read(fd, 4096)
        finally:
            os.close(fd)
        started = s[s.rindex(b")") + 2:].split()[19]
    except (OSError, ValueError, IndexError):
        return None
    try:
        timens = os.stat("/proc/self/ns/time").st_ino
    except OSError:
        timens = None
    return (started, timens)


class GuardedFd:
    """A descriptor the worker depends on (its control socket, the host's
    output pipes), kept at two high close-on-exec numbers. A cell that
    closes or ``dup2``s over one is repaired from the other: :meth:`fd`
    checks the identity (device, inode) of the open file first."""

    def __init__(self, fd, low):
        self.ident = _identity(fd)
        self.started = _incarnation()
        self.fds = [_fcntl.fcntl(fd, _fcntl.F_DUPFD_CLOEXEC, low) for _ in range(2)]

    def _restored(self):
        """After a process restore (a new incarnation), both copies
        name the new file the host handed over: take its identity."""
        now = _incarnation()
        if now is None or self.started is None or now == self.started:
            return False
        try:
            idents = {_identity(f) for f in self.fds}
        except OSError:
            return False
        if len(idents) != 1:
            return False
        self.ident = idents.pop()
        self.started = now
        return True

    def _ok(self, fd):
        try:
            return _identity(fd) == self.ident
        except OSError:
            return False

    def fd(self, extra=()):
        """A descriptor on the original file, repairing the copies a cell
        broke; ``extra`` are further numbers to try as the source. Raises
        OSError when no copy is left (the cell closed them all)."""
        good = None
        for f in self.fds:
            if self._ok(f):
                good = f
                break
        if good is None:
            for f in extra:
                if self._ok(f):
                    good = f
                    break
        if good is None:
            # After a process restore the identity is taken anew (by this
            # thread, or by another one at the same time): look again.
            self._restored()
            for f in self.fds:
                if self._ok(f):
                    good = f
                    break
        if good is None:
            raise OSError(9, "every copy of the descriptor was closed or replaced")
        for f in self.fds:
            if f != good and not self._ok(f):
                try:
                    os.dup2(good, f, inheritable=False)
                except OSError:
                    pass
        return self.fds[0] if self._ok(self.fds[0]) else good

    def close_all(self):
        for f in self.fds:
            try:
                os.close(f)
            except OSError:
                pass
