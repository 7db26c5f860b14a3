"""fd-level capture support: the cell's ``sys.stdout``/``sys.stderr`` and end markers.

The host reads fd 1 and fd 2 as raw bytes, so Python prints, C ``printf``,
``os.write`` and subprocesses all reach it in order. The objects installed as
``sys.stdout``/``sys.stderr`` write straight to the fd (no Python-side
buffer), except for threads that an earlier cell started: their writes go to
the host as ``background`` frames so they never mix into a later cell.
"""
import fcntl
import io
import mmap
import os
import select
import struct
import threading

from . import state

HIGH_FD = 1000
_saved = {}          # 1/2 -> high, close-on-exec copy of the original pipe
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
_write_lock = threading.Lock()


class _Ring:
    def __init__(self, name):
        memfd = os.memfd_create("cellhost-" + name, os.MFD_CLOEXEC)
        efd = os.eventfd(0, os.EFD_CLOEXEC)
        try:
            os.ftruncate(memfd, RING_HEADER + RING_SIZE)
            self.mm = mmap.mmap(memfd, RING_HEADER + RING_SIZE)
            self.memfd = fcntl.fcntl(memfd, fcntl.F_DUPFD_CLOEXEC, HIGH_FD)
            self.efd = fcntl.fcntl(efd, fcntl.F_DUPFD_CLOEXEC, HIGH_FD)
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
        self.lock = threading.Lock()

    def _read_pos(self):
        return struct.unpack_from("<Q", self.mm, 8)[0]

    def _room(self, n):
        """Waits until `n` bytes fit; False if the host took nothing for a while."""
        while RING_SIZE - (self.write_pos - self._read_pos()) < n:
            ready, _, _ = select.select([self.efd], [], [], RING_WAIT_S)
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
        with self.lock:
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
                self.mm.madvise(mmap.MADV_REMOVE, RING_HEADER, RING_SIZE)
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
    _write_lock = threading.Lock()


def begin_cell(marker, background):
    """At a cell's start: `background` (thread idents) from now on write
    through frames, then the cell's start marker goes to fd 1 and fd 2.
    Everything the host reads before it is background output."""
    with _write_lock:
        state.background_idents = background
        write_marker(start_marker(marker))


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
    return (st.st_dev, st.st_ino) == _identity.get(fd)


def save_original_fds():
    for fd in (1, 2):
        _saved[fd] = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, HIGH_FD)
        st = os.fstat(fd)
        _identity[fd] = (st.st_dev, st.st_ino)


def restore_fds():
    """Point fd 1/2 at the host's pipes again if a cell closed or redirected them."""
    for fd in (1, 2):
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) == _identity[fd]:
                continue
        except OSError:
            pass
        os.dup2(_saved[fd], fd)


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
        if bg and threading.get_ident() in bg and channel is not None and os.getpid() == state.WORKER_PID:
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
    try:
        import ctypes
        libc = ctypes.CDLL(None)
        stdout_ptr = ctypes.c_void_p.in_dll(libc, "stdout")
        libc.setvbuf(stdout_ptr, None, 1, 0)  # _IOLBF
    except Exception:
        pass


def install(sys_module, force=False):
    """Install fresh streams if the cell closed or replaced ours."""
    for attr, name, fd in (("stdout", "stdout", 1), ("stderr", "stderr", 2)):
        cur = getattr(sys_module, attr, None)
        if force or not isinstance(cur, FdStream) or cur.closed:
            setattr(sys_module, attr, FdStream(name, fd))


def flush_all(sys_module):
    """Flush whatever the cell left as sys.stdout/err and C stdio; never raise."""
    global _libc_fflush
    for attr in ("stdout", "stderr"):
        obj = getattr(sys_module, attr, None)
        flush = getattr(obj, "flush", None)
        if flush is not None:
            try:
                flush()
            except Exception:
                pass
    try:
        if _libc_fflush is None:
            import ctypes
            _libc_fflush = ctypes.CDLL(None).fflush
        _libc_fflush(None)
    except Exception:
        pass


def write_marker(marker):
    data = marker.encode("ascii")
    for fd in (1, 2):
        view = memoryview(data)
        while view:
            try:
                n = os.write(_saved[fd], view)
            except InterruptedError:
                continue
            view = view[n:]
