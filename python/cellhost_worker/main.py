"""Worker entry point: handshake, reader thread, main loop."""
import builtins
import faulthandler
import fcntl
import json
import os
import queue
import resource
import signal
import sys
import threading
import time

from . import api, channel as channel_mod, display, execute, fileaudit, inspect_vars, state, streams

PROTOCOL = 1
CONTROL_FD = 3

_queue = queue.Queue()
_channel = None
_namespace = None


def _classify_sigint():
    h = signal.getsignal(signal.SIGINT)
    if h is _on_sigint:
        return "worker"
    if h is signal.SIG_IGN:
        return "ignored"
    if h is signal.SIG_DFL:
        return "default"
    return "user"


def _on_sigint(signum, frame):
    """SIGINT on the main thread.

    Running user code: raise KeyboardInterrupt (also for a SIGINT the code
    sent itself, e.g. ``_thread.interrupt_main()``). While a cell is being
    prepared (after its ``started`` frame, before its code): remember it, the
    code starts interrupted. Otherwise the cell it was meant for has already
    finished: ignore it.
    """
    if os.getpid() != state.WORKER_PID:
        raise KeyboardInterrupt
    if state.running:
        if state.in_critical():
            state.deferred_ki = True
            return
        state.ki_raised += 1
        raise KeyboardInterrupt
    if state.current is not None:
        state.sigint_pending = True


def _no_input(prompt=""):
    raise EOFError(
        "input() is not supported: cellhost kernels have no stdin (no human is attached). "
        "Pass values in the code instead."
    )


def _reader():
    for frame in _channel.read_frames():
        kind = frame.get("type")
        if kind == "execute":
            with state.lock:
                state.queued.add(frame["id"])
            _queue.put(frame)
        elif kind == "interrupt":
            cid = frame.get("id")
            with state.lock:
                running = state.current == cid and state.running
                if running:
                    if not frame.get("signalled"):
                        # The host sent the frame alone (it had not seen
                        # `started`), but the code is already running.
                        signal.pthread_kill(state.main_ident, signal.SIGINT)
                elif cid in state.queued or state.current == cid:
                    state.cancelled.add(cid)
                raised = state.ki_raised if state.current == cid else 0
            _channel.send({"type": "interrupt_ack", "id": cid, "running": running,
                           "handler": _classify_sigint(), "raised": raised})
        elif kind == "host_response":
            api.deliver(frame)
        elif kind in ("inspect_variables", "shutdown"):
            _queue.put(frame)
    # EOF: the host is gone (or closed the channel). Leave at once.
    os._exit(0)


def _usage(before):
    ru = resource.getrusage(resource.RUSAGE_SELF)
    rc = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = ru.ru_utime + ru.ru_stime + rc.ru_utime + rc.ru_stime
    return {"cpu_s": round(cpu - before, 6), "peak_rss_kb": ru.ru_maxrss}, cpu


def _cwd():
    try:
        return os.getcwd()
    except OSError:
        return None


def _after_fork_child():
    streams.after_fork_in_child()
    if _channel is not None:
        _channel.after_fork_in_child()


def _leave_if_forked_child():
    if os.getpid() != state.WORKER_PID:
        streams.flush_all(sys)
        os._exit(0)


def _run_cell(frame):
    cid = frame["id"]
    code = frame.get("code", "")
    with state.lock:
        state.queued.discard(cid)
        state.current = cid
        state.ki_raised = 0
    state.start_written = False
    _channel.send({"type": "started", "id": cid})
    streams.restore_fds()
    streams.install(sys)
    me = threading.get_ident()
    # Every thread alive now, `_thread` ones included, is an earlier cell's.
    streams.begin_cell(frame["marker"], frozenset(i for i in sys._current_frames() if i != me))
    state.start_written = True
    streams.set_ring_tag(frame.get("marker", ""), bool((frame.get("options") or {}).get("rings")))
    signal.signal(signal.SIGINT, _on_sigint)
    silent = bool((frame.get("options") or {}).get("silent"))
    if not silent:
        state.execution_count += 1
    count = state.execution_count
    status, result, error = "ok", None, None
    cpu_before = _usage(0.0)[1]
    fileaudit.reset()
    try:
        body, last = execute.compile_cell(code, "<cell-%d>" % count)
        value, has_value = execute.run_user_code(body, last, _namespace, cid)
        _leave_if_forked_child()
        if has_value and value is not None:
            data, _md = display.bundle(value)
            result = data
            if not silent:
                _namespace["_"] = value
    except BaseException as exc:  # noqa: B902 - every exception belongs to the cell
        state.running = False
        _leave_if_forked_child()
        if isinstance(exc, KeyboardInterrupt):
            status = "interrupted"
        else:
            status = "error"
        error = execute.format_exception(exc)
        exc.__traceback__ = None
    sigint_after = _classify_sigint()
    try:
        display.flush_figures()
    except BaseException:
        pass
    streams.flush_all(sys)
    streams.end_of_cell_rings()
    streams.restore_fds()
    usage, _ = _usage(cpu_before)
    with state.lock:
        state.current = None
        state.sigint_pending = False
        state.cancelled.discard(cid)
    streams.write_marker(frame["marker"])
    _channel.send({
        "type": "response", "id": cid, "status": status, "execution_count": count,
        "result": result, "error": error, "usage": usage, "cwd": _cwd(),
        "sigint_handler": sigint_after, "files": fileaudit.take(),
    })


def _end_markers(marker):
    """A cell's end marker, after its start marker if that was not written."""
    if not state.start_written:
        streams.write_marker(streams.start_marker(marker))
        state.start_written = True
    streams.write_marker(marker)


def _inspect(frame):
    limit = max(1, min(500, int(frame.get("limit", 100))))
    variables, truncated = inspect_vars.inspect(_namespace, limit)
    _channel.send({"type": "variables", "id": frame["id"], "variables": variables, "truncated": truncated})


def _read_config(fd):
    """The worker's configuration: the first message on the control socket
    (its length in decimal, a newline, JSON), read before the channel
    exists so nothing after it is consumed. Never in the environment,
    which ``/proc/self/environ`` would keep for user code to read."""
    header = b""
    while not header.endswith(b"\n"):
        b = os.read(fd, 1)
        if not b or len(header) > 20:
            return {}
        header += b
    n = int(header)
    data = b""
    while len(data) < n:
        chunk = os.read(fd, n - len(data))
        if not chunk:
            break
        data += chunk
    return json.loads(data.decode() or "{}")


def run():
    global _channel, _namespace
    config = _read_config(CONTROL_FD)
    ctl = fcntl.fcntl(CONTROL_FD, fcntl.F_DUPFD_CLOEXEC, streams.HIGH_FD)
    os.close(CONTROL_FD)
    _channel = channel_mod.Channel(ctl)
    streams.channel = _channel
    display.channel = _channel
    api.channel = _channel
    api.tool_names = tuple(config.get("tools", ()))
    streams.save_original_fds()
    streams.install(sys, force=True)
    streams.line_buffer_c_stdout()
    faulthandler.enable(file=os.fdopen(os.dup(2), "w", closefd=True), all_threads=False)
    os.register_at_fork(after_in_child=_after_fork_child)
    builtins.input = _no_input
    fileaudit.install()
    builtins.display = display.display
    display.install_ipython_hook()
    sys.modules["cellhost"] = api.make_module()
    _namespace = sys.modules["__main__"].__dict__
    signal.signal(signal.SIGINT, _on_sigint)
    threading.Thread(target=_reader, name="cellhost-control", daemon=True).start()
    _channel.send({"type": "ready", "pid": os.getpid(), "python": sys.version,
                   "executable": sys.executable, "protocol": PROTOCOL,
                   "rings": streams.create_rings()})
    while True:
        try:
            frame = _queue.get()
        except KeyboardInterrupt:
            continue
        kind = frame.get("type")
        try:
            if kind == "execute":
                _run_cell(frame)
            elif kind == "inspect_variables":
                _inspect(frame)
            elif kind == "shutdown":
                streams.flush_all(sys)
                os._exit(0)
        except KeyboardInterrupt:
            # An interrupt that landed in worker code after the cell's code
            # ended; the cell's response was already built or is sent below.
            if kind == "execute" and state.current == frame.get("id"):
                state.current = None
                streams.end_of_cell_rings()
                _end_markers(frame["marker"])
                _channel.send({"type": "response", "id": frame["id"], "status": "interrupted",
                               "execution_count": state.execution_count, "result": None,
                               "error": {"ename": "KeyboardInterrupt", "evalue": "", "traceback": []},
                               "usage": None, "cwd": _cwd(), "sigint_handler": _classify_sigint()})
        except Exception as exc:  # a worker bug must not kill the session silently
            _channel.send({"type": "log", "msg": "worker error: %s: %s" % (type(exc).__name__, exc)})
            if kind == "execute" and state.current == frame.get("id"):
                state.current = None
                streams.end_of_cell_rings()
                _end_markers(frame["marker"])
                _channel.send({"type": "response", "id": frame["id"], "status": "error",
                               "execution_count": state.execution_count, "result": None,
                               "error": execute.format_exception(exc), "usage": None, "cwd": _cwd()})
        del frame
