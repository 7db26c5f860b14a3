"""Running one cell in the persistent namespace."""
from .prims import BUILTINS as __builtins__  # noqa: F401,E402 - see prims
import _ast
import linecache
import os as _os_module
import sys as _sys
import traceback

from . import prims, state

os = prims.os
_PyCF_ONLY_AST = _ast.PyCF_ONLY_AST
_PyCF_ALLOW_TOP_LEVEL_AWAIT = _ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
_Expr = _ast.Expr
_Expression = _ast.Expression
_linecache = linecache.cache  # the dict itself: a cell rebinding linecache.cache does not stop us
_TracebackException = traceback.TracebackException
# `compact` (3.10+) computes source lines only for the frames printed.
_TB_OPTIONS = {"compact": True} if _sys.version_info >= (3, 10) else {}
_tb_of = BaseException.__dict__["__traceback__"].__get__

# inspect.CO_COROUTINE, without importing inspect (about 3 ms at start).
_CO_COROUTINE = 0x80

WORKER_DIR = _os_module.path.dirname(_os_module.path.abspath(__file__))
_loop = None
# An error's text and traceback (the host bounds further).
MAX_ERROR_TEXT = 256 * 1024
MAX_TB_LINES = 2000
# What a cell set on the main thread, put back for the next cell's code
# (the worker's own code between cells runs untraced, at a sane depth).
_tracer = None
_profiler = None
_cell_recursion_limit = None
_restore_pending = False


def _run_code(body, last, namespace):
    """Runs the cell's body, then its last expression; returns the value.
    One call for both, so a tracer the cell set sees no worker frame."""
    _restore_tracing()
    value = None
    for code_obj in (body, last):
        if code_obj is None:
            break
        value = eval(code_obj, namespace)
        if code_obj.co_flags & _CO_COROUTINE:
            value = run_coroutine(value)
    return value


def run_coroutine(coro):
    """Runs a cell's top-level ``await`` code to its end on the worker's
    loop. The loop runs only for this cell: between cells (and inside cells
    that call ``asyncio.run()``) no event loop is running."""
    global _loop
    if _loop is None or _loop.is_closed():
        # Imported on first use: asyncio (with ssl) is a third of the
        # worker's start-up, and most cells never await at top level.
        import asyncio
        _loop = asyncio.new_event_loop()
    return _loop.run_until_complete(coro)


def ends_quiet(source):
    """The cell ends with ``;`` (a trailing comment aside): its result is hidden."""
    lines = source.rstrip().splitlines()
    if not lines:
        return False
    last = lines[-1]
    if "#" in last:
        code_part = last.split("#", 1)[0].rstrip()
        if code_part.count("'") % 2 == 0 and code_part.count('"') % 2 == 0 and code_part:
            last = code_part
    return last.rstrip().endswith(";")


def compile_cell(source, filename, quiet=None):
    """(body, last_expression) code objects; last is None if the cell does
    not end with an expression or is ``quiet`` (ends with ``;``; decided
    from ``source`` when None)."""
    if type(source) is not str:
        source = prims.exact_str(source) or ""
    flags = _PyCF_ALLOW_TOP_LEVEL_AWAIT
    tree = compile(source, filename, "exec", _PyCF_ONLY_AST | flags, dont_inherit=True)
    try:
        _linecache[filename] = (len(source), None, source.splitlines(True), filename)
    except BaseException:  # noqa: B902 - only tracebacks lose their source lines
        pass
    last = None
    if quiet is None:
        quiet = ends_quiet(source)
    if tree.body and type(tree.body[-1]) is _Expr and not quiet:
        last = _Expression(tree.body.pop().value)
    body = compile(tree, filename, "exec", flags, dont_inherit=True)
    last_code = compile(last, filename, "eval", flags, dont_inherit=True) if last is not None else None
    return body, last_code


def run_user_code(body, last, namespace, cell_id):
    """Run the compiled cell. Sets state.running around user code.

    An interrupt that arrived while the cell was being prepared (a SIGINT
    after ``started``, or an ``interrupt`` frame) stops it before its first
    line. Returns (value, has_value). Exceptions from user code propagate.
    """
    with state.lock:
        state.running = True
        cancelled = cell_id in state.cancelled
    try:
        if cancelled or state.sigint_pending:
            state.sigint_pending = False
            raise KeyboardInterrupt("interrupted before the cell's code started")
        _before_user_code()
        value = _run_code(body, last, namespace)
    finally:
        # Inline C calls first: a tracer the cell set sees no worker frame.
        tracer = prims.gettrace()
        prims.settrace(None)
        state.running = False
        after_user_code(tracer)
    return value, last is not None


def _before_user_code():
    """Puts back what the previous cell set for itself: its recursion limit
    now, its tracer and profiler right before its code (see _run_code)."""
    global _cell_recursion_limit, _restore_pending
    prims.restore_recursion_limit(_cell_recursion_limit)
    _cell_recursion_limit = None
    _restore_pending = True


def _restore_tracing():
    global _restore_pending, _tracer, _profiler
    if not _restore_pending:
        return
    _restore_pending = False
    tracer, profiler = _tracer, _profiler
    _tracer = _profiler = None
    if profiler is not None:
        prims.setprofile(profiler)
    if tracer is not None:
        prims.settrace(tracer)


def after_user_code(tracer=None):
    """Right after user code (a cell's, or a repr the worker called): the
    worker's own code runs untraced and with room on the stack. ``tracer``
    is the cell's, if the caller already turned it off."""
    global _tracer, _profiler, _cell_recursion_limit, _restore_pending
    _restore_pending = False
    still, profiler = prims.quiet_tracing()
    tracer = tracer if tracer is not None else still
    if tracer is not None or profiler is not None:
        _tracer, _profiler = tracer, profiler
    limit = prims.lift_recursion_limit()
    if limit is not None:
        _cell_recursion_limit = limit


def _is_worker_frame(filename):
    return type(filename) is str and filename.startswith(WORKER_DIR + "/")


def _collapse(frames):
    """Collapse repeating cycles of frames (mutual recursion) to one copy plus a count."""
    keys = [(f.filename, f.lineno, f.name) for f in frames]
    out, i, n = [], 0, len(frames)
    while i < n:
        collapsed = False
        for period in range(1, 9):
            if i + 2 * period > n:
                break
            reps = 1
            while i + (reps + 1) * period <= n and keys[i + reps * period:i + (reps + 1) * period] == keys[i:i + period]:
                reps += 1
            if reps >= 3:
                out.extend(frames[i:i + period])
                out.append(("repeat", period, reps - 1))
                i += reps * period
                collapsed = True
                break
        if not collapsed:
            out.append(frames[i])
            i += 1
    return out


def format_exception(exc):
    """{ename, evalue, traceback} without worker frames, repeats collapsed.

    Never raises: when the standard formatter fails (a cell broke what it
    relies on, or the exception's own methods raise), a plainer traceback
    built from the frames alone is returned."""
    try:
        return _format_standard(exc)
    except BaseException:  # noqa: B902
        pass
    try:
        return _format_plain(exc)
    except BaseException:  # noqa: B902
        return {"ename": prims.type_name(exc), "evalue": "", "traceback": []}


def _format_plain(exc):
    lines = []
    tb = _tb_of(exc)
    frames = []
    while tb is not None and len(frames) < 200:
        code = tb.tb_frame.f_code
        if not _is_worker_frame(code.co_filename):
            frames.append('  File "%s", line %s, in %s' % (code.co_filename, tb.tb_lineno, code.co_name))
        tb = tb.tb_next
    if frames:
        lines.append("Traceback (most recent call last):")
        lines.extend(frames)
    ename, evalue = prims.type_name(exc), _cap(prims.exc_text(exc))
    lines.append("%s: %s" % (ename, evalue) if evalue else ename)
    return {"ename": ename, "evalue": evalue, "traceback": lines}


def _format_standard(exc):
    te = _TracebackException(type(exc), exc, _tb_of(exc), capture_locals=False, **_TB_OPTIONS)
    lines = []

    def emit(te_obj):
        if te_obj.__cause__ is not None:
            emit(te_obj.__cause__)
            lines.append("\nThe above exception was the direct cause of the following exception:\n")
        elif te_obj.__context__ is not None and not te_obj.__suppress_context__:
            emit(te_obj.__context__)
            lines.append("\nDuring handling of the above exception, another exception occurred:\n")
        frames = [f for f in te_obj.stack if not _is_worker_frame(f.filename)]
        if frames:
            lines.append("Traceback (most recent call last):")
            for item in _collapse(frames):
                if isinstance(item, tuple):
                    _, period, more = item
                    lines.append("  [... the previous %d frame%s repeated %d more times]" % (period, "" if period == 1 else "s", more))
                    continue
                lines.append('  File "%s", line %s, in %s' % (item.filename, item.lineno, item.name))
                if item.line:
                    lines.append("    " + item.line.strip())
        lines.extend(l.rstrip("\n") for l in te_obj.format_exception_only())

    emit(te)
    out = []
    for line in lines[-MAX_TB_LINES:]:
        text = prims.exact_str(line)
        if text is None:
            raise TypeError("traceback line is not text")
        out.append(_cap(text))
    return {"ename": prims.type_name(exc), "evalue": _cap(prims.exc_text(exc)), "traceback": out}


def _cap(text):
    if len(text) > MAX_ERROR_TEXT:
        return text[:MAX_ERROR_TEXT] + "[... %d characters cut by the worker]" % (len(text) - MAX_ERROR_TEXT)
    return text
