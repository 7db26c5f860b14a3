"""MIME bundles for results and displays, and matplotlib figures.

Everything here calls code of the cell's objects (``__repr__``,
``_repr_html_`` …): what that code raises or returns instead of text
becomes a fallback, never an error of the worker.
"""
from .prims import BUILTINS as __builtins__  # noqa: F401,E402 - see prims
import io as _io_module
import sys

from . import pretty, prims, state

_BytesIO = _io_module.BytesIO
_modules = prims.MODULES

TEXT_CAP = 2 * 1024 * 1024  # per MIME entry; the host bounds further

_REPR_METHODS = (
    ("_repr_html_", "text/html"),
    ("_repr_markdown_", "text/markdown"),
    ("_repr_svg_", "image/svg+xml"),
    ("_repr_png_", "image/png"),
    ("_repr_jpeg_", "image/jpeg"),
    ("_repr_latex_", "text/latex"),
    ("_repr_json_", "application/json"),
)
_BINARY = ("image/png", "image/jpeg")
channel = None  # set by main
# Lists of (data, metadata) that displays go to instead of the host
# (``%%capture``); the innermost last.
capture_stack = []
# Displays sent to the host in the current cell (main resets it).
sent = 0


def _cap(text):
    """An exact ``str`` of at most TEXT_CAP characters (plus a note), or None."""
    text = prims.exact_str(text)
    if text is not None and len(text) > TEXT_CAP:
        return text[:TEXT_CAP] + "\n[... %d characters cut by the worker]" % (len(text) - TEXT_CAP)
    return text


def _plain(obj):
    try:
        text = _cap(pretty.text_plain(obj))
        if text is not None:
            return text
        why = "__repr__ returned a non-string"
    except Exception as exc:  # a broken __repr__ must not break the cell
        why = "%s: %s" % (prims.type_name(exc), prims.exc_text(exc))
    return "<%s object (repr failed: %s)>" % (prims.type_name(obj), why)


def _b64(data):
    return prims.b2a_base64(data, newline=False).decode("ascii")


def _encode_value(mime, value):
    mime = prims.exact_str(mime)
    if mime is None:
        return None
    t = type(value)
    if mime in _BINARY:
        if issubclass(t, (bytes, bytearray, memoryview)):
            return _b64(bytes(value))
        return prims.exact_str(value)
    if mime == "application/json":
        return value
    if issubclass(t, bytes):
        value = bytes.decode(value, "utf-8", "replace")
    return _cap(value)


def _figure_png(fig):
    buf = _BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    return buf.getvalue()


def is_figure(obj):
    mod = _modules.get("matplotlib.figure")
    if mod is None:
        return False
    try:
        return issubclass(type(obj), mod.Figure)
    except Exception:
        return False


def bundle(obj):
    """(data, metadata) for an object, like IPython's display formatter."""
    data, metadata = {}, {}
    if is_figure(obj):
        try:
            data["image/png"] = _b64(_figure_png(obj))
        except Exception as exc:
            data["text/plain"] = "<figure could not be rendered: %s: %s>" % (prims.type_name(exc), prims.exc_text(exc))
            return data, metadata
        data["text/plain"] = _plain(obj)
        return data, metadata
    cls = type(obj)
    is_class = issubclass(cls, type)
    try:
        mimebundle = None if is_class else getattr(cls, "_repr_mimebundle_", None)
    except Exception:
        mimebundle = None
    if mimebundle is not None:
        try:
            got = obj._repr_mimebundle_(include=None, exclude=None)
            if type(got) is tuple and len(got) == 2:
                got, md = got
                if type(md) is dict:
                    metadata.update(md)
            if type(got) is dict:
                for mime, value in list(got.items()):
                    enc = _encode_value(mime, value)
                    if enc is not None:
                        data[prims.exact_str(mime)] = enc
        except Exception:
            pass
    for method, mime in _REPR_METHODS:
        if mime in data or is_class:
            continue
        try:
            if getattr(cls, method, None) is None:
                continue
            value = getattr(obj, method)()
        except Exception:
            continue
        if type(value) is tuple and len(value) == 2:
            value, md = value
            if md and type(md) is dict:
                metadata[mime] = md
        if value is None:
            continue
        try:
            enc = _encode_value(mime, value)
        except Exception:
            continue
        if enc is not None:
            data[mime] = enc
    if "text/plain" not in data:
        data["text/plain"] = _plain(obj)
    return data, metadata


def send_display(data, metadata=None):
    global sent
    if capture_stack:
        capture_stack[-1].append((data, metadata or {}))
        return
    if channel is not None:
        channel.send({"type": "display", "id": state.current or "", "data": data, "metadata": metadata or {}})
        sent += 1


def send_bundle(data, metadata=None):
    """A ready MIME bundle from other code (IPython's display publisher):
    its values encoded as the host expects, what cannot be encoded left out."""
    if type(data) is not dict:
        return
    out = {}
    for k, v in list(dict.items(data)):
        enc = _encode_value(k, v)
        if enc is not None:
            out[prims.exact_str(k)] = enc
    md = metadata if type(metadata) is dict else {}
    send_display(out, md)


def display(*objs, raw=False, metadata=None, **_ignored):
    """Show objects in the cell's output (like IPython's ``display``).

    ``raw=True`` takes each object as a ready MIME bundle (a dict).
    """
    if metadata is not None and type(metadata) is not dict:
        metadata = None
    for obj in objs:
        if raw and issubclass(type(obj), dict):
            bundle_ = {}
            for k, v in list(dict.items(obj)):
                enc = _encode_value(k, v)
                if enc is not None:
                    bundle_[prims.exact_str(k)] = enc
            send_display(bundle_, metadata)
        else:
            data, md = bundle(obj)
            if metadata:
                md.update(metadata)
            send_display(data, md)
            if is_figure(obj):
                _close_figure(obj)


def _close_figure(fig):
    plt = _modules.get("matplotlib.pyplot")
    if plt is not None:
        try:
            plt.close(fig)
        except Exception:
            pass


def flush_figures():
    """Send every open pyplot figure as an image/png display and close it."""
    plt = _modules.get("matplotlib.pyplot")
    if plt is None:
        return
    try:
        nums = list(plt.get_fignums())
    except Exception:
        return
    for num in nums:
        try:
            fig = plt.figure(num)
            data = {"image/png": _b64(_figure_png(fig)), "text/plain": _plain(fig)}
            send_display(data)
        except Exception as exc:
            send_display({"text/plain": "<figure %s could not be rendered: %s: %s>"
                          % (prims.exact_str(repr(num)) if type(num) is int else "?", prims.type_name(exc), prims.exc_text(exc))})
    try:
        plt.close("all")
    except Exception:
        pass


class _IPythonDisplayHook:
    """Meta-path finder that makes ``IPython.display.display`` ours.

    Without a running IPython shell, IPython's ``display()`` only prints the
    object's repr. When ``IPython.core.display_functions`` is first imported,
    its ``display`` is replaced by this worker's, so ``display(Markdown(..))``
    and libraries that call IPython's display produce real MIME bundles.
    """

    TARGET = "IPython.core.display_functions"

    def find_spec(self, name, path, target=None):
        if name != self.TARGET:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                original = spec.loader.exec_module

                def exec_module(module, _original=original):
                    _original(module)
                    module.display = display

                spec.loader.exec_module = exec_module
                return spec
        return None


def install_ipython_hook():
    if "IPython.core.display_functions" in sys.modules:
        sys.modules["IPython.core.display_functions"].display = display
        return
    sys.meta_path.insert(0, _IPythonDisplayHook())
