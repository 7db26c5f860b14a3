"""The control channel: JSON lines over the socketpair the host handed us.

One reader thread owns reading; any thread may send (under a lock). Frames
never go through ``sys.stdout``. Everything here is bound at start-up (see
:mod:`prims`): the C JSON encoder and scanner, ``os.read``/``os.write`` on a
descriptor a cell cannot silently take away (:class:`prims.GuardedFd`).
"""
from .prims import BUILTINS as __builtins__  # noqa: F401,E402 - see prims
from . import prims, state

os = prims.os
MAX_FRAME = 64 * 1024 * 1024 - 1024
_EAGAIN = (11,)


def _utf8(text):
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        # Lone surrogates (from user strings) are not valid UTF-8; make them
        # U+FFFD so the host's strict JSON parser accepts the frame.
        return text.encode("utf-8", "surrogatepass").decode("utf-8", "replace").encode("utf-8")


def _encode(frame):
    return _utf8(prims.dumps(frame)) + b"\n"


def _salvage(frame, why):
    """A frame whose payload could not be encoded (a hostile container from
    a cell) or is over the frame cap: the same frame with each value that
    fails, or is too large, replaced by a note."""
    out = {}
    for key, value in list(dict.items(frame)):
        if _fits(value):
            out[key] = value
        elif key in ("data", "result") and type(value) is dict:
            # A MIME bundle: keep the entries that encode, note the rest.
            kept = {k: v for k, v in list(dict.items(value)) if _fits(v)}
            dropped = len(value) - len(kept)
            note = "<%d output entr%s could not be encoded: %s>" % (dropped, "y" if dropped == 1 else "ies", why)
            if "text/plain" in kept:
                kept["text/plain"] = kept["text/plain"] + "\n" + note
            else:
                kept["text/plain"] = note
            out[key] = kept if _fits(kept) else {"text/plain": note}
        elif key in ("metadata", "args"):
            out[key] = {}
        elif key == "error" and type(value) is dict:
            out[key] = {"ename": prims.exact_str(value.get("ename")) or "Error",
                        "evalue": "<the error could not be encoded: %s>" % why, "traceback": []}
        else:
            out[key] = None
    return out


def _fits(value):
    try:
        return len(prims.dumps(value)) <= MAX_FRAME // 4
    except BaseException:  # noqa: B902 - user objects in the payload
        return False


class Channel:
    def __init__(self, fd):
        self.guard = prims.GuardedFd(fd, 1000)
        self.lock = prims.allocate_lock()
        self.owner = None    # thread writing a frame now
        self.pending = []    # frames sent by code that ran inside a send
        self.disabled = False
        self.buf = b""

    def _write_all(self, data):
        view = memoryview(data)
        repaired = False
        while view:
            try:
                fd = self.guard.fd()
            except OSError:
                prims.lost("control channel")
            try:
                n = os.write(fd, view)
            except InterruptedError:
                continue
            except OSError:
                if repaired:
                    raise
                # A cell closed or replaced the descriptor between the
                # check and the write: repair once more, then give up.
                repaired = True
                continue
            view = view[n:]

    def send(self, frame, salvage=True):
        """Send one frame. Never raises (the host being gone is the reader's
        business) and never raises KeyboardInterrupt halfway through a frame.

        A frame that cannot be encoded or is over the frame cap is sent with
        the offending values replaced by notes (a cell's response still
        ends the cell), or, with ``salvage=False``, not at all. Returns
        whether the frame went out as given."""
        if self.disabled or state.WORKER_PID != os.getpid():
            return False
        why = None
        try:
            data = _encode(frame)
            if len(data) > MAX_FRAME:
                why = "a frame of %d bytes exceeds the frame cap" % len(data)
        except BaseException as exc:  # noqa: B902 - a hostile object in the payload
            why = "%s: %s" % (prims.type_name(exc), prims.exc_text(exc))
        if why is not None:
            if not salvage:
                return False
            try:
                data = _encode(_salvage(frame, why))
                if len(data) > MAX_FRAME:
                    return False
            except BaseException:  # noqa: B902
                return False
        me = prims.get_ident()
        if self.owner == me:
            # Code that ran inside this thread's send (a __del__ or a gc
            # callback of the cell's objects) sends a frame: it goes out
            # after the frame being written, never in the middle of it,
            # and never waits for a lock its own thread holds.
            self.pending.append(data)
            return why is None
        state.critical_enter()
        try:
            with self.lock:
                self.owner = me
                try:
                    self._write_all(data)
                    while self.pending:
                        self._write_all(self.pending.pop(0))
                finally:
                    self.owner = None
        except OSError:
            # The host is gone; the reader thread exits the process.
            return False
        finally:
            state.critical_exit()
        return why is None

    def after_fork_in_child(self):
        # A forked child must never act as a second worker.
        self.disabled = True
        self.guard.close_all()

    def next_frame(self):
        """The next frame (a dict), or None at EOF (the host is gone, or the
        channel is lost). Lines that are not one JSON object are skipped."""
        while True:
            nl = self.buf.find(b"\n")
            if nl >= 0:
                line, self.buf = self.buf[:nl], self.buf[nl + 1:]
                if not line.strip():
                    continue
                frame = prims.loads_line(line)
                if frame is None:
                    self.send({"type": "log", "msg": "worker: malformed control frame skipped (%d bytes)" % len(line)})
                    continue
                return frame
            try:
                fd = self.guard.fd()
            except OSError:
                prims.lost("control channel")
            try:
                chunk = os.read(fd, 1 << 16)
            except InterruptedError:
                continue
            except OSError:
                return None
            if not chunk:
                return None
            self.buf += chunk
