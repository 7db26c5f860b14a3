"""MIME bundles for results and displays, and matplotlib figures."""
import base64
import sys

from . import state

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


def _cap(text):
    if isinstance(text, str) and len(text) > TEXT_CAP:
        return text[:TEXT_CAP] + "\n[... %d characters cut by the worker]" % (len(text) - TEXT_CAP)
    return text


def _plain(obj):
    try:
        return _cap(repr(obj))
    except Exception as exc:  # a broken __repr__ must not break the cell
        return "<%s object (repr failed: %s: %s)>" % (type(obj).__name__, type(exc).__name__, exc)


def _encode_value(mime, value):
    if mime in _BINARY:
        if isinstance(value, (bytes, bytearray, memoryview)):
            return base64.b64encode(bytes(value)).decode("ascii")
        return value if isinstance(value, str) else None
    if mime == "application/json":
        return value
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return _cap(value) if isinstance(value, str) else None


def _figure_png(fig):
    import io
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    return buf.getvalue()


def is_figure(obj):
    mod = sys.modules.get("matplotlib.figure")
    return mod is not None and isinstance(obj, mod.Figure)


def bundle(obj):
    """(data, metadata) for an object, like IPython's display formatter."""
    data, metadata = {}, {}
    if is_figure(obj):
        data["image/png"] = base64.b64encode(_figure_png(obj)).decode("ascii")
        data["text/plain"] = _plain(obj)
        return data, metadata
    mimebundle = getattr(type(obj), "_repr_mimebundle_", None)
    if mimebundle is not None:
        try:
            got = obj._repr_mimebundle_(include=None, exclude=None)
            if isinstance(got, tuple):
                got, md = got
                metadata.update(md or {})
            for mime, value in (got or {}).items():
                enc = _encode_value(mime, value)
                if enc is not None:
                    data[mime] = enc
        except Exception:
            pass
    for method, mime in _REPR_METHODS:
        if mime in data:
            continue
        fn = getattr(type(obj), method, None)
        if fn is None or isinstance(obj, type):
            continue
        try:
            value = getattr(obj, method)()
        except Exception:
            continue
        if isinstance(value, tuple) and len(value) == 2:
            value, md = value
            if md:
                metadata[mime] = md
        if value is None:
            continue
        enc = _encode_value(mime, value)
        if enc is not None:
            data[mime] = enc
    data.setdefault("text/plain", _plain(obj))
    return data, metadata


def send_display(data, metadata=None):
    if channel is not None:
        channel.send({"type": "display", "id": state.current or "", "data": data, "metadata": metadata or {}})


def display(*objs, raw=False, metadata=None, **_ignored):
    """Show objects in the cell's output (like IPython's ``display``).

    ``raw=True`` takes each object as a ready MIME bundle (a dict).
    """
    for obj in objs:
        if raw and isinstance(obj, dict):
            send_display({k: _encode_value(k, v) for k, v in obj.items()}, metadata)
        else:
            data, md = bundle(obj)
            if metadata:
                md.update(metadata)
            send_display(data, md)
            if is_figure(obj):
                _close_figure(obj)


def _close_figure(fig):
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is not None:
        try:
            plt.close(fig)
        except Exception:
            pass


def flush_figures():
    """Send every open pyplot figure as an image/png display and close it."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return
    try:
        nums = list(plt.get_fignums())
    except Exception:
        return
    for num in nums:
        try:
            fig = plt.figure(num)
            data = {"image/png": base64.b64encode(_figure_png(fig)).decode("ascii"), "text/plain": _plain(fig)}
            send_display(data)
        except Exception as exc:
            send_display({"text/plain": "<figure %s could not be rendered: %s: %s>" % (num, type(exc).__name__, exc)})
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
