"""fd-level capture support: the cell's ``sys.stdout``/``sys.stderr`` and end markers.

The host reads fd 1 and fd 2 as raw bytes, so Python prints, C ``printf``,
``os.write`` and subprocesses all reach it in order. The objects installed as
``sys.stdout``/``sys.stderr`` write straight to the fd (no Python-side
buffer), except for threads that an earlier cell started: their writes go to
the host as ``background`` frames so they never mix into a later cell.
"""
from .prims import BUILTINS as __builtins__  # noqa: F401,E402 - see prims
import fcntl as _fcntl_module
import io
import mmap
import select as _select_module
import struct

from . import prims, state

os = prims.os
_fcntl = _fcntl_module.fcntl
_F_DUPFD_CLOEXEC = _fcntl_module.F_DUPFD_CLOEXEC
_select = _select_module.select
_unpack_from = struct.unpack_from
_mmap = mmap.mmap
_MADV_REMOVE = getattr(mmap, "MADV_REMOVE", None)

HIGH_FD = 1000
_saved = {}          # 1/2 -> prims.GuardedFd: high, close-on-exec copies of the original pipe
_identity = {}       # 1/2 -> (st_dev, st_ino) of the original pipe
channel = None       # set by main
_libc_fflush = None

# Output rings (see cellhost_protocol::frame::RingOffer): a large write goes
# into shared memory and only a token goes into the pipe, in its place.
RING_HEADER = 4096
RING_SIZE = 4 << 20
RING_MIN = 64 << 10
RING_WAIT_S = 1.0
_rings = {}          # 1/2 -> _Ring
# Held while a Python-level write decides where it goes and makes it, and
# while a cell's start marker is written after the background set changed:
# no write of a thread that just became background can land after the
# start marker (in the new cell's stream).
_write_lock = prims.RLock()


class _Ring:
    def __init__(self, name):
        memfd = os.memfd_create("cellhost-" + name, os.MFD_CLOEXEC)
        efd = os.eventfd(0, os.EFD_CLOEXEC)
        try:
            os.ftruncate(memfd, RING_HEADER + RING_SIZE)
            self.mm = _mmap(memfd, RING_HEADER + RING_SIZE)
            self.memfd = _fcntl(memfd, _F_DUPFD_CLOEXEC, HIGH_FD)
            self.efd = _fcntl(efd, _F_DUPFD_CLOEXEC, HIGH_FD)
        finally:
            os.close(memfd)
            os.close(efd)
        self.name = name
        self.write_pos = 0
        self.used = False
        # The current cell's marker nonce while the host reads this ring;
        # set and cleared under the lock, so no token can follow the
        # cell's end marker.
        self.tag = None
        self.lock = prims.allocate_lock()
        self.owner = None

    def _read_pos(self):
        return _unpack_from("<Q", self.mm, 8)[0]

    def _room(self, n):
        """Waits until `n` bytes fit; False if the host took nothing for a while."""
        while RING_SIZE - (self.write_pos - self._read_pos()) < n:
            ready, _, _ = _select([self.efd], [], [], RING_WAIT_S)
            if not ready:
                return False
            try:
                os.eventfd_read(self.efd)
            except BlockingIOError:
                pass
        return True

    def write(self, fd, data):
        """Writes `data` through the ring (tokens into `fd`); what does not
        get room in time, or comes between cells, goes through `fd` itself,
        in order."""
        view = memoryview(data)
        me = prims.get_ident()
        if self.owner == me:
            # A write from code that ran inside this thread's ring write (a
            # __del__ or gc callback): straight to the pipe, between tokens.
            _write_all(fd, view)
            return
        with self.lock:
            self.owner = me
            try:
                self._write_locked(fd, view)
            finally:
                self.owner = None

    def _write_locked(self, fd, view):
        tag = self.tag
        if tag is None:
            _write_all(fd, view)
            return
        while view:
            n = min(len(view), RING_SIZE // 2)
            if not self._room(n):
                _write_all(fd, view)
                return
            off = self.write_pos % RING_SIZE
            first = min(n, RING_SIZE - off)
            state.critical_enter()
            try:
                self.mm[RING_HEADER + off:RING_HEADER + off + first] = view[:first]
                if n > first:
                    self.mm[RING_HEADER:RING_HEADER + n - first] = view[first:n]
                token = b"\x01cellhost-ring-%s:%d:%d\x01" % (tag, self.write_pos, n)
                self.write_pos += n
                self.used = True
                _write_all(fd, token)
            finally:
                state.critical_exit()
            view = view[n:]

    def release(self):
        """Gives the ring's pages back once the host has read everything."""
        if self.used and self._read_pos() == self.write_pos:
            try:
                self.mm.madvise(_MADV_REMOVE, RING_HEADER, RING_SIZE)
                self.used = False
            except (OSError, AttributeError, ValueError):
                pass


def create_rings():
    """The rings offered in `ready` (none if this system has no memfd)."""
    offers = []
    for fd, name in ((1, "stdout"), (2, "stderr")):
        try:
            ring = _Ring(name)
        except (OSError, AttributeError, ValueError):
            continue
        _rings[fd] = ring
        offers.append({"stream": name, "memfd": ring.memfd, "eventfd": ring.efd, "size": RING_SIZE})
    return offers


def set_ring_tag(marker, enabled):
    """At a cell's start: its marker's nonce when the host reads the rings."""
    tag = None
    if enabled and marker.startswith("\x01cellhost-end-") and marker.endswith("\x01"):
        tag = marker[len("\x01cellhost-end-"):-1].encode("ascii")
    for ring in _rings.values():
        with ring.lock:
            ring.tag = tag


def end_of_cell_rings():
    """Before a cell's end marker: later writes go through the pipes."""
    for ring in _rings.values():
        with ring.lock:
            ring.tag = None
            ring.release()


def after_fork_in_child():
    """A forked child must not write into its parent's rings (nor inherit a
    write lock another thread held at the fork)."""
    global _write_lock
    _rings.clear()
    _write_lock = prims.RLock()


def begin_cell(marker, background):
    """At a cell's start: `background` (thread idents) from now on write
    through frames, then the cell's start marker goes to fd 1 and fd 2.
    Everything the host reads before it is background output. Returns
    True once the marker is written."""
    with _write_lock:
        state.background_idents = background
        write_marker(start_marker(marker))
    return True


def start_marker(marker):
    """The start marker of the cell whose end marker is `marker`."""
    return marker.replace("cellhost-end-", "cellhost-start-", 1)


def _write_all(fd, view):
    view = memoryview(view)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _is_original(fd):
    try:
        st = os.fstat(fd)
    except OSError:
        return False
    saved = _saved.get(fd)
    # The guarded copy's identity: it follows a process restore.
    return saved is not None and (st.st_dev, st.st_ino) == saved.ident


def save_original_fds():
    for fd in (1, 2):
        _saved[fd] = prims.GuardedFd(fd, HIGH_FD)
        _identity[fd] = _saved[fd].ident


def restore_fds():
    """Point fd 1/2 at the host's pipes again if a cell closed or redirected them."""
    for fd in (1, 2):
        if _is_original(fd):
            continue
        try:
            os.dup2(_saved[fd].fd(), fd)
        except OSError:
            pass


def other_threads():
    """Native ids of this process's threads other than the calling one
    (``/proc/self/task``: also threads started with ``_thread`` or from C,
    and no Python-level registry a cell could rewrite)."""
    me = prims.get_native_id()
    try:
        tids = frozenset(int(t) for t in os.listdir("/proc/self/task"))
        if me in tids:
            return tids - {me}
    except (OSError, ValueError):
        pass
    # No /proc of this pid namespace: the threads the threading module knows.
    try:
        threading = prims.MODULES.get("threading")
        if threading is None:
            return frozenset()
        return frozenset(t.native_id for t in list(dict.values(threading._active))) - {me}
    except Exception:
        return frozenset()


class _BinaryView:
    """``sys.stdout.buffer`` for code that writes bytes."""

    def __init__(self, owner):
        self._owner = owner

    def write(self, data):
        data = bytes(data)
        self._owner._write_bytes(data, lambda: data.decode("utf-8", "replace"))
        return len(data)

    def flush(self):
        pass

    def fileno(self):
        return self._owner.fileno()

    def writable(self):
        return True

    @property
    def closed(self):
        return self._owner.closed


class FdStream(io.TextIOBase):
    """A text stream that writes through to fd 1 or fd 2."""

    def __init__(self, name, fd):
        super().__init__()
        self._name = name
        self._fd = fd
        self.buffer = _BinaryView(self)

    @property
    def name(self):
        return "<%s>" % self._name

    @property
    def encoding(self):
        return "utf-8"

    @property
    def errors(self):
        return "backslashreplace"

    def fileno(self):
        return self._fd

    def isatty(self):
        return False

    def writable(self):
        return True

    def readable(self):
        return False

    def flush(self):
        if self.closed:
            raise ValueError("I/O operation on closed file.")

    def write(self, s):
        if self.closed:
            raise ValueError("I/O operation on closed file.")
        if not isinstance(s, str):
            raise TypeError("write() argument must be str, not %s" % type(s).__name__)
        if s:
            self._write_bytes(s.encode("utf-8", "backslashreplace"), lambda: s)
        return len(s)

    def reconfigure(self, **kwargs):
        """Accepted for compatibility; the stream always writes through as UTF-8."""
        unknown = set(kwargs) - {"encoding", "errors", "newline", "line_buffering", "write_through"}
        if unknown:
            raise TypeError("reconfigure() got unexpected keyword arguments: %s" % ", ".join(sorted(unknown)))

    def _write_bytes(self, data, as_text):
        with _write_lock:
            self._write_locked(data, as_text)

    def _write_locked(self, data, as_text):
        bg = state.background_idents
        if bg and prims.get_native_id() in bg and channel is not None and os.getpid() == state.WORKER_PID:
            channel.send({"type": "background", "stream": self._name, "text": as_text()})
            return
        if len(data) >= RING_MIN:
            ring = _rings.get(self._fd)
            if ring is not None and ring.tag is not None and os.getpid() == state.WORKER_PID \
                    and _is_original(self._fd):
                ring.write(self._fd, data)
                return
        _write_all(self._fd, data)


def line_buffer_c_stdout():
    """Make C stdio's stdout line-buffered, as on a terminal.

    On a pipe glibc buffers ``printf`` output fully, so a C extension's line
    would arrive after later Python or subprocess output; line buffering
    keeps the order a terminal shows.
    """
    global _libc_fflush
    try:
        import ctypes
        libc = ctypes.CDLL(None)
        stdout_ptr = ctypes.c_void_p.in_dll(libc, "stdout")
        libc.setvbuf(stdout_ptr, None, 1, 0)  # _IOLBF
        # Bound now: flush_all runs after cells, when ctypes may be gone.
        _libc_fflush = libc.fflush
    except Exception:
        pass


def install(sys_module, force=False):
    """Install fresh streams at every cell's start: a cell may have closed,
    replaced or patched (``sys.stdout.write = ...``) the previous ones."""
    for attr, name, fd in (("stdout", "stdout", 1), ("stderr", "stderr", 2)):
        setattr(sys_module, attr, FdStream(name, fd))


def flush_all(sys_module):
    """Flush whatever the cell left as sys.stdout/err and C stdio; never raise."""
    for attr in ("stdout", "stderr"):
        try:
            obj = sys_module.__dict__.get(attr)
            if type(obj) is FdStream:
                continue  # writes through: nothing to flush
            flush = getattr(obj, "flush", None)
            if flush is not None:
                flush()
        except BaseException:  # noqa: B902 - the cell's own stream object
            pass
    try:
        if _libc_fflush is not None:
            _libc_fflush(None)
    except BaseException:  # noqa: B902
        pass


def write_marker(marker):
    data = marker.encode("ascii")
    for fd in (1, 2):
        view = memoryview(data)
        while view:
            try:
                target = _saved[fd].fd((fd,))
            except OSError:
                prims.lost("stdout pipe" if fd == 1 else "stderr pipe")
            try:
                n = os.write(target, view)
            except InterruptedError:
                continue
            view = view[n:]
