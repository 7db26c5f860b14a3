"""fd-level capture support: the cell's ``sys.stdout``/``sys.stderr`` and end markers.

The host reads fd 1 and fd 2 as raw bytes, so Python prints, C ``printf``,
``os.write`` and subprocesses all reach it in order. The objects installed as
``sys.stdout``/``sys.stderr`` write straight to the fd (no Python-side
buffer), except for threads that an earlier cell started: their writes go to
the host as ``background`` frames so they never mix into a later cell.
"""
import fcntl
import io
import os
import threading

from . import state

HIGH_FD = 1000
_saved = {}          # 1/2 -> high, close-on-exec copy of the original pipe
_identity = {}       # 1/2 -> (st_dev, st_ino) of the original pipe
channel = None       # set by main
_libc_fflush = None


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
        bg = state.background_idents
        if bg and threading.get_ident() in bg and channel is not None and os.getpid() == state.WORKER_PID:
            channel.send({"type": "background", "stream": self._name, "text": as_text()})
            return
        view = memoryview(data)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]


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
