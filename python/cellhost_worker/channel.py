"""The control channel: JSON lines over the socketpair the host handed us.

One reader thread owns reading; any thread may send (under a lock). Frames
never go through ``sys.stdout``.
"""
import json
import os
import socket
import threading

from . import state

MAX_FRAME = 64 * 1024 * 1024 - 1024


def _encode(frame):
    text = json.dumps(frame, ensure_ascii=False, separators=(",", ":"), default=repr)
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError:
        # Lone surrogates (from user strings) are not valid UTF-8; make them
        # U+FFFD so the host's strict JSON parser accepts the frame.
        data = text.encode("utf-8", "surrogatepass").decode("utf-8", "replace").encode("utf-8")
    return data + b"\n"


class Channel:
    def __init__(self, fd):
        self.sock = socket.socket(fileno=fd)
        self.sock.setblocking(True)
        self.lock = threading.Lock()
        self.disabled = False

    def send(self, frame):
        """Send one frame. Never raises KeyboardInterrupt halfway through a frame."""
        if self.disabled or state.WORKER_PID != os.getpid():
            return
        data = _encode(frame)
        if len(data) > MAX_FRAME:
            data = _encode({"type": "log", "msg": "frame of type %r dropped: %d bytes exceeds the frame cap" % (frame.get("type"), len(data))})
        state.critical_enter()
        try:
            with self.lock:
                self.sock.sendall(data)
        except OSError:
            # The host is gone; the reader thread exits the process.
            pass
        finally:
            state.critical_exit()

    def after_fork_in_child(self):
        # A forked child must never act as a second worker.
        self.disabled = True
        try:
            os.close(self.sock.detach())
        except OSError:
            pass

    def read_frames(self):
        """Yield frames until EOF (generator used by the reader thread)."""
        buf = b""
        while True:
            try:
                chunk = self.sock.recv(1 << 16)
            except InterruptedError:
                continue
            except OSError:
                return
            if not chunk:
                return
            buf += chunk
            while True:
                nl = buf.find(b"\n")
                if nl < 0:
                    break
                line, buf = buf[:nl], buf[nl + 1:]
                if line.strip():
                    yield json.loads(line)
