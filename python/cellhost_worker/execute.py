"""Running one cell in the persistent namespace."""
import ast
import linecache
import os
import traceback

from . import state

# inspect.CO_COROUTINE, without importing inspect (about 3 ms at start).
_CO_COROUTINE = 0x80

WORKER_DIR = os.path.dirname(os.path.abspath(__file__))
_loop = None


def _run_code(code_obj, namespace):
    if code_obj.co_flags & _CO_COROUTINE:
        # Imported on first use: asyncio (with ssl) is a third of the
        # worker's start-up, and most cells never await at top level.
        import asyncio
        global _loop
        if _loop is None or _loop.is_closed():
            _loop = asyncio.new_event_loop()
        coro = eval(code_obj, namespace)
        # The loop runs only for this cell: between cells (and inside cells
        # that call asyncio.run()) no event loop is running.
        return _loop.run_until_complete(coro)
    return eval(code_obj, namespace)


def compile_cell(source, filename):
    """(body, last_expression) code objects; last is None if the cell does not end with an expression."""
    flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    tree = compile(source, filename, "exec", ast.PyCF_ONLY_AST | flags, dont_inherit=True)
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr) and not source.rstrip().endswith(";"):
        last = ast.Expression(tree.body.pop().value)
        ast.copy_location(last, last.body)
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
        _run_code(body, namespace)
        value = _run_code(last, namespace) if last is not None else None
    finally:
        state.running = False
    return value, last is not None


def _is_worker_frame(filename):
    return filename.startswith(WORKER_DIR + os.sep)


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
    """{ename, evalue, traceback} without worker frames, repeats collapsed."""
    te = traceback.TracebackException(type(exc), exc, exc.__traceback__, capture_locals=False, compact=True)
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
    try:
        evalue = str(exc)
    except Exception:
        evalue = "<str() of the exception failed>"
    return {"ename": type(exc).__name__, "evalue": evalue, "traceback": lines}
