"""The magics of :class:`cellhost_worker.magics.BuiltinShell` (a kernel
without IPython): ``%time``, ``%timeit``, ``%%capture``, ``%%writefile``,
``%cd``, ``%pwd``, ``%env``, ``%matplotlib``, ``%pip``, ``%who``/``%whos``,
``%load_ext autoreload`` + ``%autoreload``, ``%run``, ``%pinfo`` and a few
more. Output formats follow IPython's.

Each line magic is ``fn(shell, line)``, each cell magic
``fn(shell, line, cell)``; what they return is the value of the call (the
cell's result when the magic is its last line).
"""
from .prims import BUILTINS as __builtins__  # noqa: F401,E402 - see prims
import math
import shlex
import sys

from . import display, execute, history, magics, prims

os = prims.os
_modules = prims.MODULES


def _usage(msg):
    return magics.UsageError(msg)


def _run_source(shell, source, filename):
    """Runs ``source`` like a cell in the user namespace; returns the value
    of its last expression (None when it ends with a statement or ``;``)."""
    body, last = execute.compile_cell(source, filename)
    value = None
    for code in (body, last):
        if code is not None:
            value = eval(code, shell.user_ns)
            if code.co_flags & 0x80:  # a coroutine: top-level await
                value = execute.run_coroutine(value)
    return value


# ----------------------------------------------------------------- timing

def format_time(timespan, precision=3):
    """A duration as IPython prints it (``1.2 ms``, ``3min 2s``)."""
    if timespan >= 60.0:
        parts = [("d", 60 * 60 * 24), ("h", 60 * 60), ("min", 60), ("s", 1)]
        out, left = [], timespan
        for suffix, length in parts:
            value = int(left / length)
            if value > 0:
                left = left % length
                out.append("%s%s" % (value, suffix))
            if left < 1:
                break
        return " ".join(out)
    units = ["s", "ms", "\xb5s", "ns"]
    scaling = [1, 1e3, 1e6, 1e9]
    order = min(-int(math.floor(math.log10(timespan)) // 3), 3) if timespan > 0.0 else 3
    return "%.*g %s" % (precision, timespan * scaling[order], units[order])


def _clock():
    import resource
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime, ru.ru_stime


def _time(shell, line, cell=None):
    import time
    source = cell if cell is not None else line
    if cell is not None and line.strip():
        _run_source(shell, line, "<timed setup>")
    u0, s0 = _clock()
    w0 = time.perf_counter()
    try:
        value = _run_source(shell, source, "<timed exec>")
    finally:
        w1 = time.perf_counter()
        u1, s1 = _clock()
        cu, cs = u1 - u0, s1 - s0
        print("CPU times: user %s, sys: %s, total: %s" % (format_time(cu), format_time(cs), format_time(cu + cs)))
        print("Wall time: %s" % format_time(w1 - w0))
    return value


class TimeitResult:
    """What ``%timeit -o`` returns (IPython's fields)."""

    def __init__(self, loops, repeat, best, worst, all_runs, precision):
        self.loops, self.repeat, self.best, self.worst = loops, repeat, best, worst
        self.all_runs, self._precision = all_runs, precision
        self.timings = [dt / loops for dt in all_runs]
        n = len(self.timings)
        self.average = math.fsum(self.timings) / n
        self.stdev = math.sqrt(math.fsum((x - self.average) ** 2 for x in self.timings) / n)

    def __str__(self):
        return "%s \xb1 %s per loop (mean \xb1 std. dev. of %d run%s, %d loop%s each)" % (
            format_time(self.average, self._precision), format_time(self.stdev, self._precision),
            self.repeat, "" if self.repeat == 1 else "s", self.loops, "" if self.loops == 1 else "s")

    __repr__ = __str__


def _timeit(shell, line, cell=None):
    import getopt
    import timeit
    try:
        opts, rest = getopt.getopt(shlex.split(line, posix=False), "n:r:tcp:qo")
    except getopt.GetoptError as exc:
        raise _usage("%%timeit: %s" % exc)
    opts = dict(opts)
    stmt = " ".join(rest) if cell is None else cell
    setup = "pass" if cell is None else (" ".join(rest) or "pass")
    number = int(opts.get("-n", 0))
    repeat = int(opts.get("-r", 7))
    precision = int(opts.get("-p", 3))
    ns = shell.user_ns
    timer = timeit.Timer(stmt=stmt, setup=setup, globals=ns)
    if number == 0:
        for index in range(0, 10):
            number = 10 ** index
            if timer.timeit(number) >= 0.2:
                break
    runs = timer.repeat(repeat, number)
    best, worst = min(runs) / number, max(runs) / number
    result = TimeitResult(number, repeat, best, worst, runs, precision)
    if "-q" not in opts:
        if worst > 4 * best and best > 0 and worst > 1e-6:
            print("The slowest run took %0.2f times longer than the fastest. This could mean that an "
                  "intermediate result is being cached." % (worst / best))
        print(result)
    return result if "-o" in opts else None


# ---------------------------------------------------------------- capture

class CapturedIO:
    """What ``%%capture NAME`` keeps: ``stdout``, ``stderr``, ``outputs``
    (MIME bundles); ``show()`` (or calling it) replays them."""

    def __init__(self, stdout, stderr, outputs):
        self._stdout, self._stderr, self.outputs = stdout, stderr, outputs

    @property
    def stdout(self):
        return self._stdout.getvalue() if self._stdout is not None else ""

    @property
    def stderr(self):
        return self._stderr.getvalue() if self._stderr is not None else ""

    def show(self):
        if self.stdout:
            sys.stdout.write(self.stdout)
        if self.stderr:
            sys.stderr.write(self.stderr)
        for data, md in self.outputs:
            display.send_display(data, md)

    __call__ = show

    def __str__(self):
        return self.stdout


def _capture(shell, line, cell):
    import io
    args = shlex.split(line)
    name = next((a for a in args if not a.startswith("-")), None)
    out = None if "--no-stdout" in args else io.StringIO()
    err = None if "--no-stderr" in args else io.StringIO()
    outputs = [] if "--no-display" not in args else None
    saved = sys.stdout, sys.stderr
    if out is not None:
        sys.stdout = out
    if err is not None:
        sys.stderr = err
    if outputs is not None:
        display.capture_stack.append(outputs)
    try:
        value = _run_source(shell, cell, "<capture>")
        if value is not None and outputs is not None:
            data, md = display.bundle(value)
            outputs.append((data, md))
    finally:
        sys.stdout, sys.stderr = saved
        if outputs is not None:
            display.capture_stack.pop()
    if name:
        shell.user_ns[name] = CapturedIO(out, err, outputs or [])
    return None


# ------------------------------------------------------------ files, dirs

def _writefile(shell, line, cell):
    args = shlex.split(shell.var_expand(line, 1))
    append = "-a" in args or "--append" in args
    names = [a for a in args if a not in ("-a", "--append")]
    if len(names) != 1:
        raise _usage("%%writefile takes one file name (and -a to append)")
    path = os.path.expanduser(names[0]) if hasattr(os, "path") else names[0]
    if os.path.exists(path):
        print("Appending to %s" % names[0] if append else "Overwriting %s" % names[0])
    else:
        print("Writing %s" % names[0])
    with open(path, "a" if append else "w", encoding="utf-8") as fh:
        fh.write(cell)
    return None


def _cd(shell, line):
    arg = shell.var_expand(line, 1).strip()
    here = os.getcwd()
    if not arg:
        target = os.path.expanduser("~")
    elif arg == "-":
        if not shell._dirs:
            raise _usage("%cd -: no previous directory")
        target = shell._dirs[-1]
    else:
        if (arg[0] == arg[-1]) and arg[0] in "'\"" and len(arg) > 1:
            arg = arg[1:-1]
        target = os.path.expanduser(arg)
    os.chdir(target)
    shell._dirs.append(here)
    print(os.getcwd())
    return None


def _pwd(shell, line):
    return os.getcwd()


def _env(shell, line):
    arg = shell.var_expand(line, 1).strip()
    environ = _modules["os"].environ
    if not arg:
        return dict(environ)
    if "=" in arg or " " in arg:
        sep = "=" if "=" in arg.split(" ", 1)[0] else " "
        name, value = arg.split(sep, 1)
        name, value = name.strip(), value.strip()
        if (value[:1] == value[-1:]) and value[:1] in ("'", '"') and len(value) > 1:
            value = value[1:-1]
        environ[name] = value
        print("env: %s=%s" % (name, value))
        return None
    try:
        return environ[arg]
    except KeyError:
        raise _usage("Environment does not have key: %s" % arg)


def _set_env(shell, line):
    return _env(shell, line)


# -------------------------------------------------------- matplotlib, pip

def _matplotlib(shell, line):
    return magics._matplotlib(line)


def _pylab(shell, line):
    return magics._pylab(shell.user_ns, line)


def _config(shell, line):
    if line.strip().startswith("InlineBackend"):
        return None  # cellhost renders figures itself
    raise _usage("%%config %s is not available without IPython; install IPython in this kernel's "
                 "environment (`%s -m pip install ipython`) to use it." % (line.strip(), sys.executable))


def _pip(shell, line):
    from . import pip
    return pip.pip_magic(shell.var_expand(line, 1))


def _uv(shell, line):
    from . import pip
    return pip.uv_magic(shell.var_expand(line, 1))


# ------------------------------------------------------------- namespace

def _user_names(shell, types=()):
    out = []
    for name, value in list(shell.user_ns.items()):
        if type(name) is not str or name.startswith("_") or name in history.HIDDEN:
            continue
        if types and prims.type_name(value) not in types:
            continue
        out.append(name)
    out.sort()
    return out


def _who(shell, line):
    types = tuple(line.split())
    names = _user_names(shell, types)
    if not names:
        print("No variables match your requested type." if types else "Interactive namespace is empty.")
        return None
    count = 0
    for n in names:
        print(n + "\t", end=" ")
        count += 1
        if count > 8:
            count = 0
            print()
    print()
    return None


def _who_ls(shell, line):
    return _user_names(shell, tuple(line.split()))


def _whos(shell, line):
    names = _user_names(shell, tuple(line.split()))
    if not names:
        print("Interactive namespace is empty.")
        return None
    ns = shell.user_ns
    types = [prims.type_name(ns[n]) for n in names]
    colsep = 3
    vw = max(max(len(n) for n in names), len("Variable")) + colsep
    tw = max(max(len(t) for t in types), len("Type")) + colsep
    print("Variable".ljust(vw) + "Type".ljust(tw) + "Data/Info")
    print("-" * (vw + tw + len("Data/Info") + 1))
    np = _modules.get("numpy")
    for n, t in zip(names, types):
        v = ns[n]
        try:
            if np is not None and isinstance(v, np.ndarray):
                info = "%s: %s elems, type `%s`, %s bytes" % ("x".join(str(d) for d in v.shape), v.size, v.dtype, v.nbytes)
            else:
                info = str(v).replace("\n", "\\n")
        except Exception:  # noqa: B902 - a broken __str__
            info = "<%s>" % t
        if len(info) >= 50:
            info = info[:25] + "<...>" + info[-25:]
        print(n.ljust(vw) + t.ljust(tw) + info)
    return None


def _reset(shell, line):
    if "-f" not in line.split():
        raise _usage("%reset without -f asks for confirmation, which a kernel cannot; use %reset -f")
    for name in _user_names(shell):
        shell.user_ns.pop(name, None)
    return None


# ------------------------------------------------------------- autoreload

def _load_ext(shell, line):
    name = line.strip()
    if name == "autoreload":
        return None
    raise _usage("%%load_ext %s is not available without IPython; install IPython in this kernel's "
                 "environment (`%s -m pip install ipython`) to load extensions." % (name, sys.executable))


_MODES = {"0": 0, "off": 0, "1": 1, "explicit": 1, "2": 2, "all": 2, "3": 3, "complete": 3, "": 2, "now": -1}


def _autoreload(shell, line):
    arg = line.strip().split()[0] if line.strip() else ""
    mode = _MODES.get(arg)
    if mode is None:
        raise _usage("%%autoreload: unknown mode %r (use 0, 1, 2 or 3)" % arg)
    if mode == -1:
        reload_changed(shell, force=True)
        return None
    shell._autoreload = mode
    _snapshot(shell)
    return None


def _aimport(shell, line):
    import importlib
    for name in line.replace(",", " ").split():
        if name.startswith("-"):
            shell._aimported.discard(name[1:])
            continue
        shell._aimported.add(name)
        top = name.split(".")[0]
        mod = importlib.import_module(name)
        shell.user_ns[top] = _modules[top] if top in _modules else mod
    _snapshot(shell)
    return None


def _mtime(mod):
    path = getattr(mod, "__file__", None)
    if type(path) is not str or not path.endswith(".py"):
        return None
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


def _candidates(shell):
    for name, mod in list(_modules.items()):
        if mod is None or name.startswith("cellhost_worker") or name == "__main__":
            continue
        if shell._autoreload == 1 and name not in shell._aimported:
            continue
        yield name, mod


def _snapshot(shell):
    for name, mod in _candidates(shell):
        t = _mtime(mod)
        if t is not None:
            shell._mtimes[name] = t


def reload_changed(shell, force=False):
    """Reloads the modules whose source changed since they were last seen
    (``%autoreload 1``: only the ``%aimport``-ed ones)."""
    import importlib
    for name, mod in list(_candidates(shell)):
        t = _mtime(mod)
        if t is None:
            continue
        seen = shell._mtimes.get(name)
        shell._mtimes[name] = t
        if (seen is not None and seen != t) or (force and seen is None):
            try:
                importlib.reload(mod)
            except Exception as exc:  # noqa: B902 - reported like IPython's autoreload
                sys.stderr.write("[autoreload of %s failed: %s: %s]\n" % (name, prims.type_name(exc), prims.exc_text(exc)))


# -------------------------------------------------------------------- run

def _run(shell, line):
    args = shlex.split(shell.var_expand(line, 1))
    interactive = False
    while args and args[0].startswith("-"):
        opt = args.pop(0)
        if opt == "-i":
            interactive = True
        elif opt in ("-t", "-n", "-e"):
            continue
        else:
            raise _usage("%%run %s needs IPython; install IPython in this kernel's environment "
                         "(`%s -m pip install ipython`)" % (opt, sys.executable))
    if not args:
        raise _usage("%run: a file name is required")
    path = os.path.expanduser(args[0])
    if path.endswith(".ipynb"):
        raise _usage("%%run of a notebook needs IPython; install IPython in this kernel's environment "
                     "(`%s -m pip install ipython`) or use `cellhost run %s`" % (sys.executable, args[0]))
    if not os.path.exists(path) and os.path.exists(path + ".py"):
        path += ".py"
    with open(path, "rb") as fh:
        source = fh.read()
    code = compile(source, path, "exec", dont_inherit=True)
    saved_argv = sys.argv
    sys.argv = [path] + args[1:]
    ns = shell.user_ns if interactive else {"__name__": "__main__", "__file__": path,
                                            "__builtins__": _modules["builtins"]}
    try:
        exec(code, ns)
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise
    finally:
        sys.argv = saved_argv
    if not interactive:
        for k, v in ns.items():
            if not (k.startswith("__") and k.endswith("__")):
                shell.user_ns[k] = v
    return None


# ------------------------------------------------------------------ help

def _lookup(shell, name):
    try:
        return True, eval(name, shell.user_ns)
    except Exception:  # noqa: B902
        return False, None


def _pinfo(shell, line, detail=False):
    import inspect
    name = line.strip()
    found, obj = _lookup(shell, name)
    if not found:
        print("Object `%s` not found." % name)
        return None
    rows = []
    if callable(obj):
        try:
            rows.append(("Signature", name.split(".")[-1] + str(inspect.signature(obj))))
        except (TypeError, ValueError):
            pass
    if not callable(obj) or isinstance(obj, type):
        try:
            text = str(obj)
            rows.append(("String form", text if len(text) < 200 else text[:100] + "<...>" + text[-100:]))
        except Exception:  # noqa: B902
            pass
    try:
        rows.append(("Length", str(len(obj))))
    except Exception:  # noqa: B902
        pass
    source = None
    if detail:
        try:
            source = inspect.getsource(obj)
        except (TypeError, OSError):
            source = None
    if source is None:
        doc = inspect.getdoc(obj)
        rows.append(("Docstring", doc if doc else "<no docstring>"))
    try:
        f = inspect.getfile(obj)
        rows.append(("File", f))
    except TypeError:
        pass
    rows.append(("Type", prims.type_name(obj)))
    width = max(len(k) for k, _ in rows) + 2
    for k, v in rows:
        print((k + ":").ljust(width) + v.replace("\n", "\n" + " " * width))
    if source is not None:
        print("Source:")
        print(source.rstrip("\n"))
    return None


def _pinfo2(shell, line):
    return _pinfo(shell, line, detail=True)


def _pdoc(shell, line):
    import inspect
    found, obj = _lookup(shell, line.strip())
    print(inspect.getdoc(obj) or "No documentation found." if found else "Object `%s` not found." % line.strip())
    return None


def _psource(shell, line):
    import inspect
    found, obj = _lookup(shell, line.strip())
    if not found:
        print("Object `%s` not found." % line.strip())
        return None
    print(inspect.getsource(obj).rstrip("\n"))
    return None


# ----------------------------------------------------------- shell cells

def _sx(shell, line):
    return shell.getoutput(line, depth=1)


def _system_magic(shell, line):
    return shell.getoutput(line, depth=1)


def _script(program):
    def run(shell, line, cell):
        import subprocess
        magics._flush()
        subprocess.run([program] + shlex.split(line), input=cell.encode())
        return None
    return run


def _mime_cell(mime, cls):
    def show(shell, line, cell):
        display.send_display({mime: cell, "text/plain": "<IPython.core.display.%s object>" % cls})
        return None
    return show


LINE = {
    "time": _time, "timeit": _timeit, "cd": _cd, "pwd": _pwd, "env": _env, "set_env": _set_env,
    "matplotlib": _matplotlib, "pylab": _pylab, "config": _config, "pip": _pip, "uv": _uv,
    "who": _who, "who_ls": _who_ls, "whos": _whos, "reset": _reset,
    "load_ext": _load_ext, "reload_ext": _load_ext, "autoreload": _autoreload, "aimport": _aimport,
    "run": _run, "pinfo": _pinfo, "pinfo2": _pinfo2, "pdoc": _pdoc, "psource": _psource,
    "sx": _sx, "system": _system_magic,
}

CELL = {
    "time": _time, "timeit": _timeit, "capture": _capture, "writefile": _writefile,
    "bash": _script("bash"), "sh": _script("sh"),
    "html": _mime_cell("text/html", "HTML"), "HTML": _mime_cell("text/html", "HTML"),
    "markdown": _mime_cell("text/markdown", "Markdown"), "latex": _mime_cell("text/latex", "Latex"),
    "svg": _mime_cell("image/svg+xml", "SVG"),
}
