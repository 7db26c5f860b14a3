"""Worker entry point: handshake, reader thread, main loop.

Everything the worker needs is bound before the first cell runs (see
:mod:`prims`), so a cell that rebinds builtins, replaces modules or patches
their functions cannot crash the worker or corrupt the protocol: every cell
ends with its end markers and one ``response`` frame.
"""
from .prims import BUILTINS as __builtins__  # noqa: F401,E402 - see prims
import builtins
import faulthandler
import resource
import sys

from . import api, channel as channel_mod, display, execute, fileaudit, history, inspect_vars, magics, prims, state, streams
# Imported before any cell: its module baseline is the worker's own.
from . import forkstate  # noqa: F401,E402

PROTOCOL = 1
CONTROL_FD = 3

os = prims.os
signal = prims.signal
_getrusage = resource.getrusage
_RUSAGE_SELF = resource.RUSAGE_SELF
_RUSAGE_CHILDREN = resource.RUSAGE_CHILDREN
_queue = prims.SimpleQueue()
_channel = None
_namespace = None


def _classify_sigint():
    try:
        h = signal.getsignal(signal.SIGINT)
    except BaseException:  # noqa: B902
        return "user"
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


def _handle(frame):
    kind = frame.get("type")
    if kind == "execute":
        with state.lock:
            state.queued.add(frame.get("id"))
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


def _reader():
    """The control thread. It runs concurrently with cells, so code of a
    cell can reach it only through the interpreter (a tracer set for every
    thread, a gc callback, a ``__del__``): tracing is turned off before each
    frame, and what such code raises here is dropped, not fatal."""
    failures = 0
    while True:
        try:
            prims.quiet_tracing()
            frame = _channel.next_frame()
            if frame is None:
                break
            prims.quiet_tracing()
            _handle(frame)
            failures = 0
        except BaseException:  # noqa: B902 - never let cell code end the reader
            failures += 1
            if failures > 1000:
                # Not a stray exception but a reader that cannot go on:
                # end the kernel (the host reports it) rather than spin.
                prims.lost("control channel", "the control thread failed 1000 times in a row")
            continue
    # EOF: the host is gone (or closed the channel). Leave at once.
    os._exit(0)


def _usage(before):
    try:
        ru = _getrusage(_RUSAGE_SELF)
        rc = _getrusage(_RUSAGE_CHILDREN)
        cpu = ru.ru_utime + ru.ru_stime + rc.ru_utime + rc.ru_stime
        return {"cpu_s": round(cpu - before, 6), "peak_rss_kb": ru.ru_maxrss}, cpu
    except BaseException:  # noqa: B902
        return None, before


def _cwd():
    try:
        return os.getcwd()
    except BaseException:  # noqa: B902
        return None


def _after_fork_child():
    streams.after_fork_in_child()
    if _channel is not None:
        _channel.after_fork_in_child()


def _leave_if_forked_child():
    if os.getpid() != state.WORKER_PID:
        streams.flush_all(sys)
        os._exit(0)


def _guarded(fn, *args):
    """Worker steps after a cell's code: whatever a cell left behind makes
    them fail, not the cell's end."""
    try:
        return fn(*args)
    except Exception as exc:
        _log("worker: %s failed: %s: %s" % (prims.exact_str(fn.__name__), prims.type_name(exc), prims.exc_text(exc)))
        return None


def _log(msg):
    _channel.send({"type": "log", "msg": msg})


def _run_cell(frame):
    cid = frame.get("id")
    code = frame.get("code", "")
    options = frame.get("options") or {}
    with state.lock:
        state.queued.discard(cid)
        state.current = cid
        state.ki_raised = 0
    state.start_written = False
    _channel.send({"type": "started", "id": cid})
    _guarded(streams.restore_fds)
    _guarded(streams.install, sys)
    # Every thread alive now (``_thread`` and C ones included) is an earlier
    # cell's: from the start marker on, their Python-level writes are
    # background frames; whatever the host reads before it is background.
    if _guarded(streams.begin_cell, frame.get("marker", ""), streams.other_threads()):
        state.start_written = True
    _guarded(streams.set_ring_tag, frame.get("marker", ""), bool(options.get("rings")))
    # Re-armed for every cell: a cell may have ignored, replaced or blocked SIGINT.
    signal.signal(signal.SIGINT, _on_sigint)
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, (signal.SIGINT,))
    except OSError:
        pass
    silent = bool(options.get("silent"))
    if not silent:
        state.execution_count += 1
    count = state.execution_count
    status, result, error = "ok", None, None
    cpu_before = _usage(0.0)[1]
    fileaudit.reset()
    display.sent = 0
    result_at = None
    try:
        body, last = _compile(code, count, silent)
        _guarded(magics.before_cell, code, count, silent)
        value, has_value = execute.run_user_code(body, last, _namespace, cid)
        _leave_if_forked_child()
        if has_value and value is not None:
            try:
                data, _md = display.bundle(value)
            finally:
                execute.after_user_code()  # the value's reprs are cell code too
            result = data
            result_at = display.sent
            if not silent:
                history.record_output(_namespace, count, value)
        _guarded(magics.after_cell, "ok")
    except BaseException as exc:  # noqa: B902 - every exception belongs to the cell
        state.running = False
        execute.after_user_code()
        _leave_if_forked_child()
        _guarded(magics.after_cell, "error")
        if issubclass(type(exc), KeyboardInterrupt):
            status = "interrupted"
        else:
            status = "error"
        error = execute.format_exception(exc)
        try:
            exc.__traceback__ = None
        except BaseException:  # noqa: B902
            pass
        del exc
    if silent:
        # A silent cell takes no number; it may set the count (the restore
        # of a fork or a checkpoint).
        count = state.execution_count
    _end_cell(cid, frame.get("marker", ""), status, count, result, error, cpu_before, result_at)


def _compile(code, count, silent):
    """The cell's code objects. A cell that is not plain Python gets a
    second chance as IPython syntax (magics, ``!cmd``, ``obj?``): the
    pre-check and transform run only after the plain compile failed, so a
    plain cell pays nothing. ``In[count]`` is the source as run."""
    filename = "<cell-%d>" % count
    source = code
    try:
        try:
            bare = magics.bare_command(code, _namespace)
            if bare is not None:
                source = bare
                return execute.compile_cell(bare, filename)
            return execute.compile_cell(code, filename)
        except SyntaxError:
            new = _transform(code)
            if new is None:
                raise
            source = new
            return execute.compile_cell(new, filename, quiet=execute.ends_quiet(code))
    finally:
        if not silent:
            _guarded(history.record_input, _namespace, count, source)


def _transform(code):
    try:
        return magics.transform(code)
    except Exception as exc:  # noqa: B902 - the plain SyntaxError stands
        _log("worker: IPython syntax transform failed: %s: %s" % (prims.type_name(exc), prims.exc_text(exc)))
        return None


def _end_cell(cid, marker, status, count, result, error, cpu_before=None, result_at=None):
    """The cell's end: figures, flushes, end markers, then ``response``."""
    sigint_after = _classify_sigint()
    try:
        display.flush_figures()
    except BaseException:  # noqa: B902
        pass
    streams.flush_all(sys)
    _guarded(streams.end_of_cell_rings)
    _guarded(streams.restore_fds)
    usage = _usage(cpu_before)[0] if cpu_before is not None else None
    # From the end marker on, every other thread's Python-level writes are
    # background output: none may land after the marker in the pipe, where
    # the host would count it as the next cell's.
    state.background_idents = streams.other_threads()
    with state.lock:
        state.current = None
        state.sigint_pending = False
        state.cancelled.discard(cid)
    _guarded(_end_markers, marker)
    _channel.send({
        "type": "response", "id": cid, "status": status, "execution_count": count,
        "result": result, "error": error, "usage": usage, "cwd": _cwd(),
        "sigint_handler": sigint_after, "files": _guarded(fileaudit.take),
        "result_at": result_at,
    })


def _end_markers(marker):
    """A cell's end marker, after its start marker if that was not written."""
    if not state.start_written:
        streams.write_marker(streams.start_marker(marker))
        state.start_written = True
    streams.write_marker(marker)


def _inspect(frame):
    try:
        limit = max(1, min(500, int(frame.get("limit", 100))))
    except (TypeError, ValueError):
        limit = 100
    variables, truncated = inspect_vars.inspect(_namespace, limit)
    _channel.send({"type": "variables", "id": frame.get("id"), "variables": variables, "truncated": truncated})


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
    return prims.loads_line(data) or {}


def _connect(config):
    """The channel on fd 3 and what hangs on it (a new kernel's, or a
    copy-on-write fork's: its parent's channel is closed by then)."""
    global _channel
    _channel = channel_mod.Channel(CONTROL_FD)
    os.close(CONTROL_FD)
    streams.channel = _channel
    display.channel = _channel
    api.channel = _channel
    api.tool_names = tuple(config.get("tools", ()))
    from . import pip
    pip.add_overlay(config.get("packages"))
    streams.save_original_fds()
    streams.install(sys, force=True)
    faulthandler.enable(file=os.fdopen(os.dup(2), "w", closefd=True), all_threads=False)


def _announce():
    signal.signal(signal.SIGINT, _on_sigint)
    prims.start_new_thread(_reader, ())
    _channel.send({"type": "ready", "pid": os.getpid(), "python": sys.version,
                   "executable": sys.executable, "protocol": PROTOCOL,
                   "rings": streams.create_rings()})


def _loop():
    while True:
        frame = None
        try:
            frame = _queue.get()
            _serve(frame)
        except BaseException as exc:  # noqa: B902 - nothing a cell does may end the worker
            _recover(frame, exc)
        frame = None
        if forkstate.pending is not None:
            # Between cells (a quiescent point): the copy-on-write fork a
            # silent cell asked for (``forkstate.cow_arm``).
            try:
                forkstate.cow_fork()
            except BaseException as exc:  # noqa: B902 - the host sees the fork fail
                try:
                    _log("worker: copy-on-write fork failed: %s: %s" % (prims.type_name(exc), prims.exc_text(exc)))
                except BaseException:  # noqa: B902
                    pass


def resume_forked():
    """In a copy-on-write fork of a live worker (``template._worker`` with
    ``resume``), after the fork's descriptors are in place: the namespace,
    modules and count are the parent's; the channel, queue, streams and
    random state are this kernel's own. Never returns."""
    global _queue
    config = _read_config(CONTROL_FD)
    _queue = prims.SimpleQueue()
    state.lock = prims.allocate_lock()
    state.queued = set()
    state.cancelled = set()
    state.current = None
    state.running = False
    state.sigint_pending = False
    state.background_idents = frozenset()
    _connect(config)
    forkstate.reseed()
    _announce()
    _loop()
    os._exit(0)


def run():
    global _namespace
    config = _read_config(CONTROL_FD)
    _connect(config)
    streams.line_buffer_c_stdout()
    os.register_at_fork(after_in_child=_after_fork_child)
    builtins.input = _no_input
    fileaudit.install()
    builtins.display = display.display
    display.install_ipython_hook()
    sys.modules["cellhost"] = api.make_module()
    _namespace = sys.modules["__main__"].__dict__
    history.install(_namespace)
    magics.install(_namespace)
    _announce()
    _loop()


def _serve(frame):
    kind = frame.get("type")
    if kind == "execute":
        _run_cell(frame)
    elif kind == "inspect_variables":
        _inspect(frame)
    elif kind == "shutdown":
        streams.flush_all(sys)
        os._exit(0)


def _recover(frame, exc):
    """An exception in worker code: an interrupt that landed after the
    cell's code ended, or a worker step that what a cell left behind broke.
    The cell still gets its end markers and one response."""
    prims.quiet_tracing()
    state.running = False
    if frame is None or type(frame) is not dict:
        return
    kind = frame.get("type")
    interrupted = issubclass(type(exc), KeyboardInterrupt)
    if not interrupted:
        try:
            _log("worker error: %s: %s" % (prims.type_name(exc), prims.exc_text(exc)))
        except BaseException:  # noqa: B902
            pass
    if kind == "execute" and state.current == frame.get("id"):
        if interrupted:
            error = {"ename": "KeyboardInterrupt", "evalue": "", "traceback": []}
        else:
            error = {"ename": prims.type_name(exc), "evalue": prims.exc_text(exc),
                     "traceback": ["(in cellhost's worker, after the cell's code)"]}
        for _ in range(3):
            try:
                _end_cell(frame.get("id"), frame.get("marker", ""), "interrupted" if interrupted else "error",
                          state.execution_count, None, error)
                return
            except BaseException:  # noqa: B902 - a second interrupt: end the cell again
                continue
    elif kind == "inspect_variables":
        _channel.send({"type": "variables", "id": frame.get("id"), "variables": [], "truncated": False})
