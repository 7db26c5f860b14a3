"""IPython syntax in cells: line and cell magics, ``!cmd``, ``x = !cmd``,
``obj?``/``obj??`` and ``get_ipython()``.

A cell is only looked at here after it failed to compile as plain Python
(:func:`transform` is called on a ``SyntaxError``), so a plain cell pays
nothing. When IPython is importable in the kernel's interpreter, its own
input transformers (``TransformerManager``) rewrite the cell and its own
``InteractiveShell`` runs the magics, with its display publisher sending to
this worker's display path and shell commands running as plain
subprocesses on the cell's stdout/stderr (no pty, no ipykernel, no event
loop). Without IPython (or with ``CELLHOST_IPYTHON=0`` in the kernel's
environment), :class:`BuiltinShell` and a line-based transformer cover the
common magics; any other magic is a ``UsageError`` naming it and saying to
install IPython in that environment.
"""
from .prims import BUILTINS as __builtins__  # noqa: F401,E402 - see prims
import builtins as _builtins_module
import re
import sys

from . import display, history, prims, state

os = prims.os
_modules = prims.MODULES

_shell = None          # the IPython InteractiveShell or a BuiltinShell, made on first use
_tm = None             # IPython's TransformerManager
_have_ipython = None   # cached: IPython importable and not switched off
MARKERS = ("%", "!", "?", ">>>", "In [")


class UsageError(Exception):
    """A magic that does not exist or was called wrongly (IPython's name)."""


# ------------------------------------------------------------ the decision

def ipython_available():
    """IPython importable in this interpreter and not switched off with
    ``CELLHOST_IPYTHON=0`` (checked once per kernel)."""
    global _have_ipython
    if _have_ipython is None:
        if os.environ.get("CELLHOST_IPYTHON", "") in ("0", "off", "no", "false"):
            _have_ipython = False
        elif "IPython" in _modules:
            _have_ipython = True
        else:
            import importlib.util
            try:
                _have_ipython = importlib.util.find_spec("IPython") is not None
            except (ImportError, ValueError):
                _have_ipython = False
    return _have_ipython


def might_be_ipython(source):
    """The cheap pre-check: could this (non-compiling) cell hold IPython
    syntax or an indented paste IPython would accept?"""
    for m in MARKERS:
        if m in source:
            return True
    first = source.lstrip("\r\n")[:1]
    return first == " " or first == "\t" or _one_command(source)


def _one_command(source):
    """A one-line cell that starts with a name (``cd dir``, ``ls``,
    ``mkdir tmp``): IPython runs such a line as a magic without its ``%``
    (automagic) or as a shell alias when the name is not bound."""
    text = source.strip()
    if not text or "\n" in text:
        return False
    word = text.split(None, 1)[0]
    return word.isidentifier()


def bare_command(source, namespace):
    """A cell that is one unbound name which IPython would run as a magic
    or a shell alias (``ls``, ``pwd``, ``who``): its transformed code, else
    None. Such a cell compiles as Python and would only raise NameError, so
    this costs a plain cell nothing but a string check."""
    text = source.strip()
    if not text.isidentifier() or text in namespace or hasattr(_builtins_module, text):
        return None
    if not ipython_available():
        return None
    return transform(source)


def transform(source):
    """The cell rewritten to plain Python, or None when nothing changed."""
    if not might_be_ipython(source):
        return None
    if ipython_available():
        global _tm
        if _tm is None:
            from IPython.core.inputtransformer2 import TransformerManager
            _tm = TransformerManager()
        out = _tm.transform_cell(source)
        if len(out.splitlines()) == 1:
            # IPython's dynamic transformations of a one-line cell
            # (automagic, aliases, autocall), as its run_cell applies them.
            out = get_ipython().prefilter_manager.prefilter_lines(out) + "\n"
    else:
        out = _builtin_transform(source)
    if out.rstrip() == source.rstrip():
        return None
    return out


# ---------------------------------------------------------- get_ipython()

def get_ipython():
    """The kernel's shell: IPython's ``InteractiveShell`` when IPython is
    importable, otherwise cellhost's :class:`BuiltinShell`."""
    global _shell
    if _shell is None:
        namespace = _modules["__main__"].__dict__
        if ipython_available():
            try:
                _shell = _make_ipython_shell(namespace)
            except ImportError:
                _shell = None
        if _shell is None:
            _shell = BuiltinShell(namespace)
    return _shell


def install(namespace):
    """Puts ``get_ipython`` into the builtins (as IPython does)."""
    _builtins_module.get_ipython = get_ipython


def before_cell(code, count, silent):
    """Right before a cell's code: IPython's ``pre_execute``/``pre_run_cell``
    events (autoreload), or the built-in autoreload."""
    sh = _shell
    if sh is None:
        return
    if type(sh) is BuiltinShell:
        sh.autoreload_check()
        return
    try:
        sh.execution_count = count
        from IPython.core.interactiveshell import ExecutionInfo
        info = ExecutionInfo(code, not silent, silent, True, None)
        sh.events.trigger("pre_execute")
        if not silent:
            sh.events.trigger("pre_run_cell", info)
        sh._cellhost_info = info
    except Exception as exc:  # noqa: B902 - a callback's error is reported, not fatal
        _callback_error("pre_run_cell", exc)


def after_cell(status, error=None):
    """Right after a cell's code: IPython's ``post_execute``/``post_run_cell``."""
    sh = _shell
    if sh is None or type(sh) is BuiltinShell:
        return
    try:
        from IPython.core.interactiveshell import ExecutionResult
        info = getattr(sh, "_cellhost_info", None)
        sh.events.trigger("post_execute")
        if info is not None and not info.silent:
            result = ExecutionResult(info)
            result.execution_count = sh.execution_count
            sh.events.trigger("post_run_cell", result)
        sh._cellhost_info = None
    except Exception as exc:  # noqa: B902
        _callback_error("post_run_cell", exc)


def _callback_error(what, exc):
    try:
        sys.stderr.write("Error in callback (%s): %s: %s\n" % (what, prims.type_name(exc), prims.exc_text(exc)))
    except Exception:  # noqa: B902
        pass


# ------------------------------------------------------- IPython's own shell

def _ipython_dir():
    d = os.environ.get("IPYTHONDIR")
    if d:
        return d
    import tempfile
    d = os.path.join(tempfile.gettempdir(), "cellhost-ipython-%d" % os.getuid())
    try:
        os.mkdir(d, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return tempfile.mkdtemp(prefix="cellhost-ipython-")
    try:
        st = os.lstat(d)
    except OSError:
        return tempfile.mkdtemp(prefix="cellhost-ipython-")
    # A shared temporary directory: only a directory of our own is used.
    if st.st_uid != os.getuid() or (st.st_mode & 0o022) or not _is_dir(st.st_mode):
        return tempfile.mkdtemp(prefix="cellhost-ipython-")
    return d


def _is_dir(mode):
    import stat
    return stat.S_ISDIR(mode)


def _make_ipython_shell(namespace):
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.core.displaypub import DisplayPublisher
    from traitlets.config import Config

    class CellhostDisplayPublisher(DisplayPublisher):
        """IPython's display publisher, sending to cellhost's display path."""

        def publish(self, data, metadata=None, source=None, *, transient=None, update=False, **kwargs):
            display.send_bundle(data, metadata)

        def clear_output(self, wait=False):
            pass

    config = Config()
    config.HistoryManager.enabled = False
    config.InteractiveShell.warn_venv = False
    config.InteractiveShell.colors = "nocolor"
    ipdir = _ipython_dir()
    main_module = _modules["__main__"]
    shell = InteractiveShell.instance(config=config, ipython_dir=ipdir,
                                      user_module=main_module, user_ns=namespace)
    shell.display_pub = CellhostDisplayPublisher(shell=shell)
    # IPython's own names for the history are cellhost's (see history), and
    # exit()/quit() stay Python's (they end the cell, not a session).
    history.reinstall(namespace)
    for name in ("exit", "quit"):
        if namespace.get(name) is getattr(shell, "exiter", None):
            del namespace[name]
    for name in history.HIDDEN:
        if name in namespace:
            shell.user_ns_hidden[name] = namespace[name]
    shell.execution_count = state.execution_count
    _builtins_module.display = display.display
    _builtins_module.get_ipython = get_ipython
    # Shell commands: a plain subprocess on the cell's own stdout/stderr
    # (IPython's default runs them under a pty through pexpect).
    shell.system = lambda cmd: _system(shell.var_expand(cmd, depth=1), shell.user_ns)
    mm = shell.magics_manager
    original_config = mm.magics["line"].get("config")

    def config_magic(line):
        if line.strip().startswith("InlineBackend"):
            return None  # cellhost renders figures itself; accepted
        if original_config is None:
            raise UsageError("%config is not available")
        return original_config(line)

    line_magics = mm.magics["line"]
    line_magics["config"] = config_magic
    line_magics["matplotlib"] = _matplotlib
    line_magics["pylab"] = lambda line: _pylab(shell.user_ns, line)
    # Installs go to the host (the kernel is offline): see pip.
    from . import pip
    line_magics["pip"] = lambda line: pip.pip_magic(shell.var_expand(line, depth=1))
    line_magics["uv"] = lambda line: pip.uv_magic(shell.var_expand(line, depth=1))
    return shell


# ------------------------------------------------------------ shared helpers

def _flush():
    for s in (sys.stdout, sys.stderr):
        try:
            s.flush()
        except Exception:  # noqa: B902
            pass


def _system(cmd, user_ns):
    """``!cmd``: ``/bin/sh -c cmd`` on the cell's stdout/stderr; the exit
    status goes to ``_exit_code``. An interrupt ends the command and the cell."""
    import subprocess
    from . import pip
    specs = pip.shell_install(cmd)
    if specs is not None:
        pip.install(specs)
        user_ns["_exit_code"] = 0
        return None
    _flush()
    rc = subprocess.call(cmd, shell=True)
    user_ns["_exit_code"] = rc
    return None


def _matplotlib(line):
    """``%matplotlib [backend]``: accepted; cellhost's backend sends the
    figures (as the inline backend does)."""
    return None


def _pylab(user_ns, line):
    """``%pylab``: numpy and pyplot names in the namespace, as IPython's."""
    code = ("import numpy\nimport matplotlib\nfrom matplotlib import pylab, mlab, pyplot\n"
            "np = numpy\nplt = pyplot\nfrom pylab import *\nfrom numpy import *\n")
    exec(compile(code, "<pylab>", "exec"), user_ns)
    return None


# ------------------------------------------------------ built-in transformer

_CELL_MAGIC = re.compile(r"%%([A-Za-z_][\w.]*)[ \t]*(.*)")
_LINE_ESCAPE = re.compile(r"([ \t]*)(%{1}|!{1,2})(.*)")
_ASSIGN = re.compile(r"([ \t]*)((?:[\w.]+|\[[^\]]*\]|\([^)]*\))(?:[ \t]*,[ \t]*[\w.]+)*)[ \t]*=[ \t]*(%|!{1,2})(.*)")
_HELP = re.compile(r"([ \t]*)(\?{1,2})?([A-Za-z_][\w.]*(?:\(\))?(?:\[[^\]]*\])?)(\?{1,2})?[ \t]*")
_PROMPT = re.compile(r"^(>>> |\.\.\. |>>>$|\.\.\.$)")


def _call_for(kind, rest):
    """The Python call for an escape: ``%``, ``!`` or ``!!`` and its text."""
    if kind == "!":
        return "get_ipython().system(%r)" % rest.strip()
    if kind == "!!":
        return "get_ipython().getoutput(%r)" % rest.strip()
    name, _, args = rest.strip().partition(" ")
    return "get_ipython().run_line_magic(%r, %r)" % (name, args.strip())


def _scan(line, in_str, depth):
    """(in_str, depth) after ``line``: the open string's quote (or None) and
    the bracket depth, skipping comments and strings."""
    i, n = 0, len(line)
    while i < n:
        c = line[i]
        if in_str is not None:
            if c == "\\":
                i += 2
                continue
            if line.startswith(in_str, i):
                i += len(in_str)
                in_str = None
                continue
            i += 1
            continue
        if c == "#":
            break
        if c in "'\"":
            q = c * 3 if line.startswith(c * 3, i) else c
            in_str = q
            i += len(q)
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth = max(0, depth - 1)
        i += 1
    if in_str is not None and len(in_str) == 1 and not line.rstrip("\r\n").endswith("\\"):
        in_str = None  # an unterminated one-quote string ends at its line
    return in_str, depth


def _dedent(lines):
    import textwrap
    return textwrap.dedent("".join(lines)).splitlines(True)


def _builtin_transform(source):
    lines = source.splitlines(True)
    while lines and not lines[0].strip():
        lines.pop(0)
    if not lines:
        return source
    # Pasted prompts (>>> and ...), as IPython's classic_prompt.
    code_lines = [l for l in lines if l.strip()]
    if code_lines and _PROMPT.match(code_lines[0]):
        lines = [_PROMPT.sub("", l, count=1) for l in lines]
    if lines[0][:1] in (" ", "\t"):
        lines = _dedent(lines)
    m = _CELL_MAGIC.fullmatch(lines[0].rstrip("\r\n"))
    if m:
        body = "".join(lines[1:])
        return "get_ipython().run_cell_magic(%r, %r, %r)\n" % (m.group(1), m.group(2).strip(), body)
    out, in_str, depth, cont = [], None, 0, False
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        at_start = in_str is None and depth == 0 and not cont
        text = line.rstrip("\r\n")
        new = None
        if at_start and text.strip():
            # A magic or command continued with backslashes is one line.
            while text.endswith("\\") and i < len(lines) and _LINE_ESCAPE.match(text) and text.lstrip()[:1] in "%!":
                text = text[:-1] + " " + lines[i].rstrip("\r\n").lstrip()
                i += 1
            new = _transform_line(text)
        if new is not None:
            out.append(new + "\n")
            cont = False
            continue
        out.append(line)
        in_str, depth = _scan(line, in_str, depth)
        cont = in_str is None and text.endswith("\\")
    return "".join(out)


def _transform_line(text):
    m = _LINE_ESCAPE.fullmatch(text)
    if m and m.group(3).strip():
        indent, kind, rest = m.groups()
        return indent + _call_for(kind, rest)
    m = _ASSIGN.fullmatch(text)
    if m:
        indent, lhs, kind, rest = m.groups()
        if kind == "!":
            kind = "!!"
        return "%s%s = %s" % (indent, lhs, _call_for(kind, rest))
    if "?" in text:
        m = _HELP.fullmatch(text)
        if m and (m.group(2) or m.group(4)):
            indent, pre, name, post = m.groups()
            marks = post or pre
            return "%sget_ipython().run_line_magic(%r, %r)" % (indent, "pinfo2" if marks == "??" else "pinfo", name)
    return None


# ------------------------------------------------------------ built-in shell

class SList(list):
    """A list of output lines (IPython's ``SList``): ``.s`` space-joined,
    ``.n`` newline-joined, ``.l`` the list, ``.p`` as paths, ``grep``, ``fields``."""

    @property
    def s(self):
        return " ".join(self)

    @property
    def n(self):
        return "\n".join(self)

    @property
    def l(self):  # noqa: E743 - IPython's name
        return list(self)

    @property
    def p(self):
        import pathlib
        return [pathlib.Path(x) for x in self if os.path.exists(x)]

    def grep(self, pattern, prune=False, field=None):
        rx = re.compile(pattern) if isinstance(pattern, str) else None
        def hit(s):
            target = s.split()[field] if field is not None and len(s.split()) > field else s
            return bool(rx.search(target)) if rx is not None else bool(pattern(target))
        return SList([s for s in self if hit(s) != prune])

    def fields(self, *idx):
        out = SList()
        for line in self:
            parts = line.split()
            if not idx:
                out.append(" ".join(parts))
            else:
                out.append(" ".join(parts[i] for i in idx if -len(parts) <= i < len(parts)))
        return out


class _Events:
    """``get_ipython().events``: callbacks are accepted and kept (the
    built-in shell fires none)."""

    def __init__(self):
        self.callbacks = {}

    def register(self, event, function):
        self.callbacks.setdefault(event, []).append(function)

    def unregister(self, event, function):
        try:
            self.callbacks.get(event, []).remove(function)
        except ValueError:
            pass

    def trigger(self, event, *args, **kwargs):
        for fn in list(self.callbacks.get(event, [])):
            fn(*args, **kwargs)


class BuiltinShell:
    """``get_ipython()`` without IPython: the built-in magics."""

    def __init__(self, user_ns):
        self.user_ns = user_ns
        self.events = _Events()
        self.kernel = None
        self.config = {}
        self._dirs = []
        self._autoreload = 0
        self._aimported = set()
        self._mtimes = {}
        from . import builtin_magics
        self.line_magics = dict(builtin_magics.LINE)
        self.cell_magics = dict(builtin_magics.CELL)

    @property
    def execution_count(self):
        return state.execution_count

    def run_line_magic(self, magic_name, line, _stack_depth=1):
        fn = self.line_magics.get(magic_name)
        if fn is None:
            raise UsageError(_missing("%", magic_name, "Line", self.cell_magics))
        return fn(self, line)

    def run_cell_magic(self, magic_name, line, cell):
        fn = self.cell_magics.get(magic_name)
        if fn is None:
            raise UsageError(_missing("%%", magic_name, "Cell", self.line_magics))
        return fn(self, line, cell)

    def magic(self, arg_s):
        name, _, rest = arg_s.lstrip("%").partition(" ")
        return self.run_line_magic(name, rest)

    def system(self, cmd):
        return _system(self.var_expand(cmd, 1), self.user_ns)

    def getoutput(self, cmd, split=True, depth=0):
        import subprocess
        _flush()
        out = subprocess.run(self.var_expand(cmd, depth + 1), shell=True, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT).stdout.decode("utf-8", "replace")
        return SList(out.splitlines()) if split else out

    def ev(self, expr):
        return eval(expr, self.user_ns)

    def ex(self, cmd):
        exec(cmd, self.user_ns)

    def var_expand(self, cmd, depth=0):
        """``{expr}`` and ``$name`` from the caller's namespace (as IPython
        does in shell commands); what does not evaluate stays as written."""
        ns = dict(self.user_ns)
        try:
            frame = sys._getframe(depth + 1)
            ns.update(frame.f_globals)
            ns.update(frame.f_locals)
        except ValueError:
            pass

        def brace(m):
            try:
                return str(eval(m.group(1), ns))
            except Exception:  # noqa: B902 - left as written, like IPython
                return m.group(0)

        def dollar(m):
            if m.group(0) == "$$":
                return "$"
            name = m.group(1)
            head, *rest = name.split(".")
            if head not in ns:
                return m.group(0)
            try:
                val = ns[head]
                for attr in rest:
                    val = getattr(val, attr)
                return str(val)
            except Exception:  # noqa: B902
                return m.group(0)

        cmd = re.sub(r"(?<!\{)\{([^{}]+)\}(?!\})", brace, cmd)
        return re.sub(r"\$\$|\$([A-Za-z_][\w.]*)", dollar, cmd)

    def autoreload_check(self):
        if not self._autoreload:
            return
        from . import builtin_magics
        builtin_magics.reload_changed(self)


def _missing(prefix, name, kind, other):
    hint = ""
    if name in other:
        hint = " (there is a %s magic %s%s)" % ("cell" if prefix == "%" else "line",
                                                "%%" if prefix == "%" else "%", name)
    return ("%s magic function `%s%s` is not available without IPython%s; install IPython in "
            "this kernel's environment (`%s -m pip install ipython`) to use it."
            % (kind, prefix, name, hint, sys.executable))
