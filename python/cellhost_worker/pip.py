"""``%pip install``, ``!pip install`` and ``%uv pip install``: the host installs.

The kernel has no network, so it never runs an installer itself: the specs
go to the host's built-in tool ``cellhost.install_packages``, which runs
``uv pip``/``pip`` on the host into the session's package overlay (a
directory the host writes and the kernel reads, on ``sys.path`` before
site-packages). The installer's output comes back as the cell's; the
import caches are invalidated so the next line imports the packages; a
note says when a module the install replaced was already imported (a
restart is needed to use the new version). Other pip commands (``list``,
``show``, ``freeze``, …) run ``sys.executable -m pip`` in the kernel, offline.
"""
from .prims import BUILTINS as __builtins__  # noqa: F401,E402 - see prims
import shlex
import sys

from . import api, prims

INSTALL_TOOL = "cellhost.install_packages"
overlay = None  # the overlay's site directory (set by main from the kernel's configuration)

# Options of ``pip install`` accepted and dropped (they change nothing the
# host does); every other option is refused by the host's spec check.
_IGNORED = {"-q", "--quiet", "-qq", "-U", "--upgrade", "--no-cache-dir", "--user", "-v", "--verbose"}


class PackageInstallError(RuntimeError):
    """The host refused or could not install the packages."""


def add_overlay(path):
    """Puts the overlay's site directory on ``sys.path`` before the first
    site-packages entry (once)."""
    global overlay
    if type(path) is not str or not path:
        return
    overlay = path
    if path in sys.path:
        return
    at = len(sys.path)
    for i, entry in enumerate(sys.path):
        if type(entry) is str and (entry.endswith("site-packages") or entry.endswith("dist-packages")):
            at = i
            break
    sys.path.insert(at, path)


class _LogTail:
    """Follows the installer's output while the host runs it: the host
    appends it to ``<overlay>/logs/<nonce>.out`` and ``.err`` (read-only
    here), and each poll copies what is new to the cell's stdout/stderr."""

    def __init__(self):
        self.nonce = prims.b2a_hex(prims.os.urandom(12)).decode("ascii")
        self.streamed = False
        self._files = []
        if overlay:
            base = overlay.rpartition("/")[0] + "/logs/" + self.nonce
            import codecs
            for ext, stream in ((".out", "stdout"), (".err", "stderr")):
                self._files.append([base + ext, stream, None, codecs.getincrementaldecoder("utf-8")("replace")])

    def poll(self, final=False):
        for f in self._files:
            path, stream, fd, dec = f
            if fd is None:
                try:
                    fd = f[2] = prims.os.open(path, prims.os.O_RDONLY | prims.os.O_NOFOLLOW | prims.os.O_CLOEXEC)
                except OSError:
                    continue
            while True:
                try:
                    chunk = prims.os.read(fd, 65536)
                except OSError:
                    break
                if not chunk:
                    break
                self.streamed = True
                text = dec.decode(chunk)
                if text:
                    getattr(sys, stream).write(text)
            if final:
                rest = dec.decode(b"", True)
                if rest:
                    getattr(sys, stream).write(rest)
        for s in (sys.stdout, sys.stderr):
            try:
                s.flush()
            except Exception:  # noqa: B902
                pass

    def finish(self):
        self.poll(final=True)
        for f in self._files:
            if f[2] is not None:
                try:
                    prims.os.close(f[2])
                except OSError:
                    pass
                f[2] = None


def _imported():
    names = set()
    for name in list(prims.MODULES):
        if type(name) is str:
            names.add(name.partition(".")[0])
    return sorted(names)


def install(args, shared=False):
    """Installs the specs ``args`` on the host; prints the installer's
    output; returns None."""
    specs = []
    for a in args:
        if a in _IGNORED:
            continue
        if a == "--shared-venv":
            shared = True
            continue
        specs.append(a)
    for s in (sys.stdout, sys.stderr):
        try:
            s.flush()
        except Exception:  # noqa: B902
            pass
    tail = _LogTail()
    try:
        report = api.call(INSTALL_TOOL, {"packages": specs, "shared": shared, "imported": _imported(),
                                         "log": tail.nonce}, poll=tail.poll)
    except api.ToolError as e:
        tail.finish()
        text = str(e)
        reply = prims.loads_line(text.encode("utf-8", "replace")) if text.startswith("{") else None
        if type(reply) is dict and reply.get("code"):
            message = "%s: %s" % (reply.get("code"), reply.get("message", ""))
            tail = reply.get("stderr_tail")
            if tail and tail not in message:
                message += "\n" + tail
        else:
            message = text
        raise PackageInstallError(message) from None
    tail.finish()
    if type(report) is not dict:
        report = {}
    if not tail.streamed:
        # No log to follow (the overlay is not in view): the report's copy.
        out = report.get("stdout") or ""
        err = report.get("stderr") or ""
        if out:
            sys.stdout.write(out if out.endswith("\n") else out + "\n")
        if err:
            sys.stderr.write(err if err.endswith("\n") else err + "\n")
    import importlib
    importlib.invalidate_caches()
    if overlay and overlay not in sys.path and not shared:
        add_overlay(overlay)
    if report.get("restart_needed"):
        mods = ", ".join(report.get("restart_modules") or ())
        sys.stderr.write("Note: %s was already imported; restart the kernel to use the version just installed.\n"
                         % (mods or "a module of these packages"))
    return None


def pip_magic(line):
    """``%pip ARGS``: ``install`` goes to the host; the rest runs offline."""
    try:
        args = shlex.split(line)
    except ValueError as e:
        raise PackageInstallError("%%pip: %s" % (e,)) from None
    if args and args[0] == "install":
        return install(args[1:])
    import subprocess
    for s in (sys.stdout, sys.stderr):
        try:
            s.flush()
        except Exception:  # noqa: B902
            pass
    subprocess.call([sys.executable, "-m", "pip"] + args)
    return None


def uv_magic(line):
    """``%uv pip install ARGS``: as ``%pip install``."""
    try:
        args = shlex.split(line)
    except ValueError as e:
        raise PackageInstallError("%%uv: %s" % (e,)) from None
    if args[:2] == ["pip", "install"]:
        return install(args[2:])
    raise PackageInstallError("%%uv: only `%%uv pip install PKG…` is available in a cellhost kernel")


def shell_install(cmd):
    """``!pip install PKG…`` (and ``pip3``, ``uv pip``, ``python -m pip``,
    the kernel's own interpreter by path): the arguments after ``install``
    when ``cmd`` is exactly such a command, else None (it runs as a shell
    command)."""
    if type(cmd) is not str or "install" not in cmd or any(c in cmd for c in ";&|<>`$(){}\n"):
        return None
    try:
        args = shlex.split(cmd)
    except ValueError:
        return None
    if not args:
        return None
    prog = args[0].rpartition("/")[2]
    if prog in ("pip", "pip3") or prog.startswith("pip3."):
        rest = args[1:]
    elif prog == "uv" and args[1:2] == ["pip"]:
        rest = args[2:]
    elif (prog in ("python", "python3") or prog.startswith("python3.") or args[0] == sys.executable) \
            and args[1:3] == ["-m", "pip"]:
        rest = args[3:]
    else:
        return None
    if rest[:1] != ["install"]:
        return None
    return rest[1:]
